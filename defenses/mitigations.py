"""Empirical adaptation-stage mitigations of Kandpal et al. 2024 (section 4.4): data limits per user, gradient
clipping, early stopping. None has a formal guarantee; each is the fine-tuning recipe of
defenses/finetune.py with one change, so a comparison with ``finetune`` isolates that change.

Kandpal et al. find that batch and per-example clipping and early stopping do not stop user inference, while
limiting the documents each user contributes does (ArXiv: AUROC 66 % -> near chance going from 100 to
10 documents per user).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from bench.defense import Adapted, TrainContext
from bench.errors import ConfigError
from bench.params import Param
from bench.registry import register_defense
from bench.training import collate
from defenses.finetune import ADAPT_PARAMS, FineTune


def limit_per_user(users: tuple[str, ...], max_per_user: int, seed: int) -> list[int]:
    """Indices (ascending) of at most ``max_per_user`` records per user, chosen uniformly with ``seed``."""
    rng = np.random.default_rng([int(seed), 2002])
    by_user: dict[str, list[int]] = {}
    for i, u in enumerate(users):
        by_user.setdefault(u, []).append(i)
    keep: list[int] = []
    for u in sorted(by_user):
        idx = by_user[u]
        if len(idx) > max_per_user:
            idx = sorted(int(i) for i in rng.choice(idx, size=max_per_user, replace=False))
        keep.extend(idx)
    return sorted(keep)


@register_defense("user_limit")
class UserLimit(FineTune):
    description = ("Per-user data limit (Kandpal et al. 2024, section 4.4): keep at most max_per_user documents "
                   "of each user (seeded choice), then plain fine-tuning.")
    params = ADAPT_PARAMS + (
        Param("max_per_user", int, 10, "documents kept per user (Kandpal et al. 2024 go from 100 down to 10)", low=1),
    )
    code_modules = ("defenses.finetune",)

    def adapt(self, model, data, ctx: TrainContext):
        if data.users is None:
            raise ConfigError("user_limit needs the owner of each adaptation record (AdaptationData.users) and this "
                              "task gives none: use a user-stratified task (e.g. users, user_files) or another "
                              "defense")
        keep = limit_per_user(data.users, self.max_per_user, ctx.seed)
        model = self.finetune(model, [data.texts[i] for i in keep], ctx, desc="adapt: user_limit")
        self._report.update(records_in=len(data.texts), records_kept=len(keep),
                            users=len(set(data.users)), max_per_user=self.max_per_user)
        return Adapted(model, self.training_report())


@register_defense("clip")
class GradientClip(FineTune):
    description = ("Gradient clipping without noise (Kandpal et al. 2024, section 4.4): each record's gradient "
                   "(mode example, Abadi et al. 2016) or the batch gradient (mode batch, Pascanu et al. 2013) "
                   "clipped to max_grad_norm, then plain fine-tuning.")
    params = ADAPT_PARAMS + (
        Param("mode", str, "example", "clip each record's gradient before averaging, or the batch gradient",
              choices=("example", "batch")),
        Param("max_grad_norm", float, 0.1, "L2 clipping norm C (Kandpal et al. 2024 set C to the smallest norm "
              "seen in a standard run, so nearly every gradient is clipped)", low=0.0, low_inclusive=False),
    )
    code_modules = ("defenses.finetune",)

    def adapt(self, model, data, ctx: TrainContext):
        if self.mode == "example":
            hooks = {"per_example_clip": self.max_grad_norm, "max_grad_norm": None}
        else:
            hooks = {"max_grad_norm": self.max_grad_norm}
        model = self.finetune(model, data.texts, ctx, desc=f"adapt: clip ({self.mode})", **hooks)
        self._report.update(mode=self.mode, max_grad_norm=self.max_grad_norm)
        return Adapted(model, self.training_report())


@torch.no_grad()
def mean_token_loss(model: torch.nn.Module, seqs: list[list[int]], pad_id: int, device: torch.device,
                    batch_size: int = 32) -> float:
    """Token-mean next-token loss of ``model`` on ``seqs`` (the validation loss early stopping watches)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(seqs), batch_size):
        ids, mask, labels = collate(seqs[i:i + batch_size], pad_id)
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float()
        tgt = labels[:, 1:].to(device)
        lp = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tgt.flatten(), ignore_index=-100,
                                               reduction="sum")
        total += float(lp)
        count += int((tgt != -100).sum())
    model.train(was_training)
    return total / max(count, 1)


