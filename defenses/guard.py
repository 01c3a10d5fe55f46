"""GUARD (gold-unchanged anchored distillation) and the pure-KD baseline.

After GUARD (anonymous preprint, 2025): GUARD is its Algorithm 1, the pure-KD baseline its appendix A.3.

GUARD: (1) fine-tune a teacher from θ on the adaptation data (``finetune``'s training, unchanged);
(2) at every position of every adaptation record take the base and teacher next-token distributions
p_0 = softmax(z_0/τ), p_ft = softmax(z_ft/τ); (3) build the anchored target q (Algorithm 1 lines 9–12):

    S = TopK(p_0, K) ∪ TopK(p_ft, K) ∪ {y}
    R = S∖{y} sorted by p_ft (descending),  B = p_0 on S∖{y} sorted (descending)
    q[y] = p_0[y],  q[R_k] = B_k,  then the remaining mass 1 − Σ_{w∈S} q[w] = 1 − p_0(S) spread
    uniformly over S∖{y} (so the non-gold order of the teacher is kept and q sums to 1)

(4) distill a student started again from θ with (Algorithm 1 line 18, eq. 1)

    L = τ² KL(q ‖ s) + λ (s[y] − p_0[y])²,   s = softmax(z_student/τ),  λ = 0.5, τ = 1 (appendix A.6)

averaged over the non-padding positions of a batch of records. The released model is the student.

``kd`` is the paper's pure logit-KD ablation: the same teacher and student, with target p_ft (no anchoring, no top-K,
no gold penalty): L = τ² KL(p_ft ‖ s).

Deviations: the targets are computed on the fly from the frozen θ and teacher at each distillation step
instead of being recorded once (the same values; no top-K store on disk); the loss is a per-token mean over
a batch (the paper sums per example with batch size 1); student and teacher have θ's architecture (its KD
ablation distils a larger teacher into a smaller student); K defaults to 1000 as in the paper although the tiny
models' vocabulary is 8 192 (K ≥ vocabulary keeps every token).
"""

from __future__ import annotations

import copy
import time

import torch
import torch.nn.functional as F

from bench.defense import Adapted, Defense, TrainContext
from bench.errors import ConfigError
from bench.params import Param
from bench.registry import register_defense
from bench.training import batch_plan, collate, warmup_cosine_adamw
from defenses.finetune import ADAPT_PARAMS, FineTune

TEACHER_PARAMS = tuple(Param(f"teacher_{p.name}", p.type, p.default, f"teacher fine-tuning: {p.help}", low=p.low,
                             low_inclusive=p.low_inclusive) for p in ADAPT_PARAMS if p.name != "chunk_length")
DISTILL_PARAMS = (
    Param("epochs", float, 3.0, "distillation passes over the adaptation data (GUARD paper: 3)", low=0.0,
          low_inclusive=False),
    Param("lr", float, 2e-3, "student AdamW learning rate", low=0.0, low_inclusive=False),
    Param("batch_size", int, 16, "records per distillation step", low=1),
    Param("chunk_length", int, 128, "tokens per record, teacher and student (longer records are truncated)", low=8),
    Param("temperature", float, 1.0, "softmax temperature τ of teacher, base and student (GUARD paper: 1)", low=0.0,
          low_inclusive=False),
)


