"""Hush: secret protection by LP-weighted Poisson sampling and KL-calibrated DP-SGD (Ganesh et al. 2025,
Algorithm 2).

The data owner lists the secrets its records carry and, per secret j, a prior reconstruction probability
p_j and the posterior r_j it tolerates. Algorithm 2:

1. μ_j = KL(Bern(r_j) ‖ Bern(p_j))                                   (Lemma 3.2)
2. weights w from the LP of eq. (1): max Σ w_i s.t. Σ_{i ∋ j} w_i ≤ c·μ_j, w ∈ [0, 1]   (HiGHS)
3. Poisson rates ρ_i = B·w_i / Σ w
4. σ = max_j min{σ : T·KL(N(Σ_{i ∋ j} Bern(ρ_i), σ²) ‖ N(0, σ²)) ≤ μ_j}  (binary search)
5. T steps of DP-SGD: record i joins a batch with probability ρ_i, per-record gradients clipped to C,
   N(0, σ²C²) added to the sum, divided by B, then AdamW.

All accounting lives in :mod:`bench.secret_accounting`. Training: Opacus' data loader samples every record
at one rate, so the per-record Poisson sampler here is our own (one uniform draw per record per step from a
seeded generator); per-record gradients, flat clipping and noise use the vmap DP-SGD step of
``defenses.dp`` (``_VmapDP``, tested there against Opacus' DPOptimizer), whose accountant is unused: the
guarantee is the secret ledger, not an (ε, δ).

Deviations: T = round(epochs · n / B) steps, the same compute as ``dp_adapt`` at those settings (Ganesh et al. fix
T); the KL is bounded in both directions by default (see :mod:`bench.secret_accounting`); c defaults to the median
of |D_j| / μ_j over secrets (Ganesh et al. sweep c); AdamW with linear decay instead of their optimizer sweep.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch

from bench.defense import Adapted, Defense, TrainContext
from bench.errors import ConfigError
from bench.params import Param
from bench.registry import register_defense
from bench.secret_accounting import DIRECTIONS, SecretLedger, account

MISSING = ("hush: the adaptation data carries no secrets (AdaptationData.secrets / secret_targets are None): "
           "use a secret-bearing task such as `secrets`, whose challenger passes the data owner's secrets")

PARAMS = (
    Param("c", float, None, "LP constant of Ganesh et al. 2025, eq. (1): Σ_{i∋j} w_i ≤ c·μ_j; null = median of "
          "|D_j|/μ_j",
          low=0.0, low_inclusive=False, nullable=True),
    Param("batch_size", int, 16, "expected records per step B", low=1),
    Param("epochs", float, 4.0, "steps T = round(epochs · records / batch_size)", low=0.0, low_inclusive=False),
    Param("lr", float, 1e-3, "AdamW learning rate (linear decay to 0)", low=0.0, low_inclusive=False),
    Param("clip", float, 0.1, "per-record L2 clipping norm C", low=0.0, low_inclusive=False),
    Param("chunk_length", int, 128, "tokens per record (longer records are truncated)", low=8),
    Param("weight_decay", float, 0.0, "AdamW weight decay", low=0.0),
    Param("direction", str, "both", "which KL the accountant bounds: both (safe), forward (Ganesh et al.'s), reverse",
          choices=DIRECTIONS),
    Param("method", str, "full", "what trains: all weights or LoRA adapters (merged at release)",
          choices=("full", "lora")),
)


def poisson_batches(rates: np.ndarray, steps: int, seed: int):
    """Per-record Poisson sampling: at each step record i is in the batch independently with prob. ρ_i."""
    gen = torch.Generator().manual_seed(seed)
    r = torch.as_tensor(np.asarray(rates, dtype=np.float64))
    for _ in range(int(steps)):
        yield torch.nonzero(torch.rand(len(r), generator=gen, dtype=torch.float64) < r).flatten().tolist()


def hush_train(model: torch.nn.Module, seqs: list[list[int]], rates: np.ndarray, *, sigma: float, clip: float,
               batch_size: float, steps: int, lr: float, seed: int, pad_id: int, weight_decay: float = 0.0,
               device: torch.device | None = None, desc: str = "hush", progress: bool = False) -> dict:
    """T steps of Algorithm 2 lines 7–11 on the parameters that require grad; returns timing and counts."""
    from defenses.dp import _Collate, _VmapDP
    device = device or next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    model.train()
    torch.manual_seed(seed)
    noise_gen = torch.Generator(device=device).manual_seed(seed + 1)
    dp = _VmapDP(model, opt, noise_multiplier=sigma, max_grad_norm=clip, expected_batch_size=batch_size,
                 generator=noise_gen)
    collate = _Collate(pad_id)
    counts = np.zeros(len(seqs), dtype=np.int64)
    empty, tokens, loss_val, t0 = 0, 0, float("nan"), time.perf_counter()
    it = poisson_batches(rates, steps, seed)
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(it, total=steps, desc=desc, unit="step", leave=False, mininterval=1.0)
    for step, batch in enumerate(it):
        for g in opt.param_groups:
            g["lr"] = lr * max(0.0, 1.0 - step / steps)
        if batch:
            counts[batch] += 1
            ids, mask = collate([seqs[i] for i in batch])
            loss = dp.backward(ids.to(device), mask.to(device))
            if not torch.isfinite(loss):
                raise ConfigError(f"{desc}: training loss became {loss.item()}: lower the learning rate")
            loss_val, tokens = float(loss), tokens + int(mask.sum())
        else:
            empty += 1  # the release of an empty step is noise alone: still take it
        dp.step()
        dp.zero_grad()
    for p in params:
        p.grad = None
    model.eval()
    return {"steps": int(steps), "empty_steps": empty, "tokens": tokens, "final_loss": loss_val,
            "seconds": round(time.perf_counter() - t0, 3), "samples": counts.tolist()}


@register_defense("hush")
class Hush(Defense):
    description = ("Hush (Ganesh et al. 2025): per-secret (p_j, r_j) protection by an LP over example weights, Poisson "
                   "sampling at those rates and DP-SGD noise calibrated so every secret's KL bound holds.")
    version = "0.1.0"
    params = PARAMS
    code_modules = ("bench.secret_accounting", "defenses.dp")

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self._ledger: SecretLedger | None = None
        self._report: dict = {}

    def plan(self, data, ctx: TrainContext) -> tuple[list[list[int]], list[tuple[str, ...]], dict, int]:
        """The records, their secrets, the targets of the secrets present, and T."""
        if data.secrets is None or data.secret_targets is None:
            raise ConfigError(MISSING)
        seqs = ctx.encode(data.texts, self.chunk_length)
        keep = [i for i, s in enumerate(seqs) if len(s) >= 2]
        if not keep:
            raise ConfigError("hush: no adaptation record has 2 or more tokens: check the adaptation data")
        seqs = [seqs[i] for i in keep]
        secrets = [tuple(data.secrets[i]) for i in keep]
        present = {s for ss in secrets for s in ss}
        unknown = present - set(data.secret_targets)
        if unknown:
            raise ConfigError(f"hush: {len(unknown)} secrets (e.g. {sorted(unknown)[0]!r}) have no (p, r) target "
                              f"in AdaptationData.secret_targets: give every secret a target")
        targets = {s: tuple(map(float, data.secret_targets[s])) for s in present}
        if not targets:
            raise ConfigError(MISSING)
        if self.batch_size > len(seqs):
            raise ConfigError(f"hush: batch_size {self.batch_size} exceeds the {len(seqs)} records: lower it")
        steps = max(1, int(round(self.epochs * len(seqs) / self.batch_size)))
        return seqs, secrets, targets, steps

    def adapt(self, model, data, ctx: TrainContext):
        seqs, secrets, targets, steps = self.plan(data, ctx)
        t0 = time.perf_counter()
        ledger, rho = account(secrets, targets, batch_size=self.batch_size, steps=steps, c=self.c,
                              direction=self.direction)
        account_s = time.perf_counter() - t0
        desc = f"adapt: hush sigma={ledger.sigma:.3g}"
        total = sum(p.numel() for p in model.parameters())
        kw = dict(sigma=ledger.sigma, clip=self.clip, batch_size=self.batch_size, steps=steps, lr=self.lr,
                  seed=ctx.seed, pad_id=ctx.pad_id, weight_decay=self.weight_decay, device=ctx.device, desc=desc,
                  progress=ctx.progress)
        if self.method == "lora":
            from peft import LoraConfig, get_peft_model

            from defenses.dp import LORA_TARGETS
            peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                                          target_modules=LORA_TARGETS, task_type="CAUSAL_LM"))
            trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
            train = hush_train(peft_model, seqs, rho, **kw)
            out = peft_model.merge_and_unload()
            for p in out.parameters():
                p.requires_grad_(True)
        else:
            for p in model.parameters():
                p.requires_grad_(True)
            trainable = total
            train = hush_train(model, seqs, rho, **kw)
            out = model
        samples = np.asarray(train.pop("samples"), dtype=float)
        self._ledger = ledger
        self._report = {"method": self.method, "train": train, "trainable_params": trainable, "total_params": total,
                        "accounting_seconds": round(account_s, 3), "ledger": ledger.summary(),
                        "secrets": ledger.secrets,
                        "empirical_rate_mean_abs_error": float(np.abs(samples / steps - rho).mean())}
        return Adapted(out, self._report, self.guarantee())

    @classmethod
    def paper_comparison(cls, seed: int = 0) -> list[dict]:
        """The c sweep of Ganesh et al.'s Figure 1 on a world shaped like their section 5.1 (``privbench trends``)."""
        return paper_sweep(*paper_world(seed=seed))

    def guarantee(self) -> dict[str, Any] | None:
        if self._ledger is None:
            return None
        s = self._ledger.summary()
        return {"name": "secret_reconstruction", "value": s["max_bound"], **s,
                "per_secret": {k: {"r_bound": v["r_bound"], "r_target": v["r_target"], "p": v["p"],
                                   "n_records": v["n_records"],
                                   "kl": v["kl"] if math.isfinite(v["kl"]) else None}
                               for k, v in self._ledger.secrets.items()},
                "note": "value = max over secrets of the posterior reconstruction bound (Ganesh et al. 2025, "
                        "Lemma 3.2)"}


