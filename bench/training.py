"""The causal-LM training loop shared by pretraining, attackers' reference models and defenses."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from bench.errors import ConfigError


@dataclass
class TrainStats:
    steps: int
    tokens: int
    seconds: float
    final_loss: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("nan")

    def to_dict(self) -> dict:
        return {"steps": self.steps, "tokens": self.tokens, "seconds": round(self.seconds, 3),
                "final_loss": self.final_loss, "tokens_per_s": round(self.tokens_per_s, 1)}


def collate(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad token lists; labels are -100 on padding so it never counts in the loss."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[r, : len(s)] = 1
    labels = ids.masked_fill(mask == 0, -100)
    return ids, mask, labels


def train_causal_lm(model: torch.nn.Module, sequences: Sequence[Sequence[int]], *, epochs: float, lr: float,
                    batch_size: int, seed: int, pad_id: int, weight_decay: float = 0.0, warmup_frac: float = 0.05,
                    max_grad_norm: float | None = 1.0, autocast_bf16: bool = False, device: torch.device | None = None,
                    desc: str = "training", progress: bool = True) -> TrainStats:
    """AdamW with linear warmup and cosine decay over ``epochs`` passes of shuffled ``sequences``.

    ``epochs`` may be fractional (a prefix of the last shuffled pass is used).
    """
    seqs = [list(s) for s in sequences if len(s) >= 2]
    if not seqs:
        raise ConfigError(f"{desc}: no training sequence has 2 or more tokens: check the training data")
    if epochs <= 0 or lr <= 0 or batch_size <= 0:
        raise ConfigError(f"{desc}: epochs, lr and batch_size must be > 0")
    device = device or next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    order: list[int] = []
    for _ in range(math.ceil(epochs)):
        order.extend(torch.randperm(len(seqs), generator=gen).tolist())
    order = order[: max(1, int(round(epochs * len(seqs))))]
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    warm = max(1, int(warmup_frac * len(batches)))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / max(1, len(batches))))))
    model.train()
    torch.manual_seed(seed)
    tokens, loss_val, t0 = 0, float("nan"), time.perf_counter()
    it = batches
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(batches, desc=desc, unit="step", leave=False, mininterval=1.0)
    for batch in it:
        ids, mask, labels = collate([seqs[i] for i in batch], pad_id)
        ids, mask, labels = ids.to(device), mask.to(device), labels.to(device)
        ctx = (torch.autocast(device.type, dtype=torch.bfloat16) if autocast_bf16
               else torch.autocast(device.type, enabled=False))
        with ctx:
            out = model(input_ids=ids, attention_mask=mask, labels=labels)
        loss = out.loss
        if not torch.isfinite(loss):
            raise ConfigError(f"{desc}: training loss became {loss.item()}: lower the learning rate")
        loss.backward()
        if max_grad_norm:
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        tokens += int(mask.sum())
        loss_val = float(loss.detach())
    model.eval()
    return TrainStats(steps=len(batches), tokens=tokens, seconds=time.perf_counter() - t0, final_loss=loss_val)
