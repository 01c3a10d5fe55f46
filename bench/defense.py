"""Defense contract: act at adaptation (and, later, pretraining or release); report a guarantee if any."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from bench.plugin import Plugin


@dataclass
class TrainContext:
    """What a defense needs to train: tokenizer, device, sequence length, seed. No data beyond its own."""

    tokenizer: Any
    device: torch.device
    max_length: int
    seed: int
    autocast_bf16: bool = False
    progress: bool = True

    def encode(self, texts: tuple[str, ...] | list[str], max_length: int | None = None) -> list[list[int]]:
        """Token sequences as the released model will score them (BOS first, truncated)."""
        n = max_length or self.max_length
        if not texts:
            return []
        bos = [self.tokenizer.bos_token_id] if self.tokenizer.bos_token_id is not None else []
        enc = self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]
        return [(bos + ids)[:n] for ids in enc]

    @property
    def pad_id(self) -> int:
        t = self.tokenizer
        return t.pad_token_id if t.pad_token_id is not None else (t.eos_token_id or 0)


class Defense(Plugin):
    """A defense. ``adapt`` trains θ' from θ on the adaptation data it is given and nothing else.

    A defense whose ``stages`` include ``"pretrain"`` also changes how θ is pretrained, through
    :meth:`pretrain_texts` and :meth:`pretrain_loss_mask`; its worlds get their own θ.
    """

    kind: ClassVar[str] = "defense"
    stages: ClassVar[frozenset[str]] = frozenset({"adapt"})

    def adapt(self, model: torch.nn.Module, data, ctx: TrainContext) -> torch.nn.Module:  # pragma: no cover
        raise NotImplementedError

    # -- pretraining-stage hooks: used only when ``"pretrain" in stages`` (bench/artifacts.ensure_pretrained) --
    def pretrain_texts(self, docs: list[str]) -> list[str]:
        """Filter the pretraining documents (e.g. dedup) and return the ones to train on.

        ``docs`` is the whole pretraining corpus with the challenger's inserted copies among them, in
        content-hash order, so nothing marks which documents are membership targets; the runner counts the
        inserts that survive (``inserts_kept`` in θ's report). Rewriting a document is allowed: a rewritten
        insert counts as dropped."""
        return docs

    def pretrain_loss_mask(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Bool mask, shape of ``input_ids``: False drops that token from the pretraining loss (e.g. goldfish)."""
        return torch.ones_like(input_ids, dtype=torch.bool)

    def guarantee(self) -> dict[str, Any] | None:
        """The formal guarantee of the last adaptation (e.g. DP ε, δ), or None for empirical defenses."""
        return None

    def training_report(self) -> dict[str, Any]:
        return dict(getattr(self, "_report", {}) or {})

    @classmethod
    def info(cls) -> dict:
        d = super().info()
        d.update(stages=sorted(cls.stages))
        return d