#: Ganesh et al. 2025 section 5.1: batch 2048 and 2000 iterations on a 1.7 million-abstract training split
PAPER_BATCH, PAPER_STEPS, PAPER_TRAIN = 2048, 2000, 1_700_000
#: the LP constants of the paper's sweep, c = 2^k for k = -6 … 4; c = 2^4 is "no preprocessing"
PAPER_KS = tuple(range(-6, 5))
#: 100 000 secret words (ranks 50 001–150 000 by document frequency) over 1.7 million abstracts
PAPER_DOCS_PER_SECRET = PAPER_TRAIN / 100_000


def paper_world(n_secrets: int = 1000, docs_per_secret: float = PAPER_DOCS_PER_SECRET, seed: int = 0
                ) -> tuple[list[list[str]], dict]:
    """A synthetic secret-incidence structure shaped like Ganesh et al. 2025 section 5.1, scaled down.

    The paper's secrets are the 50 001st–150 000th words of arXiv by document frequency, each in roughly 50–100
    of 1.7 million abstracts; an abstract carries every secret word it contains, and abstracts without one are
    discarded. Here each of ``n_secrets`` secrets is carried by k_j ~ U{50, …, 100} examples drawn uniformly
    without replacement among n0 = round(docs_per_secret · n_secrets) examples, and the examples that drew no
    secret are dropped. The default ratio 17 is the paper's 1.7 M abstracts / 100 000 secrets, so an example
    carries on average 75 · 100 000 / 1.7 M ≈ 4.4 secrets (Poisson(4.4), ≈ 1.2 % dropped) as a random abstract
    carries ≈ 4.4 of those words. Real rare words cluster (long or technical abstracts carry more), which uniform
    carriers do not model. Scaling m and n0 together keeps the carrier counts, the per-example secret counts
    and, with B/n fixed (:func:`paper_sweep`), every sampling rate: the accounting depends on nothing else.
    Targets as in the paper: p_j = 1e-10, r_j ~ U[2e-4, 1e-3]. Seeded: the same arguments give the same world.
    """
    if n_secrets < 1 or docs_per_secret * n_secrets < 100:
        raise ConfigError(f"paper_world: {n_secrets} secrets × {docs_per_secret} examples per secret gives fewer "
                          f"than the 100 examples a secret may need: raise n_secrets or docs_per_secret")
    rng = np.random.default_rng(seed)
    n0 = int(round(docs_per_secret * n_secrets))
    carried: list[list[str]] = [[] for _ in range(n0)]
    for j in range(n_secrets):
        for i in rng.choice(n0, size=int(rng.integers(50, 101)), replace=False):
            carried[i].append(f"s{j}")
    targets = {f"s{j}": (1e-10, float(rng.uniform(2e-4, 1e-3))) for j in range(n_secrets)}
    return [ss for ss in carried if ss], targets