# ------------------------------------------------------------------------------------------ targets and losses
def anchored_target(p0: torch.Tensor, pft: torch.Tensor, gold: torch.Tensor, k: int) -> torch.Tensor:
    """GUARD paper, Algorithm 1 lines 9–12, for rows of distributions (…, V) with gold ids (…): the anchored
    target q."""
    v = p0.shape[-1]
    kk = min(int(k), v)
    flat0, flatf, y = p0.reshape(-1, v), pft.reshape(-1, v), gold.reshape(-1, 1)
    in_s = torch.zeros_like(flat0, dtype=torch.bool)
    in_s.scatter_(1, flat0.topk(kk, dim=1).indices, True)
    in_s.scatter_(1, flatf.topk(kk, dim=1).indices, True)
    non_gold = in_s.clone()
    non_gold.scatter_(1, y, False)                      # S ∖ {y}
    m = non_gold.sum(1, keepdim=True)                   # |S| − 1 ≥ 1 when K ≥ 2 or the tops differ
    width = min(2 * kk, v)
    neg = torch.tensor(-1.0, dtype=flat0.dtype, device=flat0.device)
    r_idx = torch.where(non_gold, flatf, neg).topk(width, dim=1).indices     # R: teacher order on S∖{y}
    b_val = torch.where(non_gold, flat0, neg).topk(width, dim=1).values      # B: base values, descending
    valid = torch.arange(width, device=flat0.device)[None, :] < m
    q = torch.zeros_like(flat0)
    q.scatter_(1, r_idx, torch.where(valid, b_val, torch.zeros_like(b_val)))
    g0 = flat0.gather(1, y)
    q.scatter_(1, y, g0)
    rest = (1.0 - q.sum(1, keepdim=True)).clamp_min(0.0)
    q = q + torch.where(non_gold, rest / m.clamp_min(1), torch.zeros_like(q))
    return q.reshape(p0.shape)


def guard_loss(student_logits: torch.Tensor, q: torch.Tensor, gold: torch.Tensor, p0_gold: torch.Tensor,
               weight: torch.Tensor, *, tau: float, lam: float) -> torch.Tensor:
    """GUARD paper, eq. (1) / Algorithm 1 line 18, mean over positions with ``weight`` 1:
    τ²KL(q‖s) + λ(s[y] − p_0[y])²."""
    log_s = F.log_softmax(student_logits.float() / tau, dim=-1)
    kl = (torch.xlogy(q, q) - q * log_s).sum(-1)
    s_gold = log_s.gather(-1, gold[..., None]).squeeze(-1).exp()
    per = tau ** 2 * kl + lam * (s_gold - p0_gold) ** 2
    return (per * weight).sum() / weight.sum().clamp_min(1.0)


def kd_loss(student_logits: torch.Tensor, p_teacher: torch.Tensor, weight: torch.Tensor, *, tau: float) -> torch.Tensor:
    """Pure logit KD (GUARD paper, appendix A.3): τ² KL(p_ft ‖ s), mean over positions with ``weight`` 1."""
    log_s = F.log_softmax(student_logits.float() / tau, dim=-1)
    kl = (torch.xlogy(p_teacher, p_teacher) - p_teacher * log_s).sum(-1)
    return tau ** 2 * (kl * weight).sum() / weight.sum().clamp_min(1.0)


# ------------------------------------------------------------------------------------------ training
def distill(student: torch.nn.Module, teacher: torch.nn.Module, base: torch.nn.Module | None,
            seqs: list[list[int]], *, mode: str, k: int, lam: float, tau: float, epochs: float, lr: float,
            batch_size: int, seed: int, pad_id: int, device: torch.device, desc: str = "distill",
            progress: bool = False) -> dict:
    """Algorithm 1 Step 4 (``mode="guard"``) or pure KD (``mode="kd"``); the targets come from frozen models."""
    seqs = [list(s) for s in seqs if len(s) >= 2]
    if not seqs:
        raise ConfigError(f"{desc}: no training record has 2 or more tokens: check the adaptation data")
    batches = batch_plan(len(seqs), epochs, batch_size, seed)
    params = [p for p in student.parameters() if p.requires_grad]
    opt, sched = warmup_cosine_adamw(params, len(batches), lr=lr, weight_decay=0.01)  # AdamW's default decay
    for m in (teacher, base):
        if m is not None:
            m.eval()
            for p in m.parameters():
                p.requires_grad_(False)
    student.train()
    torch.manual_seed(seed)
    tokens, loss_val, t0 = 0, float("nan"), time.perf_counter()
    it = batches
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(batches, desc=desc, unit="step", leave=False, mininterval=1.0)
    for batch in it:
        ids, mask, _ = collate([seqs[i] for i in batch], pad_id)
        ids, mask = ids.to(device), mask.to(device)
        inp, gold = ids[:, :-1], ids[:, 1:]
        weight = (mask[:, 1:] * mask[:, :-1]).float()
        with torch.no_grad():
            pft = F.softmax(teacher(input_ids=inp, attention_mask=mask[:, :-1]).logits.float() / tau, dim=-1)
            if mode == "guard":
                p0 = F.softmax(base(input_ids=inp, attention_mask=mask[:, :-1]).logits.float() / tau, dim=-1)
                target = anchored_target(p0, pft, gold, k)
                p0_gold = p0.gather(-1, gold[..., None]).squeeze(-1)
                del p0, pft
            else:
                target = pft
        logits = student(input_ids=inp, attention_mask=mask[:, :-1]).logits
        if mode == "guard":
            loss = guard_loss(logits, target, gold, p0_gold, weight, tau=tau, lam=lam)
        else:
            loss = kd_loss(logits, target, weight, tau=tau)
        if not torch.isfinite(loss):
            raise ConfigError(f"{desc}: distillation loss became {loss.item()}: lower the learning rate")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        tokens += int(weight.sum())
        loss_val = float(loss.detach())
    student.eval()
    return {"steps": len(batches), "tokens": tokens, "seconds": round(time.perf_counter() - t0, 3),
            "final_loss": loss_val}


