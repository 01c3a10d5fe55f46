"""Fine-tuning with label smoothing: a simple regularising defense against membership inference."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bench.defense import Adapted, Defense, TrainContext
from bench.params import Param
from bench.registry import register_defense
from bench.training import collate


@register_defense("label_smoothing")
class LabelSmoothingFineTune(Defense):
    """Full fine-tuning whose next-token targets are smoothed towards the uniform distribution.

    Each target distribution is q'(k) = (1 - eps) * 1[k = y] + eps / K (Szegedy et al., 2016, "Rethinking the
    Inception Architecture", section 7). The model is never pushed to put all its mass on a training token, so
    members keep less of the loss gap that loss-based membership inference exploits; the price is a higher
    held-out loss. No formal guarantee: an empirical defense.
    """

    version = "0.1.0"
    description = "Full fine-tuning with label-smoothed cross-entropy (eps = smoothing mass on the uniform)."
    params = (
        Param("epsilon", float, 0.2, "label smoothing mass eps in q'(k) = (1-eps) 1[k=y] + eps/K",
              low=0.0, high=1.0, high_inclusive=False),
        Param("epochs", float, 2.0, "passes over the adaptation data", low=0.0, low_inclusive=False),
        Param("lr", float, 1e-3, "AdamW learning rate", low=0.0, low_inclusive=False),
        Param("batch_size", int, 16, "records per step", low=1),
        Param("chunk_length", int, 128, "tokens per training record (longer records are truncated)", low=8),
    )

    def adapt(self, model: torch.nn.Module, data, ctx: TrainContext) -> Adapted:
        seqs = ctx.encode(data.texts, self.chunk_length)
        gen = torch.Generator().manual_seed(ctx.seed)
        opt = torch.optim.AdamW(model.parameters(), lr=self.lr)
        n_steps = max(1, round(self.epochs * len(seqs) / self.batch_size))
        model.train()
        loss = torch.tensor(float("nan"))
        for step in range(n_steps):
            order = torch.randperm(len(seqs), generator=gen)[: self.batch_size].tolist()
            ids, mask, labels = collate([seqs[i] for i in order], ctx.pad_id)
            ids, mask, labels = ids.to(ctx.device), mask.to(ctx.device), labels.to(ctx.device)
            logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), labels[:, 1:].reshape(-1),
                                   ignore_index=-100, label_smoothing=self.epsilon)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        model.eval()
        return Adapted(model, report={"train": {"steps": n_steps, "final_loss": float(loss.detach())}})