def paper_sweep(secrets: list[list[str]], targets: dict, *, ks=PAPER_KS, steps: int = PAPER_STEPS,
                sample_rate: float = PAPER_BATCH / PAPER_TRAIN, direction: str = "forward") -> dict:
    """Ganesh et al. 2025 Figure 1a/1c on a world: per c = 2^k, the examples the LP keeps and the σ it needs.

    Scaling: the expected batch is B = sample_rate · n with the paper's B/n = 2048 / 1.7 M and its T = 2000
    steps, so every record's Poisson rate, and hence every secret's KL, is what the paper's world would give.
    The paper's ×10 assumption (batch and data 10 times larger in the accounting) leaves B/n, so every rate
    and the accounted σ, unchanged; it only divides the noise per averaged gradient by 10 (σ/10 relative to
    the real batch), the same factor at every c, so it cancels in the reductions reported here.

    Units of c: read literally with μ_j in nats (Lemma 3.2, μ_j ≤ 0.015 for these targets), c = 2^4 would allow
    each secret a total weight of at most 0.24 although it has 50–100 examples, yet the paper states that
    c = 2^4 keeps every example with weight 1. Its c is thus in units the paper does not give. We anchor them
    where the paper does: c = 2^4 is the smallest LP constant at which every weight is 1, i.e. the LP constant
    is c · s with s = max_j(k_j / μ_j) / 2^4 (k_j = the carriers of secret j). Below 2^4 the tightest secret's
    constraint binds, so c = 2^4 is exactly no preprocessing and every smaller c preprocesses.

    σ uses the paper's accounting (``direction="forward"``: KL(N(Σ Bern(ρ_i), σ²)^T ‖ N(0, σ²)^T) ≤ μ_j, as in
    Algorithm 2 line 4); the defense's default also bounds the reverse KL. Per c the rows give ``kept_nonzero``
    (the share of examples with weight > 1e-9: the measure of Figure 1a), ``kept_weight`` (Σ w_i / n: the
    share of the data the sampler draws in expectation, relative to no preprocessing), σ and
    ``reduction`` = σ(2^4) / σ(c).
    """
    from threadpoolctl import threadpool_limits  # installed with scikit-learn

    # One BLAS thread: the accounting's linear algebra is small (a 160-node Gauss–Hermite rule per KL), and
    # with the cores shared, OpenBLAS' spinning threads made the m = 300 sweep 6× slower (63 s vs 11 s).
    with threadpool_limits(limits=1, user_api="blas"):
        return _sweep(secrets, targets, ks, steps, sample_rate, direction)


