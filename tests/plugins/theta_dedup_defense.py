"""A defense that uses θ's memory of S (test fixture): it scores every record of D̃ with θ and fine-tunes on all but
the share θ knows best, as deduplication against pretraining would. In a world whose background shares no record
with S, the records θ knows best are the (1,1) targets (the a = 1 half of the inserted targets), so it removes
targets at a higher rate than background and leaves the `joint/seen` game, and part of `adapt`, with fewer trained
targets than a random drop of the same size would. With world ``background_in_pretraining: matched`` as many of the
background records are in S as of the inserted targets, and "θ knows it" no longer marks a target
(tests/test_fair_game.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from bench.params import Param
from bench.registry import register_defense
from bench.training import collate
from defenses.dp import record_losses
from defenses.finetune import FineTune


def drop_what_theta_knows(texts, losses, share: float) -> list[str]:
    """``texts`` without the ``share`` of them with the lowest loss under θ (ties broken by position)."""
    k = int(round(share * len(texts)))
    order = np.argsort(np.asarray(losses, dtype=float), kind="stable")
    dropped = set(order[:k].tolist())
    return [t for i, t in enumerate(texts) if i not in dropped]


@torch.no_grad()
def mean_token_loss(model, ctx, texts, batch_size: int = 16) -> list[float]:
    """Mean next-token loss of each text under ``model`` (θ as the defense receives it)."""
    model.eval()
    out: list[float] = []
    seqs = ctx.encode(list(texts))
    for i in range(0, len(seqs), batch_size):
        ids, mask, _ = collate(seqs[i:i + batch_size], ctx.pad_id)
        ids, mask = ids.to(ctx.device), mask.to(ctx.device)
        out.extend(record_losses(model(input_ids=ids, attention_mask=mask).logits, ids, mask).tolist())
    return out


@register_defense("theta_dedup")
class ThetaDedup(FineTune):
    """Fine-tunes on D̃ minus the records θ knows best."""

    version = "0.1.0"
    description = "Drops the share of D̃ with the lowest loss under θ, then fine-tunes (test fixture)."
    params = FineTune.params + (
        Param("drop_share", float, 0.25, "share of D̃ dropped, lowest θ loss first", low=0.0, high=1.0),
        Param("order", str, "theta", "theta = drop what θ knows best; random = drop a uniform share (the control)",
              choices=("theta", "random")),
    )

    def adapt(self, model, data, ctx):
        if self.order == "random":
            losses = np.random.default_rng(ctx.seed).random(len(data.texts)).tolist()
        else:
            losses = mean_token_loss(model, ctx, data.texts)
        kept = drop_what_theta_knows(data.texts, losses, self.drop_share)
        model.train()
        return super().adapt(model, dataclasses.replace(data, texts=tuple(kept)), ctx)