class _Distilled(Defense):
    """Teacher = ``finetune`` from θ; student = θ distilled towards a target built from the teacher."""

    mode = "kd"
    code_modules = ("defenses.finetune", "bench.training")

    def _teacher(self, model: torch.nn.Module, data, ctx: TrainContext) -> tuple[torch.nn.Module, dict]:
        ft = FineTune(**{p.name: getattr(self, f"teacher_{p.name}") for p in ADAPT_PARAMS if p.name != "chunk_length"},
                      chunk_length=self.chunk_length)
        result = ft.adapt(model, data, ctx)
        return result.model, result.report

    def adapt(self, model, data, ctx: TrainContext):
        base = copy.deepcopy(model) if self.mode == "guard" else None
        student = copy.deepcopy(model)
        teacher, teacher_report = self._teacher(model, data, ctx)  # trains ``model`` in place: it is the teacher
        for p in student.parameters():
            p.requires_grad_(True)
        stats = distill(student, teacher, base, ctx.encode(data.texts, self.chunk_length), mode=self.mode,
                        k=getattr(self, "top_k", 0), lam=getattr(self, "gold_weight", 0.0), tau=self.temperature,
                        epochs=self.epochs, lr=self.lr, batch_size=self.batch_size, seed=ctx.seed + 1,
                        pad_id=ctx.pad_id, device=ctx.device, desc=f"adapt: {self.name} distill",
                        progress=ctx.progress)
        del teacher, base
        t = teacher_report.get("train", {})
        total = {"steps": t.get("steps", 0) + stats["steps"], "tokens": t.get("tokens", 0) + stats["tokens"],
                 "seconds": round(t.get("seconds", 0.0) + stats["seconds"], 3), "final_loss": stats["final_loss"]}
        return Adapted(student, {"train": total, "teacher": teacher_report, "distill": stats,  # teacher + student
                                 "trainable_params": sum(p.numel() for p in student.parameters())})


@register_defense("guard")
class Guard(_Distilled):
    description = ("GUARD (anonymous preprint, 2025): fine-tune a teacher, then distil θ towards the anchored "
                   "target (gold token at its pretrained probability, non-gold tokens in the teacher's order with "
                   "pretrained magnitudes, top-K) with a gold-token penalty λ.")
    version = "0.1.0"
    mode = "guard"
    params = DISTILL_PARAMS + (
        Param("top_k", int, 1000, "K of TopK(p_0, K) ∪ TopK(p_ft, K) (GUARD paper: 1000)", low=2),
        Param("gold_weight", float, 0.5, "λ of the gold-token penalty (GUARD paper: 0.5)", low=0.0),
    ) + TEACHER_PARAMS

@register_defense("kd")
class KnowledgeDistillation(_Distilled):
    description = ("Pure logit knowledge distillation (GUARD, anonymous preprint 2025, appendix A.3): fine-tune a "
                   "teacher, then distil θ towards the teacher's full next-token distribution (no anchoring).")
    version = "0.1.0"
    mode = "kd"
    params = DISTILL_PARAMS + TEACHER_PARAMS
