"""Defense contract: act at adaptation (and, later, pretraining or release); report a guarantee if any."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from bench.errors import PluginError
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


@dataclass
class Adapted:
    """What :meth:`Defense.adapt` returns: the released model, how it was trained, and its formal guarantee.

    ``model`` is a torch module (saved as a Hugging Face checkpoint) or a :class:`bench.release.Release` (an
    aggregate or an adapter); ``report`` is free-form (training steps, seconds, what was kept); ``guarantee`` is
    the formal guarantee of this release (``{"name": "epsilon", "value": ..., ...}``) or None for an empirical
    defense. One object per call: nothing about a call is left on the defense instance for the runner to read.
    """

    model: Any
    report: dict[str, Any] = field(default_factory=dict)
    guarantee: dict[str, Any] | None = None


@dataclass
class Filtered:
    """What :meth:`Defense.pretrain_texts` returns: the documents to pretrain on and a report of the filter."""

    docs: list[str]
    report: dict[str, Any] = field(default_factory=dict)


def _check_released(name: str, model: Any) -> None:
    """A defense releases a torch model or a :class:`bench.release.Release`; anything else (None from a missing
    ``return``) is refused here, naming the defense, instead of failing later where the release is saved."""
    from bench.release import Release
    if not isinstance(model, (torch.nn.Module, Release)):
        raise PluginError(f"defense '{name}': adapt released {type(model).__name__}, not a model: return "
                          f"bench.defense.Adapted(model, report, guarantee) with the adapted torch model (or a "
                          f"bench.release.Release)")


class Defense(Plugin):
    """A defense. ``adapt`` trains θ' from θ on the adaptation data it is given and nothing else.

    A defense whose ``stages`` include ``"pretrain"`` also changes how θ is pretrained, through
    :meth:`pretrain_texts` and :meth:`pretrain_loss_mask`; its worlds get their own θ.
    """

    kind: ClassVar[str] = "defense"
    stages: ClassVar[frozenset[str]] = frozenset({"adapt"})
    #: modules besides the defense's own whose source is part of its artifacts' cache keys (shared training code)
    code_modules: ClassVar[tuple[str, ...]] = ()
    #: True: the defense receives ``AdaptationData.validation``, records the data owner held back (early stopping)
    uses_validation: ClassVar[bool] = False

    def adapt(self, model: torch.nn.Module, data, ctx: TrainContext) -> Adapted:  # pragma: no cover
        """Train θ' from θ (``model``) on ``data`` (an :class:`bench.game.AdaptationData`) and return :class:`Adapted`."""
        raise NotImplementedError

    def adapted(self, result: Any) -> Adapted:
        """``adapt``'s result as :class:`Adapted`. A bare model is the pre-1.0 contract: it still works for one
        release, with its report and guarantee read from :meth:`training_report` and :meth:`guarantee`."""
        if isinstance(result, Adapted):
            _check_released(self.name, result.model)
            return result
        _check_released(self.name, result)
        warnings.warn(f"defense '{self.name}': adapt returned {type(result).__name__}; return "
                      f"bench.defense.Adapted(model, report, guarantee) instead (the bare-model form will be removed)",
                      DeprecationWarning, stacklevel=2)
        return Adapted(result, self.training_report(), self.guarantee())

    # -- pretraining-stage hooks: used only when ``"pretrain" in stages`` (bench/artifacts.ensure_pretrained) --
    def pretrain_texts(self, docs: list[str]) -> Filtered | list[str]:
        """Filter the pretraining documents (e.g. dedup) and return the ones to train on, as :class:`Filtered`.

        ``docs`` is the whole pretraining corpus with the challenger's inserted copies among them, in
        content-hash order, so nothing marks which documents are membership targets; the runner counts the
        inserts that survive (``inserts_kept`` in θ's report). Rewriting a document is allowed: a rewritten
        insert counts as dropped."""
        return docs

    def pretrain_loss_mask(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Bool mask, shape of ``input_ids``: False drops that token from the pretraining loss (e.g. goldfish)."""
        return torch.ones_like(input_ids, dtype=torch.bool)

    # -- deprecated: the pre-1.0 contract read these after a bare-model ``adapt`` (see :meth:`adapted`) ------------
    def guarantee(self) -> dict[str, Any] | None:
        """Deprecated: return the guarantee in :class:`Adapted`."""
        return None

    def training_report(self) -> dict[str, Any]:
        """Deprecated: return the report in :class:`Adapted`."""
        return dict(self.__dict__.get("_report") or {})

    @classmethod
    def info(cls) -> dict:
        d = super().info()
        d.update(stages=sorted(cls.stages))
        return d
