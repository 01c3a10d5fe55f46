"""The causal-LM training loop shared by pretraining, attackers' reference models and defenses."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from bench.errors import ConfigError

#: ``loss_mask(input_ids) -> bool tensor`` of the same shape: False drops that token from the loss
LossMask = Callable[[torch.Tensor], torch.Tensor]
#: ``should_stop(steps_done, model) -> bool``: True ends training after this step
StopHook = Callable[[int, torch.nn.Module], bool]


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


def batch_plan(n: int, epochs: float, batch_size: int, seed: int) -> list[list[int]]:
    """Indices of ``n`` records in batches over ``epochs`` seeded shuffled passes (a fractional last pass is a
    prefix of its shuffle)."""
    gen = torch.Generator().manual_seed(seed)
    order: list[int] = []
    for _ in range(math.ceil(epochs)):
        order.extend(torch.randperm(n, generator=gen).tolist())
    order = order[: max(1, int(round(epochs * n)))]
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def warmup_cosine_adamw(params, n_steps: int, *, lr: float, weight_decay: float, warmup_frac: float = 0.05):
    """AdamW with linear warmup over ``warmup_frac`` of the steps, then cosine decay to 0: (optimizer, scheduler)."""
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    warm = max(1, int(warmup_frac * n_steps))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / max(1, n_steps)))))
    return opt, sched


def train_causal_lm(model: torch.nn.Module, sequences: Sequence[Sequence[int]], *, epochs: float, lr: float,
                    batch_size: int, seed: int, pad_id: int, weight_decay: float = 0.0, warmup_frac: float = 0.05,
                    max_grad_norm: float | None = 1.0, autocast_bf16: bool = False, device: torch.device | None = None,
                    desc: str = "training", progress: bool = True, loss_mask: LossMask | None = None,
                    per_example_clip: float | None = None, should_stop: StopHook | None = None) -> TrainStats:
    """AdamW with linear warmup and cosine decay over ``epochs`` passes of shuffled ``sequences``.

    ``epochs`` may be fractional (a prefix of the last shuffled pass is used). ``max_grad_norm`` clips the global
    norm of each batch gradient (batch clipping). Hooks, all off by default (then the loop is exactly the plain
    one): ``loss_mask(ids) -> bool mask`` drops the tokens where it is False from the loss (goldfish loss);
    ``per_example_clip`` clips each record's own gradient to that L2 norm before averaging (per-example clipping
    without noise, Kandpal et al. 2024, section 4.4); ``should_stop(step, model) -> bool`` runs after each step and
    ends training early when it returns True (early stopping).
    """
    seqs = [list(s) for s in sequences if len(s) >= 2]
    if not seqs:
        raise ConfigError(f"{desc}: no training sequence has 2 or more tokens: check the training data")
    if epochs <= 0 or lr <= 0 or batch_size <= 0:
        raise ConfigError(f"{desc}: epochs, lr and batch_size must be > 0")
    device = device or next(model.parameters()).device
    batches = batch_plan(len(seqs), epochs, batch_size, seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt, sched = warmup_cosine_adamw(params, len(batches), lr=lr, weight_decay=weight_decay, warmup_frac=warmup_frac)
    model.train()
    torch.manual_seed(seed)
    tokens, loss_val, t0, steps_done = 0, float("nan"), time.perf_counter(), 0
    it = batches
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(batches, desc=desc, unit="step", leave=False, mininterval=1.0)
    for batch in it:
        ids, mask, labels = collate([seqs[i] for i in batch], pad_id)
        ids, mask, labels = ids.to(device), mask.to(device), labels.to(device)
        ctx = (torch.autocast(device.type, dtype=torch.bfloat16) if autocast_bf16
               else torch.autocast(device.type, enabled=False))
        if loss_mask is not None:
            labels = masked_labels(labels, loss_mask(ids))
        if per_example_clip is not None:
            loss = _clipped_example_grads(model, params, ids, mask, labels, per_example_clip, ctx)
        else:
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
        steps_done += 1
        if should_stop is not None and should_stop(steps_done, model):
            model.train()  # the hook may have evaluated the model
            break
    model.eval()
    return TrainStats(steps=steps_done, tokens=tokens, seconds=time.perf_counter() - t0, final_loss=loss_val)


def masked_labels(labels: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Labels with -100 where ``keep`` is False, so the loss ignores those tokens (padding stays -100)."""
    return labels.masked_fill(~keep.to(device=labels.device, dtype=torch.bool), -100)


def _clipped_example_grads(model, params, ids, mask, labels, clip: float, ctx) -> torch.Tensor:
    """Set ``p.grad`` to the mean over records of each record's gradient clipped to L2 norm ``clip``.

    Each record's loss is its own token mean; its gradient (over all trainable parameters together) is scaled
    by min(1, clip / ||g_i||) as in DP-SGD (Abadi et al. 2016), without noise. One backward per record: exact,
    and cheap for the small models this runs on. Returns the mean record loss.
    """
    total = [torch.zeros_like(p) for p in params]
    losses = []
    for r in range(ids.shape[0]):
        with ctx:
            out = model(input_ids=ids[r:r + 1], attention_mask=mask[r:r + 1], labels=labels[r:r + 1])
        if not torch.isfinite(out.loss):  # every target of this record masked out: it contributes nothing
            continue
        grads = torch.autograd.grad(out.loss, params, allow_unused=True)
        grads = [g if g is not None else torch.zeros_like(p) for g, p in zip(grads, params)]
        norm = torch.sqrt(sum(g.float().square().sum() for g in grads))
        scale = min(1.0, clip / (float(norm) + 1e-6))
        for t, g in zip(total, grads):
            t.add_(g, alpha=scale)
        losses.append(out.loss.detach())
    if not losses:
        raise ConfigError("per-example clipping: no record in the batch has a token left in the loss: "
                          "check the training data or the loss mask")
    for p, t in zip(params, total):
        p.grad = t / ids.shape[0]
    return torch.stack(losses).mean()
