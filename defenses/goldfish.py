"""Goldfish loss (Hans et al. 2024, "Be like a Goldfish, Don't Memorize!"), named by Segal et al. 2025 as an
empirical mitigation: a pseudorandom 1/k of the tokens never count in the pretraining loss, so the model never
learns to reproduce a long sequence verbatim. The drop decision for token i hashes the h tokens before it (the
paper's hashed mask, section 3.1), so every copy of a repeated passage drops the same tokens and no copy fills the
gap.

Deviations: the first h tokens of each sequence (fewer than h tokens of context to hash) are always kept;
the hash is FNV-1a over the token ids followed by the splitmix64 finaliser (the paper
uses a different 64-bit hash; any well-mixed hash gives the same 1/k statistics).
"""

from __future__ import annotations

import numpy as np
import torch

from bench.defense import Adapted
from bench.params import Param
from bench.registry import register_defense
from defenses.finetune import ADAPT_PARAMS, FineTune

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


def context_hash(windows: np.ndarray) -> np.ndarray:
    """64-bit hash of each row of ``windows`` (..., h) of token ids."""
    acc = np.full(windows.shape[:-1], _FNV_OFFSET, dtype=np.uint64)
    w = windows.astype(np.uint64)
    for j in range(windows.shape[-1]):
        acc = (acc ^ w[..., j]) * _FNV_PRIME
    acc = (acc ^ (acc >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    acc = (acc ^ (acc >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return acc ^ (acc >> np.uint64(31))


def goldfish_mask(input_ids: torch.Tensor, k: int = 4, h: int = 13) -> torch.Tensor:
    """Bool mask of ``input_ids`` (batch, length): False where the token is dropped from the loss.

    Token i (i >= h) is dropped when the hash of tokens i-h .. i-1 falls in the lowest 1/k of the hash space.
    """
    ids = input_ids.detach().cpu().numpy()
    keep = np.ones(ids.shape, dtype=bool)
    if ids.shape[1] > h:
        windows = np.lib.stride_tricks.sliding_window_view(ids, h, axis=1)[:, :-1]  # window s -> token s + h
        with np.errstate(over="ignore"):
            hashes = context_hash(windows)
        keep[:, h:] = hashes >= np.uint64((2 ** 64) // k)
    return torch.from_numpy(keep).to(input_ids.device)


@register_defense("goldfish")
class Goldfish(FineTune):
    description = ("Goldfish loss at pretraining (Hans et al. 2024): drop from the loss every token whose h "
                   "preceding tokens hash into 1/k of the hash space; then plain fine-tuning (or goldfish "
                   "fine-tuning with adapt_goldfish).")
    stages = frozenset({"pretrain", "adapt"})
    params = ADAPT_PARAMS + (
        Param("k", int, 4, "one token in k is dropped from the loss (paper default 4)", low=2),
        Param("h", int, 13, "tokens of context hashed for the drop decision (paper default 13)", low=1),
        Param("adapt_goldfish", bool, False, "also use the goldfish loss when fine-tuning"),
    )
    code_modules = ("defenses.finetune",)

    def pretrain_loss_mask(self, input_ids: torch.Tensor) -> torch.Tensor:
        return goldfish_mask(input_ids, self.k, self.h)

    def adapt(self, model, data, ctx):
        hooks = {"loss_mask": self.pretrain_loss_mask} if self.adapt_goldfish else {}
        return Adapted(self.finetune(model, data.texts, ctx, desc="adapt: goldfish" if hooks else "adapt: finetune",
                                     **hooks), self.training_report())