def _sweep(secrets: list[list[str]], targets: dict, ks, steps: int, sample_rate: float, direction: str) -> dict:
    """The body of :func:`paper_sweep`: the c scale, then per c the LP, the rates and the calibrated σ."""
    from bench.secret_accounting import calibrate_sigma, kl_target, sampling_rates, solve_weights
    ids = sorted(targets)
    mus = {s: kl_target(*targets[s]) for s in ids}
    counts = dict.fromkeys(ids, 0)
    for ss in secrets:
        for s in set(ss):
            counts[s] += 1
    if min(counts.values()) == 0:
        raise ConfigError("paper_sweep: some secret has no example: build the world with paper_world")
    n = len(secrets)
    scale = max(counts[s] / mus[s] for s in ids) / 2.0 ** 4
    batch = sample_rate * n
    rows = []
    for k in ks:
        t0 = time.perf_counter()
        w = solve_weights(secrets, mus, 2.0 ** k * scale)
        sigma = calibrate_sigma(secrets, targets, sampling_rates(w, batch), steps, direction=direction)
        rows.append({"k": int(k), "c": 2.0 ** k, "lp_c": 2.0 ** k * scale,
                     "kept_nonzero": float((w > 1e-9).mean()), "kept_weight": float(w.sum() / n),
                     "sigma": float(sigma), "seconds": round(time.perf_counter() - t0, 2)})
    ref = next((r["sigma"] for r in rows if r["k"] == 4), None)
    for r in rows:
        r["reduction"] = ref / r["sigma"] if ref is not None and r["sigma"] > 0 else None
    mean_secrets = float(np.mean([len(ss) for ss in secrets]))
    return {"n_examples": n, "n_secrets": len(ids), "mean_secrets_per_example": mean_secrets,
            "batch_size": batch, "steps": int(steps), "sample_rate": sample_rate, "c_scale": scale,
            "direction": direction, "rows": rows}


def sweep_table(sweep: dict) -> str:
    """The sweep as a Markdown table (docs/hush.md and ``python -m defenses.hush``)."""
    out = ["| c | LP constant c·s | kept (w > 0) | kept (Σw / n) | σ | σ(2^4) / σ(c) |",
           "| --- | --- | --- | --- | --- | --- |"]
    for r in sweep["rows"]:
        out.append(f"| 2^{r['k']} | {r['lp_c']:.4g} | {r['kept_nonzero']:.3f} | {r['kept_weight']:.3f} | "
                   f"{r['sigma']:.4g} | {'–' if r['reduction'] is None else format(r['reduction'], '.2f')} |")
    return "\n".join(out)


if __name__ == "__main__":  # python -m defenses.hush [n_secrets [seed]]: Ganesh et al. 2025 Figure 1a/1c
    import json
    import sys

    m = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    t_start = time.perf_counter()
    result = paper_sweep(*paper_world(m, seed=seed))
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))
    print(sweep_table(result))
    print(f"{time.perf_counter() - t_start:.1f} s")