class _EarlyStopper:
    """``should_stop`` hook: validation loss every ``interval`` steps; stop after ``patience`` evaluations without
    improvement; keeps the best weights (Caruana et al. 2000, as Kandpal et al. 2024 use it)."""

    def __init__(self, val: list[list[int]], pad_id: int, device: torch.device, interval: int, patience: int,
                 min_delta: float) -> None:
        self.val, self.pad_id, self.device = val, pad_id, device
        self.interval, self.patience, self.min_delta = interval, patience, min_delta
        self.best, self.best_step, self.bad = math.inf, 0, 0
        self.best_state: dict | None = None
        self.history: list[tuple[int, float]] = []
        self.stopped_at: int | None = None

    def start(self, model: torch.nn.Module) -> None:
        self(0, model)

    def __call__(self, step: int, model: torch.nn.Module, *, final: bool = False) -> bool:
        """Validate at every ``interval``-th step, and at the last step when ``final`` (under its own number)."""
        if step % self.interval and not final:
            return False
        loss = mean_token_loss(model, self.val, self.pad_id, self.device)
        self.history.append((step, round(loss, 5)))
        if loss < self.best - self.min_delta:
            self.best, self.best_step, self.bad = loss, step, 0
            self.best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            return False
        self.bad += 1
        if self.bad >= self.patience:
            self.stopped_at = step
            return True
        return False


@register_defense("early_stop")
class EarlyStop(FineTune):
    description = ("Early stopping (Kandpal et al. 2024, section 4.4): fine-tuning that watches the loss on "
                   "validation records the data owner held back from training, and keeps the best weights.")
    params = ADAPT_PARAMS + (
        Param("eval_interval", int, 5, "optimizer steps between validation evaluations", low=1),
        Param("patience", int, 2, "evaluations without improvement before stopping", low=1),
        Param("min_delta", float, 0.0, "improvement in validation loss that counts", low=0.0),
    )
    code_modules = ("defenses.finetune",)
    #: validation comes from ``AdaptationData.validation`` (held back by the challenger from the adaptation
    #: pool), never from the training texts: dropping some of those would leave b = 1 targets untrained and
    #: their membership labels wrong
    uses_validation = True

    def adapt(self, model, data, ctx: TrainContext):
        if not data.validation:
            raise ConfigError("early_stop needs validation records held back from training, and this world has "
                              "none: set world.n_validation > 0 and make sure the task's adaptation pool has "
                              "records beyond adapt_background")
        val = [s for s in ctx.encode(list(data.validation), self.chunk_length) if len(s) >= 2]
        stopper = _EarlyStopper(val, ctx.pad_id, ctx.device, self.eval_interval, self.patience, self.min_delta)
        stopper.start(model)
        model = self.finetune(model, list(data.texts), ctx, desc="adapt: early_stop", should_stop=stopper)
        final_step = self._report["train"]["steps"]
        if final_step % self.eval_interval:  # score the last weights too, so the best is really the best
            stopper(final_step, model, final=True)
        if stopper.best_state is not None:
            model.load_state_dict(stopper.best_state)
        model.eval()
        self._report.update(records_train=len(data.texts), records_val=len(data.validation),
                            best_step=stopper.best_step, stopped_at=stopper.stopped_at, best_val_loss=stopper.best,
                            val_history=stopper.history)
        return Adapted(model, self.training_report())
