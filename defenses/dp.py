"""Differentially private adaptation (DP-SGD with Adam, Opacus), after Marek et al. (2026, "Benchmarking
Empirical Privacy Protection for Adaptations of Large Language Models"), section 3 and appendix B.2.

One defense, ``dp_adapt``, with the four adaptation methods of Marek et al. (2026):

* ``full``   – every weight trains (Li et al., 2022).
* ``head``   – only the output embedding (``model.get_output_embeddings()``;
  GPT-NeoX calls it ``embed_out`` / ``lm_head``) trains: Marek et al.'s "last layer".
* ``lora``   – peft LoRA, r = 8, alpha = 16, merged into the weights at release.
* ``prefix`` – prefix tuning (Li & Liang 2021) through peft: trainable key/value
  vectors prepended at every layer. A prefix cannot be merged into GPT-NeoX
  weights, so ``adapt`` returns a :class:`PrefixRelease` (bench/release.py): the
  base checkpoint and the peft adapter, reloaded as a ``PeftModel`` by the
  ``peft_prefix`` loader registered here.

Privacy (Abadi et al., 2016): every step draws a Poisson sample of the records
(each with probability q), clips each record's gradient to L2 norm ``clip``,
adds N(0, (σ·clip)²) noise to the sum and divides by the expected batch size;
Adam(W) then uses that noisy gradient. σ is calibrated so that the RDP accountant
(or PRV, ``accountant: prv``) gives ε ≤ ``epsilon`` at δ after all steps; the
ledger recomputes ε with both accountants. The unit of privacy is one adaptation
record (a text, truncated to ``chunk_length`` tokens), i.e. Marek et al.'s
sentence-level DP where each record is one chunk. The loss of a record is its own
mean token loss, so no record's gradient depends on another record (a token-mean
over the whole batch, as Hugging Face computes it, would couple records). δ defaults to
1/(2n) for n records, as Li et al. (2022) use.

With ``unit`` user, secret or text, the unit of privacy is instead a whole unit (a user's records, the records
carrying one secret, the copies of one text): Poisson sampling of units, each unit's gradient the mean of its
records' clipped as one vector, n and δ over units (user-level DP-SGD: McMahan et al. 2018, Charles et al. 2024,
Chua et al. 2024; docs/dp.md, "Unit-level DP").

Under record-level DP, membership games whose unit spans several records (a user's records, the records
carrying one secret, a canary inserted r times) get the group-privacy bound of
the largest such group in the defense's own data (``bench.accounting.group_privacy``:
ε_k = k·ε, δ_k = k·e^{(k−1)ε}·δ), reported next to the per-record ε.

``epsilon: inf`` is the non-private run of the same method: the same Poisson
batches, steps, optimizer and loss, with neither clipping nor noise. The batches
are the same because every path samples from one generator seeded with the run's
seed: the plain loader carries it, and Opacus' ``make_private(poisson_sampling=True)``
rebuilds the loader with ``DPDataLoader.from_data_loader``, which (secure_mode off,
so its own generator is None) takes the plain loader's generator; the vmap and
ε = ∞ paths pass it to ``DPDataLoader.from_data_loader`` directly (tested).

Per-record gradients (``grad_sample_mode``): ``hooks`` (default) and ``functorch`` are Opacus' per-record
gradient samplers; ``vmap`` is one ``torch.func`` vmap over the model (``_VmapDP``); ``ghost`` is Opacus'
fast gradient clipping: the ghost norm of Li et al. (2022) for Linear and Embedding layers (per-record norms
from activations and backprops, no per-record gradient), per-record gradients only for the other layers
(LayerNorm: mixed ghost clipping), then a second backward pass of the clipping-weighted per-record losses.
``bk`` is book-keeping (Bu et al. 2023, :mod:`defenses.dp_bookkeeping`): one backward pass without weight
gradients, per-record norms and the clipped sum from each layer's activations and output gradients; the fastest
mode for full, head and LoRA fine-tuning (1.01–1.24× a non-private step on CPU). All five clip each record's
gradient to ``clip`` and add the same noise to the sum (tested: ghost and bk equal hooks step for step). On the
CPU models of this project ghost is slower than hooks (two backward passes;
docs/benchmarks.md), so hooks stays the default; ghost saves memory, which matters on large models.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bench.accounting import PRIVACY_UNITS, DPLedger, group_privacy, largest_group, noise_for_epsilon, privacy_units
from bench.defense import Adapted, Defense, TrainContext
from bench.errors import ConfigError
from bench.params import Param
from bench.registry import register_defense
from bench.release import Release, register_release
from defenses.dp_units import embedding_sq_norms, sum_rows_by_unit, unit_count, unit_weights

log = logging.getLogger(__name__)

METHODS = ("full", "head", "lora", "prefix")
EPSILON_GRID = (0.1, 0.5, 1.0, 3.0, 8.0, math.inf)  # the privacy regimes of Marek et al. (2026)
DEFAULT_LR = {"full": 1e-3, "head": 1e-3, "lora": 3e-3, "prefix": 1e-2}
LORA_TARGETS = ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"]
GRAD_SAMPLE_MODES = ("hooks", "functorch", "ghost", "vmap", "bk")
#: bk with its layer schedule forced, for measure_step_cost: ``bk`` itself groups layers on CUDA only
BK_SCHEDULES = {"bk-per-layer": False, "bk-grouped": True}
STEP_COST_MODES = (*GRAD_SAMPLE_MODES, *BK_SCHEDULES)
#: measure_step_cost's name for SmolLM2-135M's architecture (the realistic track's model) with random weights
SMOLLM2_ARCH = "smollm2-135m-arch"

class _EpsilonParam(Param):
    """A float parameter that also accepts infinity (``inf``, ``.inf``): the ε = ∞ column of the grid."""

    def validate(self, value: Any, owner: str) -> Any:
        if isinstance(value, str) and value.strip().lower().lstrip("+.") in ("inf", "infinity"):
            return math.inf
        if isinstance(value, float) and value == math.inf:
            return math.inf
        return super().validate(value, owner)


PARAMS = (
    Param("method", str, "full", "what trains: all weights, the output head, LoRA adapters, or a prefix",
          choices=METHODS),
    _EpsilonParam("epsilon", float, 8.0, "target epsilon of (epsilon, delta)-DP; inf = the same method without DP",
                  low=0.0, low_inclusive=False),
    Param("delta", float, None, "delta of (epsilon, delta)-DP; null = 1 / (2 x number of records), as Li et al. "
          "2022", low=0.0, low_inclusive=False, high=1.0, high_inclusive=False, nullable=True),
    Param("clip", float, 0.1, "per-record L2 clipping norm (0.1 as Marek et al. 2026, after Li et al. 2022)",
          low=0.0, low_inclusive=False),
    Param("noise_multiplier", float, None, "noise std / clip; null = calibrated to epsilon (give it to override)",
          low=0.0, nullable=True),
    Param("accountant", str, "rdp", "accountant that calibrates the noise (both are recorded)",
          choices=("rdp", "prv")),
    Param("epochs", float, 4.0, "expected passes over the data: steps = epochs / sampling rate", low=0.0,
          low_inclusive=False),
    Param("lr", float, None, "Adam(W) learning rate; null = 1e-3 full/head, 3e-3 lora, 1e-2 prefix", low=0.0,
          low_inclusive=False, nullable=True),
    Param("batch_size", int, 16, "expected records per step under Poisson sampling", low=1),
    Param("chunk_length", int, 128, "tokens per record (longer records are truncated)", low=8),
    Param("weight_decay", float, 0.0, "AdamW weight decay (0 = Hugging Face's default)", low=0.0),
    Param("r", int, 8, "LoRA rank (Marek et al. 2026: 8)", low=1),
    Param("alpha", int, 16, "LoRA alpha (Marek et al. 2026: 16)", low=1),
    Param("target_modules", list, LORA_TARGETS, "modules that get LoRA adapters", item_type=str),
    Param("prefix_length", int, 32, "prefix tuning: virtual tokens (Marek et al. 2026 use 64 with 256-token "
          "chunks; 32 keeps that prefix-to-chunk ratio of 1/4 for the 128-token chunks of the tiny models)", low=1),
    Param("grad_sample_mode", str, "hooks", "per-record gradients: Opacus hooks or functorch, Opacus' ghost "
          "clipping (per-record norms without per-record gradients, two backward passes), or one torch.func "
          "vmap over the whole model (with Opacus' DPOptimizer and accountant), or book-keeping (Bu et al. 2023: "
          "one backward without weight gradients; norms and the clipped sum from activations and output "
          "gradients; defenses/dp_bookkeeping.py)",
          choices=GRAD_SAMPLE_MODES),
    Param("unit", str, "record", "the privacy unit: record (DP-SGD on records), or user, secret or text (identical "
          "texts) for unit-level DP-SGD that samples and clips whole units (a unit's gradient is the mean of its "
          "records'), so epsilon bounds one unit; auto = the unit the data names (user, else secret, else text)",
          choices=PRIVACY_UNITS),
)


# ------------------------------------------------------------------------------------------ data
class _Records(torch.utils.data.Dataset):
    def __init__(self, seqs: list[list[int]]) -> None:
        self.seqs = seqs

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, i: int) -> list[int]:
        return self.seqs[i]


class _Collate:
    """Right-pad a batch of token lists to (ids, mask); picklable for DataLoader workers."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, batch: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        if not batch:  # Poisson sampling can draw no record at all
            return torch.zeros((0, 1), dtype=torch.long), torch.zeros((0, 1), dtype=torch.long)
        width = max(len(s) for s in batch)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for r, s in enumerate(batch):
            ids[r, : len(s)] = torch.tensor(s, dtype=torch.long)
            mask[r, : len(s)] = 1
        return ids, mask


class _UnitCollate(_Collate):
    """Right-pad the records of a batch of units: (ids, mask, row_unit), the rows of a unit next to each other
    and ``row_unit`` the unit (0 .. units in the batch − 1) each row belongs to."""

    def __call__(self, batch: list[list[list[int]]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = [s for unit in batch for s in unit]
        ids, mask = super().__call__(rows)
        row_unit = torch.tensor([u for u, unit in enumerate(batch) for _ in unit], dtype=torch.long)
        return ids, mask, row_unit


def record_losses(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each record's own mean next-token loss, shape (batch,): no record's value depends on another.

    Targets are the ids shifted left with the last position masked out, so the (batch, length, vocab)
    logits are used whole (slicing them would copy them and zero-fill a gradient of the same size).
    """
    targets = torch.roll(ids, -1, dims=1)
    m = torch.zeros_like(mask, dtype=torch.float32)
    m[:, :-1] = mask[:, 1:]
    lp = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten(),
                                           reduction="none").view(ids.shape)
    return (lp * m).sum(1) / m.sum(1).clamp_min(1.0)


class RecordLoss:
    """``record_losses`` as a criterion for Opacus' ghost clipping (``DPLossFastGradientClipping``).

    Opacus sets ``reduction = "none"`` to get the per-record losses, scales each by its clipping
    coefficient and back-propagates their sum a second time; ``"mean"`` is the batch mean the other modes
    back-propagate.
    """

    def __init__(self, reduction: str = "mean") -> None:
        self.reduction = reduction

    def __call__(self, logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        losses = record_losses(logits, ids, mask)
        return losses if self.reduction == "none" else losses.mean() if self.reduction == "mean" else losses.sum()


def _contiguous_embedding_inputs(model: torch.nn.Module) -> list:
    """Make the ids entering every trainable ``nn.Embedding`` contiguous (forward pre-hooks; returns handles).

    peft's prefix encoder looks up ``prefix_tokens.expand(batch, -1)``, an expanded view, and Opacus 1.6's
    ghost norm for embeddings calls ``.view(-1, 1)`` on the ids, which fails on such a view. The copy is of
    ``batch × prefix_length`` integers; Opacus' forward hook then records the contiguous ids.
    """
    def pre_hook(_module, args):
        return tuple(a.contiguous() if torch.is_tensor(a) else a for a in args)

    return [m.register_forward_pre_hook(pre_hook) for m in model.modules()
            if isinstance(m, torch.nn.Embedding) and any(p.requires_grad for p in m.parameters(recurse=False))]


def ghost_coverage(model: torch.nn.Module) -> dict[str, list[str]]:
    """Which trainable modules Opacus' ghost clipping covers: ``ghost`` (Linear, Embedding: per-record norms
    from activations and backprops alone) and ``per_record`` (every other layer, e.g. LayerNorm: Opacus
    computes its per-record gradients and their norms, i.e. mixed ghost clipping). Both give exact norms."""
    from opacus.grad_sample import GradSampleModuleFastGradientClipping as G
    from opacus.utils.module_utils import trainable_modules

    out: dict[str, list[str]] = {"ghost": [], "per_record": []}
    for name, m in trainable_modules(model):
        out["ghost" if type(m) in G.NORM_SAMPLERS else "per_record"].append(type(m).__name__)
    return {k: sorted(set(v)) for k, v in out.items()}


def trained_records(seqs: list[list[int]]) -> list[int]:
    """Indices of the records DP-SGD trains on: those with 2 or more tokens (a shorter one has no target).

    The DP unit and the record count n (hence the default δ and the group sizes) are over these records only.
    """
    return [i for i, s in enumerate(seqs) if len(s) >= 2]


# ------------------------------------------------------------------------------------------ training
def expected_batch(n: int, batches: int) -> int:
    """The divisor of the noisy sum of clipped gradients: Opacus' expected batch size ⌊n·q⌋ with q = 1/``batches``,
    computed in integers. Opacus multiplies n by the float 1/batches, which falls just below an integer for some n
    (49 · (1/49) = 0.999…): the divisor came out one too small, or 0 and the step infinite."""
    return n // batches


def dp_train(model: torch.nn.Module, seqs: list[list[int]], *, pad_id: int, epsilon: float, delta: float | None,
             clip: float, epochs: float, lr: float, batch_size: int, seed: int, weight_decay: float = 0.0,
             noise_multiplier: float | None = None, accountant: str = "rdp", grad_sample_mode: str = "hooks",
             device: torch.device | None = None, desc: str = "dp", progress: bool = False,
             units: list[int] | None = None, unit: str = "record") -> dict:
    """Train the parameters of ``model`` that require grad with DP-SGD + AdamW; returns the report.

    ``epsilon = inf`` (and no ``noise_multiplier``) trains on the same Poisson batches without
    clipping or noise: every path draws them from ``gen`` (see the module docstring). ``delta = None``
    means 1/(2n) for the n records trained on (Li et al. 2022). The report has ``ledger`` (a
    :class:`DPLedger` dict, or None when non-private) and the step timing.

    ``units`` (aligned with ``seqs``, from :func:`bench.accounting.privacy_units`) with ``unit`` other than
    record: unit-level DP-SGD. Each step Poisson-samples whole units; a unit's gradient is the mean of its
    records' gradients, clipped to ``clip`` as one vector; the noise, the batch (expected units per step),
    n and the default δ are over units, so (ε, δ) bounds adding or removing one unit with all its records.
    """
    from opacus import PrivacyEngine
    from opacus.data_loader import DPDataLoader

    kept = trained_records(seqs)
    by_unit = unit != "record"
    if by_unit:
        if units is None or len(units) != len(seqs):
            raise ConfigError(f"{desc}: unit {unit!r} needs one unit index per record "
                              f"(bench.accounting.privacy_units)")
        if grad_sample_mode == "ghost":
            raise ConfigError(f"{desc}: grad_sample_mode ghost clips records inside Opacus' criterion and cannot "
                              f"clip a unit of several records: use grad_sample_mode hooks, functorch, vmap or bk "
                              f"with unit {unit!r}")
    seqs = [list(seqs[i]) for i in kept]
    if not seqs:
        raise ConfigError(f"{desc}: no training record has 2 or more tokens: check the adaptation data")
    device = device or next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ConfigError(f"{desc}: nothing to train (no parameter requires grad)")
    n_records = len(seqs)
    if by_unit:
        grouped: dict[int, list[list[int]]] = {}
        for i, seq in zip(kept, seqs):
            grouped.setdefault(units[i], []).append(seq)
        items: list = list(grouped.values())
        collate: _Collate = _UnitCollate(pad_id)
    else:
        items, collate = seqs, _Collate(pad_id)
    n = len(items)
    if batch_size > n:
        raise ConfigError(f"{desc}: batch_size {batch_size} exceeds the {n} {unit}s: lower batch_size")
    private = noise_multiplier is not None or math.isfinite(epsilon)
    gen = torch.Generator().manual_seed(seed)
    loader = torch.utils.data.DataLoader(_Records(items), batch_size=batch_size, collate_fn=collate,
                                         generator=gen)
    batches = len(loader)  # per epoch, before Opacus' Poisson loader replaces this one
    sample_rate = 1.0 / batches  # Opacus' definition: q = 1 / batches per epoch, about batch_size / n
    steps = max(1, int(round(epochs / sample_rate)))
    delta = float(delta) if delta is not None else 1.0 / (2 * n)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)  # HF defaults: betas (0.9, 0.999), eps 1e-8
    torch.manual_seed(seed)
    model.train()  # Opacus needs training mode before make_private (offline-facts)
    hooks = vmap_dp = criterion = None
    contiguous: list = []
    if private:
        if noise_multiplier is not None:
            sigma, calibrated_by, target = float(noise_multiplier), "given", None
        else:
            sigma = noise_for_epsilon(epsilon, delta, sample_rate, steps, accountant=accountant)
            calibrated_by, target = accountant, float(epsilon)
        noise_gen = torch.Generator(device=device).manual_seed(seed + 1)
        if grad_sample_mode in ("vmap", "bk"):
            # Opacus' Poisson loader and RDP accountant; per-record norms, clipping and noise by _VmapDP or
            # BookKeepingDP
            from opacus.accountants import RDPAccountant
            loader = DPDataLoader.from_data_loader(loader, generator=gen)
            accountant_obj = RDPAccountant()
            opt = vmap_dp = _own_dp_step(grad_sample_mode, model, opt, noise_multiplier=sigma, max_grad_norm=clip,
                                         expected_batch_size=expected_batch(n, batches), generator=noise_gen,
                                         accountant=accountant_obj, sample_rate=sample_rate)
        else:
            # Opacus rebuilds ``loader`` as a DPDataLoader whose sampler uses ``loader.generator`` (= gen):
            # the same Poisson batches as the vmap and epsilon = inf paths below
            engine = PrivacyEngine(accountant="rdp")
            made = engine.make_private(
                module=model, optimizer=opt, data_loader=loader, noise_multiplier=sigma, max_grad_norm=clip,
                poisson_sampling=True, grad_sample_mode=grad_sample_mode, loss_reduction="mean", wrap_model=False,
                noise_generator=noise_gen, criterion=RecordLoss())
            if grad_sample_mode == "ghost":  # (hooks, optimizer, criterion, loader): the criterion runs 2 backwards
                hooks, opt, criterion, loader = made
                contiguous = _contiguous_embedding_inputs(model)
                cover = ghost_coverage(model)
                log.info("%s: ghost clipping for %s; per-record gradients (mixed ghost clipping) for %s", desc,
                         ", ".join(cover["ghost"]) or "no layer", ", ".join(cover["per_record"]) or "no layer")
            else:
                hooks, opt, loader = made
            opt.expected_batch_size = expected_batch(n, batches)  # Opacus' own is int(n * (1 / batches))
            accountant_obj = engine.accountant
    else:
        loader = DPDataLoader.from_data_loader(loader, generator=gen)  # same Poisson batches, no clip, no noise
    sched = lambda s: lr * max(0.0, 1.0 - s / steps)  # noqa: E731  (HF Trainer's default linear decay)

    step, tokens, empty, loss_val = 0, 0, 0, float("nan")
    step_times: list[float] = []
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=steps, desc=desc, unit="step", leave=False, mininterval=1.0)
    try:
        while step < steps:
            for ids, mask, *rest in loader:
                row_unit = rest[0] if rest else None
                if step >= steps:
                    break
                t0 = time.perf_counter()
                for g in opt.param_groups:
                    g["lr"] = sched(step)
                if ids.shape[0] == 0:
                    empty += 1
                    if private:  # the release of an empty step is noise alone: still take it
                        if criterion is not None:  # ghost: the optimizer sums p.grad (already clipped)
                            for p in params:
                                p.grad = torch.zeros_like(p)
                        elif vmap_dp is None:
                            for p in params:
                                p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device)
                        opt.step()
                    opt.zero_grad(set_to_none=True)
                else:
                    ids, mask = ids.to(device), mask.to(device)
                    backward = None
                    if vmap_dp is not None:
                        loss = (vmap_dp.backward(ids, mask) if row_unit is None
                                else vmap_dp.backward(ids, mask, row_unit=row_unit.to(device)))
                    elif criterion is not None:
                        dp_loss = criterion(model(input_ids=ids, attention_mask=mask).logits, ids, mask)
                        loss, backward = dp_loss.detach(), dp_loss
                    else:
                        logits = model(input_ids=ids, attention_mask=mask).logits
                        if row_unit is None:
                            loss = backward = record_losses(logits, ids, mask).mean()
                        else:
                            row_unit = row_unit.to(device)
                            weighted = record_losses(logits, ids, mask) * unit_weights(row_unit)
                            loss = weighted.sum() / unit_count(row_unit)  # the mean of the units' losses
                            # Opacus ("mean") scales each row's gradient by the rows: row r gets w_r ∇ℓ_r
                            backward = weighted.mean() if private else loss
                    if not torch.isfinite(loss):
                        raise ConfigError(f"{desc}: training loss became {loss.item()}: lower the learning rate")
                    if backward is not None:
                        backward.backward()  # ghost: Opacus' norms, then the sum of clipped per-record losses
                    if row_unit is not None and private and vmap_dp is None:
                        n_units = unit_count(row_unit)  # Opacus then clips each unit's summed gradient
                        for p in params:
                            p.grad_sample = sum_rows_by_unit(p.grad_sample, row_unit, n_units)
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    tokens += int(mask.sum())
                    loss_val = float(loss.detach())
                step += 1
                step_times.append(time.perf_counter() - t0)
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        for handle in contiguous:
            handle.remove()
        if hooks is not None:
            hooks.cleanup()  # removes Opacus' hooks and grad_sample attributes: the model is plain again
        for p in params:
            for attr in ("grad_sample", "summed_grad", "_processed", "_norm_sample", "_forward_counter"):
                if hasattr(p, attr):
                    try:
                        delattr(p, attr)
                    except AttributeError:
                        pass
            p.grad = None
    model.eval()

    ledger = None
    if private:
        hist = accountant_obj.history
        if hist != [(sigma, sample_rate, steps)]:  # the engine's own account must match ours
            raise ConfigError(f"{desc}: Opacus accounted {hist}, expected {[(sigma, sample_rate, steps)]}")
        ledger = DPLedger.build(sigma=sigma, sample_rate=sample_rate, steps=steps, clip=clip, delta=delta,
                                n_records=n_records, target_epsilon=target, accountant=calibrated_by,
                                grad_sample_mode=grad_sample_mode, unit=unit, n_units=n if by_unit else None)
    timed = step_times[1:] or step_times  # the first step pays one-off setup
    total = sum(step_times)
    return {
        "ledger": ledger.to_dict() if ledger is not None else None,
        "_ledger": ledger,
        "private": private,
        "steps": steps, "empty_steps": empty, "tokens": tokens, "final_loss": loss_val,
        "seconds": round(total, 3), "step_seconds_mean": sum(timed) / len(timed),
        "tokens_per_s": round(tokens / total, 1) if total > 0 else float("nan"),
        "sample_rate": sample_rate, "expected_batch": sample_rate * n, "n_records": n_records, "delta": delta,
        "lr": lr, **({"unit": unit, "n_units": n} if by_unit else {}),
    }


class _VmapDP:
    """DP-SGD step with per-record gradients from one ``torch.func.vmap(grad(...))`` over the whole model.

    Why not only Opacus: its hooks compute per-record weight gradients from saved activations while autograd
    still computes the summed weight gradient that DP-SGD throws away (for the nano model the output head's
    gradient alone is ~4 GFLOP a step, done twice), and it materialises the input embedding's per-record
    gradient as a dense (batch, vocab, hidden) tensor. Here each record's loss is differentiated once, and
    the input embedding is handled sparsely: record i's gradient is sum_t onehot(x_it) b_it^T with b_it the
    gradient at its embedding output, so ||g_i||^2 = sum_{t,s} [x_it = x_is] b_it . b_is and the clipped
    sum is an index_add of c_i b_it. Clipping (flat, c_i = min(1, C / (||g_i|| + 1e-6)) as Opacus), noise
    N(0, (sigma C)^2), division by the expected batch size, and the accountant step follow Opacus'
    DPOptimizer exactly; tests/test_dp.py checks the noise-free update equals Opacus' to float tolerance.

    Records are right-padded and the model is causal, so real tokens never see padding: the forward needs
    no attention mask (whose data-dependent checks vmap cannot trace) and padding is excluded from the loss
    (its embedding gradients are exactly 0).
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, noise_multiplier: float,
                 max_grad_norm: float, expected_batch_size: float, generator: torch.Generator | None,
                 accountant=None, sample_rate: float = 1.0) -> None:
        from torch.func import functional_call, grad, vmap

        self.model, self.optimizer = model, optimizer
        self.sigma, self.clip, self.expected = float(noise_multiplier), float(max_grad_norm), float(expected_batch_size)
        self.generator, self.accountant, self.sample_rate = generator, accountant, sample_rate
        emb = model.get_input_embeddings()
        head = model.get_output_embeddings()
        self.emb = emb if (emb is not None and emb.weight.requires_grad and type(emb) is torch.nn.Embedding
                           and (head is None or head.weight is not emb.weight)) else None
        self.dense = {k: p for k, p in model.named_parameters() if p.requires_grad
                      and (self.emb is None or p is not self.emb.weight)}
        frozen = {k: p.detach() for k, p in model.named_parameters() if k not in self.dense}
        frozen.update(dict(model.named_buffers()))

        def loss_one(params, embeds, ids, mask):
            kw = {"inputs_embeds": embeds[None]} if embeds is not None else {"input_ids": ids[None]}
            out = functional_call(model, ({**params, **frozen},), args=(), kwargs={**kw, "use_cache": False})
            loss = record_losses(out.logits, ids[None], mask[None])[0]
            return loss, loss.detach()

        argnums = (0, 1) if self.emb is not None else 0
        emb_dim = 0 if self.emb is not None else None
        self._fn = vmap(grad(loss_one, argnums=argnums, has_aux=True), in_dims=(None, emb_dim, 0, 0),
                        randomness="different")
        self._pending: tuple | None = None

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def backward(self, ids: torch.Tensor, mask: torch.Tensor, row_unit: torch.Tensor | None = None) -> torch.Tensor:
        """Per-record gradients of the batch (kept until ``step``); returns the mean record loss.

        With ``row_unit`` (unit-level DP), each unit's gradient is the mean of its rows' (``unit_weights``), kept
        per unit: the dense ones summed, the embedding's kept per row, whose norm ``step`` takes per unit
        (:func:`~defenses.dp_units.embedding_sq_norms`); ``step`` then clips units as it clips records. Returns
        the mean unit loss."""
        params = {k: p.detach() for k, p in self.dense.items()}
        if self.emb is not None:
            embeds = self.emb(ids).detach()
            (g_dense, g_emb), losses = self._fn(params, embeds, ids, mask)
        else:
            g_dense, losses = self._fn(params, None, ids, mask)
            g_emb = None
        if row_unit is None:
            self._pending = (g_dense, g_emb, ids, None)
            return losses.mean()
        w = unit_weights(row_unit)
        n_units = unit_count(row_unit)
        g_dense = {k: sum_rows_by_unit(g * w.view(-1, *[1] * (g.dim() - 1)), row_unit, n_units)
                   for k, g in g_dense.items()}
        if g_emb is not None:  # kept per row: ``step`` takes its norm per unit (embedding_sq_norms)
            g_emb = g_emb * w[:, None, None]
        self._pending = (g_dense, g_emb, ids, row_unit)
        return (losses * w).sum() / n_units

    @torch.no_grad()
    def step(self) -> None:
        params = list(self.dense.values()) + ([self.emb.weight] if self.emb is not None else [])
        if self._pending is None:  # empty Poisson batch: the release is noise alone
            sums = {id(p): torch.zeros_like(p) for p in params}
        else:
            g_dense, g_emb, ids, row_unit = self._pending
            n = ids.shape[0] if row_unit is None else unit_count(row_unit)
            norm2 = torch.zeros(n, dtype=torch.float32, device=ids.device)
            for g in g_dense.values():
                norm2 += torch.linalg.vector_norm(g.reshape(n, -1), dim=1).square()
            if g_emb is not None:
                norm2 += embedding_sq_norms(ids, g_emb, row_unit, n)
            coef = (self.clip / (norm2.sqrt() + 1e-6)).clamp(max=1.0)
            sums = {id(p): torch.tensordot(coef, g_dense[k], dims=1) for k, p in self.dense.items()}
            if g_emb is not None:
                row_coef = coef if row_unit is None else coef[row_unit.to(coef.device)]  # a row clipped as its unit
                w = self.emb.weight
                sums[id(w)] = torch.zeros_like(w).index_add_(
                    0, ids.reshape(-1), (row_coef[:, None, None] * g_emb).reshape(-1, w.shape[1]))
        for p in params:
            noise = torch.normal(0.0, self.sigma * self.clip, p.shape, generator=self.generator, device=p.device)
            p.grad = (sums[id(p)] + noise) / self.expected
        self.optimizer.step()
        if self.accountant is not None:
            self.accountant.step(noise_multiplier=self.sigma, sample_rate=self.sample_rate)
        self._pending = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._pending = None
        self.optimizer.zero_grad(set_to_none=set_to_none)


def _own_dp_step(mode: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, **kw):
    """The DP step privbench implements itself for ``mode`` (``vmap``, ``bk`` or one of :data:`BK_SCHEDULES`),
    driven like Opacus' optimizer."""
    if mode == "vmap":
        return _VmapDP(model, optimizer, **kw)
    from defenses.dp_bookkeeping import BookKeepingDP
    if mode in BK_SCHEDULES:
        kw["group_layers"] = BK_SCHEDULES[mode]
    return BookKeepingDP(model, optimizer, loss_fn=record_losses, **kw)


def train_prefix(model: torch.nn.Module, seqs: list[list[int]], *, prefix_length: int, **train_kw) -> tuple:
    """DP prefix tuning through peft: returns (peft model with the trained prefix, report).

    The result is a ``PeftModelForCausalLM``: the prefix lives in its ``prompt_encoder`` (an ``nn.Embedding``
    of the virtual-token ids, expanded to the batch, so Opacus' embedding hook gives exact per-record
    gradients) and is passed as past key/values on every forward. It cannot be merged into the base weights;
    ``dp_adapt`` releases it as a :class:`PrefixRelease`.
    """
    from peft import PrefixTuningConfig, get_peft_model

    mode = train_kw.get("grad_sample_mode")
    if mode in ("vmap", "bk"):
        raise ConfigError(f"dp_adapt: method prefix with grad_sample_mode {mode} is not supported (that path "
                          "differentiates the model's own weights and input embedding, not peft's prompt "
                          "encoder): use grad_sample_mode hooks or functorch")
    cfg = PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=prefix_length)
    peft_model = get_peft_model(model, cfg)
    report = dp_train(peft_model, seqs, **train_kw)
    return peft_model, report


class PrefixRelease(Release):
    """A prefix-tuned model: the base checkpoint (``base/``, with its tokenizer) and the peft adapter
    (``adapter/``). The ``peft_prefix`` loader rebuilds the ``PeftModel`` around the base."""

    kind = "peft_prefix"

    def __init__(self, peft_model, tokenizer) -> None:
        self.peft_model, self.tokenizer = peft_model, tokenizer

    def save(self, directory: Path) -> dict[str, Any]:
        base = self.peft_model.get_base_model()
        base.save_pretrained(directory / "base")
        self.tokenizer.save_pretrained(directory / "base")
        self.peft_model.save_pretrained(directory / "adapter")
        cfg = self.peft_model.peft_config["default"]
        return {"num_virtual_tokens": int(cfg.num_virtual_tokens), "base": "base", "adapter": "adapter"}


class PrefixGreedy(torch.nn.Module):
    """A peft prefix-tuned model whose greedy ``generate`` runs through its own forward pass.

    peft's ``generate`` puts the prefix into ``past_key_values`` while transformers 5 keeps the generation cache
    under ``cache`` and, given both, ignores the former: the continuation is the base model's, as if no prefix had
    been trained (peft 0.21.2 with transformers 5.24; tests/test_prefix.py shows it). The forward pass is right
    (peft hands the prefix over as the cache), so this greedy decoder recomputes the forward over the whole
    sequence at every step: no KV cache to lose, at the cost of quadratic work, which the short continuations
    privbench asks for (PII prompts, self-prompting, ROUGE) can afford. Left-padded rows get the positions their
    tokens have alone (from 0, as the forward pass numbers them in scoring), so a batch gives each row its own
    continuation. Logits processors see every step's scores and stopping criteria end the loop, as in
    ``generate``; a row that has emitted EOS is continued with the pad token."""

    def __init__(self, peft_model: torch.nn.Module) -> None:
        super().__init__()
        self.peft_model = peft_model

    @property
    def generation_config(self):
        return self.peft_model.generation_config

    def forward(self, *args, **kwargs):
        return self.peft_model(*args, **kwargs)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
                 pad_token_id: int | None = None, logits_processor=None, stopping_criteria=None,
                 do_sample: bool = False) -> torch.Tensor:
        if do_sample:
            raise ConfigError("a prefix-tuned release decodes greedily only (do_sample=False)")
        eos = getattr(self.generation_config, "eos_token_id", None)
        eos = torch.tensor([] if eos is None else list(eos) if isinstance(eos, (list, tuple)) else [eos],
                           device=input_ids.device)
        pad = 0 if pad_token_id is None else int(pad_token_id)
        ids, mask = input_ids, attention_mask
        done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
        for _ in range(int(max_new_tokens)):
            positions = (mask.long().cumsum(-1) - 1).clamp(min=0)  # a token's position alone, as in scoring
            scores = self.peft_model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1]
            for processor in logits_processor or []:
                scores = processor(ids, scores)
            token = torch.where(done, torch.full_like(done, pad, dtype=torch.long), scores.argmax(-1))
            ids = torch.cat([ids, token[:, None]], 1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            done |= torch.isin(token, eos)
            for criterion in stopping_criteria or []:
                done |= criterion(ids, scores).to(done.device)
            if bool(done.all()):
                break
        return ids


@register_release("peft_prefix")
def load_prefix_release(directory: Path, meta: dict, *, device: torch.device, fingerprint: str, make_lm):
    """Base checkpoint + peft prefix adapter -> PeftModel (generating through :class:`PrefixGreedy`) -> the
    runner's HFLanguageModel (``make_lm``)."""
    from peft import PeftModel

    from bench.modeling import load_model

    base, tok = load_model(directory / meta.get("base", "base"), device=device)
    model = PeftModel.from_pretrained(base, str(directory / meta.get("adapter", "adapter"))).to(device).eval()
    return make_lm(PrefixGreedy(model).eval(), tok)


# ------------------------------------------------------------------------------------------ defense
@register_defense("dp_adapt")
class DPAdapt(Defense):
    description = ("DP-SGD adaptation (Opacus, Poisson sampling, per-record clipping, AdamW) of all weights, "
                   "the output head, LoRA adapters or a prefix (released as base + peft adapter), with "
                   "(epsilon, delta) accounted by RDP and PRV; unit: user, secret or text clips and samples whole "
                   "units (unit-level DP); epsilon: inf trains the same method without DP.")
    params = PARAMS
    #: 0.2.0: default delta 1/(2n) (was 1/n); the guarantee names its unit and adds the group-privacy bound
    #: 0.3.0: unit-level DP-SGD (``unit``: user, secret, text, auto); unit record trains as 0.2.0
    #: 0.3.1: unit-level norms without padding units to the largest (bk, vmap); unit record trains bit for bit as 0.3.0
    version = "0.3.1"
    #: other modules whose code decides the adapted artifact (part of ensure_adapted's cache key)
    code_modules = ("bench.accounting", "defenses.dp_bookkeeping", "defenses.dp_units")

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        if self.unit != "record" and self.grad_sample_mode == "ghost":
            raise ConfigError(f"dp_adapt: unit {self.unit!r} with grad_sample_mode ghost: Opacus' ghost clipping "
                              f"clips records inside its criterion, not units of several records; use "
                              f"grad_sample_mode hooks, functorch, vmap or bk")
        self._unit: str = "record"  # the unit the last adaptation clipped (auto resolved)
        self._ledger: DPLedger | None = None
        self._report: dict = {}
        self._group: tuple[int, str] | None = None  # (k, group_by) of the last adaptation's data

    @property
    def private(self) -> bool:
        return self.noise_multiplier is not None or math.isfinite(self.epsilon)

    def _train_kw(self, ctx: TrainContext, desc: str) -> dict:
        return dict(pad_id=ctx.pad_id, epsilon=self.epsilon, delta=self.delta, clip=self.clip, epochs=self.epochs,
                    lr=self.lr if self.lr is not None else DEFAULT_LR[self.method], batch_size=self.batch_size,
                    seed=ctx.seed, weight_decay=self.weight_decay, noise_multiplier=self.noise_multiplier,
                    accountant=self.accountant, grad_sample_mode=self.grad_sample_mode, device=ctx.device,
                    desc=desc, progress=ctx.progress)

    def adapt(self, model, data, ctx: TrainContext):
        seqs = ctx.encode(data.texts, self.chunk_length)
        kept = trained_records(seqs)  # the group sizes count only records that are trained on
        kept_users = [data.users[i] for i in kept] if data.users is not None else None
        kept_secrets = [data.secrets[i] for i in kept] if data.secrets is not None else None
        kept_texts = [data.texts[i] for i in kept]
        units, self._unit = privacy_units(data.texts, data.users, data.secrets, by=self.unit)
        if self._unit == "record":
            self._group = largest_group(kept_texts, users=kept_users, secrets=kept_secrets) if kept else None
        else:  # the records of one unit are clipped as one: its ε holds for all of them together
            sizes = Counter(units[i] for i in kept)
            self._group = (max(sizes.values()), f"records of one {self._unit}") if kept else None
        desc = f"adapt: dp_adapt {self.method} eps={self.epsilon}" + (f" per {self._unit}" if self._unit != "record"
                                                                       else "")
        train_kw = self._train_kw(ctx, desc)
        if self._unit != "record":
            train_kw.update(units=units, unit=self._unit)
        total = sum(p.numel() for p in model.parameters())
        if self.method == "full":
            for p in model.parameters():
                p.requires_grad_(True)
            trainable = total
            report = dp_train(model, seqs, **train_kw)
            out = model
        elif self.method == "head":
            head = model.get_output_embeddings()
            if head is None:
                raise ConfigError(f"{desc}: the model has no output embedding to fine-tune: use method full or lora")
            for p in model.parameters():
                p.requires_grad_(False)
            for p in head.parameters():
                p.requires_grad_(True)
            trainable = sum(p.numel() for p in head.parameters())
            try:
                report = dp_train(model, seqs, **train_kw)
            finally:
                for p in model.parameters():
                    p.requires_grad_(True)
            out = model
        elif self.method == "lora":
            from peft import LoraConfig, get_peft_model
            cfg = LoraConfig(r=self.r, lora_alpha=self.alpha, lora_dropout=0.0,
                             target_modules=list(self.target_modules), task_type="CAUSAL_LM", bias="none")
            peft_model = get_peft_model(model, cfg)
            trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
            report = dp_train(peft_model, seqs, **train_kw)
            out = peft_model.merge_and_unload()
            for p in out.parameters():
                p.requires_grad_(True)
        else:  # prefix: cannot merge, released as base + adapter (PrefixRelease)
            peft_model, report = train_prefix(model, seqs, prefix_length=self.prefix_length, **train_kw)
            trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
            peft_model.eval()
            out = PrefixRelease(peft_model, ctx.tokenizer)
        self._ledger = report.pop("_ledger")
        self._report = {"method": self.method, "train": report, "trainable_params": trainable,
                        "total_params": total, "ledger": report["ledger"]}
        return Adapted(out, self._report, self.guarantee())

    def guarantee(self) -> dict[str, Any] | None:
        """(ε, δ) per adaptation record (``unit: record``), and for the largest group of records that one
        user, secret or repeated text spans in the training data, the group-privacy bound (``group_*``): the
        record-level ε alone would understate what user-, secret- and repeated-canary games face.

        Unit-level DP (``unit`` user, secret or text): (ε, δ) per unit, with all its records (at most
        ``unit_records_max`` in the training data), and the group bound of two units (``group_k`` 2: a unit swapped
        for another, as a secret's neighbour replaces it)."""
        base = {"name": "epsilon", "method": self.method, "clip": self.clip, "unit": self._unit,
                "epsilon_target": self.epsilon if math.isfinite(self.epsilon) else "inf"}
        if self._ledger is None:
            if not self._report:
                return None  # nothing adapted yet
            return {**base, "value": math.inf, "delta": None, "accountant": None,
                    "note": "non-private run (epsilon: inf): no DP guarantee"}
        led = self._ledger
        out = {**base, **led.to_dict(), "value": led.epsilon, "delta": led.delta, "accountant": led.accountant}
        if math.isfinite(led.epsilon) and self._unit != "record":
            eps_2, delta_2 = group_privacy(led.epsilon, led.delta, 2)
            out.update(unit_records_max=self._group[0] if self._group else 0, group_k=2,
                       group_by=f"two {self._unit}s (a swap: one removed, one added)", group_epsilon=eps_2,
                       group_delta=delta_2)
        elif math.isfinite(led.epsilon) and self._group is not None:
            k, by = self._group
            eps_k, delta_k = group_privacy(led.epsilon, led.delta, k)
            out.update(group_k=k, group_by=by, group_epsilon=eps_k, group_delta=delta_k)
        return out


# ------------------------------------------------------------------------------------------ step cost
def step_cost_config(spec_name: str, vocab: int = 8192):
    """The random-init architecture ``measure_step_cost`` times for ``spec_name``: a GPT-NeoX of a built-in spec
    (untied embeddings, so book-keeping can clip every method), or SmolLM2-135M's Llama (tied, RMSNorm)."""
    from transformers import GPTNeoXConfig, LlamaConfig

    from bench.modeling import BUILTIN_SPECS

    if spec_name == SMOLLM2_ARCH:  # the realistic track's architecture, random weights (speed does not need them)
        return LlamaConfig(vocab_size=49152, hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                           num_key_value_heads=3, intermediate_size=1536, max_position_embeddings=2048,
                           rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True)
    spec = BUILTIN_SPECS[spec_name]
    return GPTNeoXConfig(vocab_size=vocab, hidden_size=spec.hidden_size, num_hidden_layers=spec.num_layers,
                         num_attention_heads=spec.num_heads, intermediate_size=4 * spec.hidden_size,
                         max_position_embeddings=spec.context_length, rotary_pct=0.25, use_parallel_residual=True,
                         tie_word_embeddings=False)


def step_cost_model(cfg, method: str, seed: int = 0) -> torch.nn.Module:
    """A model of ``cfg`` seeded with ``seed``, in training mode, trainable as ``method`` trains it (LoRA r 8 on
    the architecture's targets, a 32-token prefix, the output embedding alone, or all weights)."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, LlamaForCausalLM

    torch.manual_seed(seed)
    gpt_neox = isinstance(cfg, GPTNeoXConfig)
    m = (GPTNeoXForCausalLM if gpt_neox else LlamaForCausalLM)(cfg)
    if method == "head":
        for p in m.parameters():
            p.requires_grad_(False)
        m.get_output_embeddings().weight.requires_grad_(True)
    elif method == "lora":
        from peft import LoraConfig, get_peft_model
        targets = LORA_TARGETS if gpt_neox else ["q_proj", "k_proj", "v_proj", "o_proj"]
        m = get_peft_model(m, LoraConfig(r=8, lora_alpha=16, target_modules=targets, task_type="CAUSAL_LM"))
    elif method == "prefix":
        from peft import PrefixTuningConfig, get_peft_model
        m = get_peft_model(m, PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=32))
    return m.train()


def measure_step_cost(spec_name: str = "nano", *, batch: int = 16, length: int = 128, steps: int = 12,
                      modes: tuple[str, ...] | None = None, method: str = "full", vocab: int = 8192,
                      seed: int = 0, device: str | torch.device | None = None,
                      unit_sizes: Sequence[int] | None = None, autocast_bf16: bool = False) -> dict:
    """Seconds per optimizer step, non-private vs DP-SGD per ``modes``, on a random-init model of ``spec_name``.

    ``unit_sizes`` (records per unit, summing to ``batch``) times unit-level DP-SGD steps instead: each unit's
    gradient clipped as one (docs/dp.md, "Unit-level DP"); ghost clipping, which cannot clip units, is reported
    as an error then.

    Fixed batches of ``batch`` records of ``length`` tokens (no Poisson sampling, so every step does the
    same work). The configurations take turns step by step (so load from other jobs hits all alike);
    the first two rounds are warm-up. Reports the median CPU seconds (process time: robust to other jobs
    on a shared machine when torch runs one thread) and the median wall seconds of a step; on CUDA (the
    default when available) the wall time is taken between ``torch.cuda.synchronize()`` calls and is the one
    to read. A mode a method cannot use (vmap with prefix) is reported as ``<mode>_error``.

    ``modes`` defaults to every grad-sample mode and the bk layer schedule that ``bk`` does not use on this
    device (:data:`BK_SCHEDULES`: ``bk`` groups layers on CUDA only), so one run shows both.

    ``autocast_bf16`` runs the non-private and the book-keeping forward passes under bf16 autocast, as the
    non-private anchors train (book-keeping then takes its norms and clipped sums in fp32 from bf16 activations);
    the other modes are reported as errors. DP training itself stays fp32: docs/benchmarks.md, "bf16 autocast
    for DP-SGD", says why.
    """
    import statistics

    from opacus import PrivacyEngine

    from bench.modeling import BUILTIN_SPECS

    if method not in METHODS:
        raise ConfigError(f"measure_step_cost: unknown method {method!r}: use one of {', '.join(METHODS)}")
    for name, value, low in (("batch", batch, 1), ("length", length, 2), ("steps", steps, 3)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            why = " (the first two steps are warm-up)" if name == "steps" else ""
            raise ConfigError(f"measure_step_cost: {name} must be an integer >= {low}{why}, got {value!r}")
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = dev.type == "cuda"
    if modes is None:
        modes = (*GRAD_SAMPLE_MODES, "bk-per-layer" if cuda else "bk-grouped")
    bad = [m for m in modes if m not in STEP_COST_MODES]
    if bad:
        raise ConfigError(f"measure_step_cost: unknown modes {bad}: use {', '.join(STEP_COST_MODES)}")
    if spec_name not in BUILTIN_SPECS and spec_name != SMOLLM2_ARCH:
        raise ConfigError(f"measure_step_cost: unknown spec {spec_name!r}: use one of "
                          f"{', '.join([*BUILTIN_SPECS, SMOLLM2_ARCH])}")
    if unit_sizes is not None:
        unit_sizes = list(unit_sizes)
        if not unit_sizes or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in unit_sizes) \
                or sum(unit_sizes) != batch:
            raise ConfigError(f"measure_step_cost: unit_sizes must be positive integers summing to batch ({batch}), "
                              f"got {unit_sizes!r}")
    row_unit = None if unit_sizes is None else \
        torch.tensor([u for u, k in enumerate(unit_sizes) for _ in range(k)], device=dev)
    cfg = step_cost_config(spec_name, vocab)
    vocab = cfg.vocab_size
    g = torch.Generator().manual_seed(seed)
    data = [torch.randint(0, vocab, (batch, length), generator=g).to(dev) for _ in range(steps)]
    mask = torch.ones(batch, length, dtype=torch.long, device=dev)

    def build():
        return step_cost_model(cfg, method, seed).to(dev)

    runs: dict[str, tuple] = {}
    m = build()
    runs["nonprivate"] = (m, torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4), None, None)
    hooks_list, errors = [], {}
    for mode in modes:
        m = build()
        opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4)
        try:
            if mode == "ghost" and row_unit is not None:
                raise ConfigError("ghost clipping clips records, not units (dp_adapt refuses it with a unit)")
            if autocast_bf16 and mode not in ("bk", *BK_SCHEDULES):
                raise ConfigError("bf16 autocast is timed for book-keeping alone (Opacus' samplers would form bf16 "
                                  "per-record gradients)")
            if mode in ("vmap", "bk", *BK_SCHEDULES):
                if method == "prefix":
                    raise ConfigError(f"{mode} does not differentiate peft's prompt encoder")
                vg = _own_dp_step(mode, m, opt, noise_multiplier=1.0, max_grad_norm=0.1, expected_batch_size=batch,
                                  generator=None, **({"autocast_bf16": True} if autocast_bf16 else {}))
                runs[mode] = (m, vg, vg, None)
                continue
            loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(batch * 4, 1)),
                                                 batch_size=batch)
            made = PrivacyEngine().make_private(module=m, optimizer=opt, data_loader=loader, noise_multiplier=1.0,
                                                max_grad_norm=0.1, grad_sample_mode=mode, wrap_model=False,
                                                criterion=RecordLoss())
        except Exception as exc:  # record, do not hide, a mode that cannot be set up
            errors[mode] = f"{type(exc).__name__}: {exc}"
            continue
        crit = None
        if mode == "ghost":
            hooks, opt, crit, _ = made
            hooks_list.extend(_contiguous_embedding_inputs(m))
        else:
            hooks, opt, _ = made
        hooks_list.append(hooks)
        runs[mode] = (m, opt, None, crit)
    cpu: dict[str, list[float]] = {k: [] for k in runs}
    wall: dict[str, list[float]] = {k: [] for k in runs}
    for ids in data:
        for name, (m, opt, vg, crit) in runs.items():
            if name in errors:
                continue
            if cuda:
                torch.cuda.synchronize(dev)
            c0, w0 = time.process_time(), time.perf_counter()
            try:
                unit_level = row_unit is not None and name != "nonprivate"
                if vg is not None:
                    vg.backward(ids, mask) if row_unit is None else vg.backward(ids, mask, row_unit)
                elif crit is not None:
                    crit(m(input_ids=ids, attention_mask=mask).logits, ids, mask).backward()
                else:
                    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast_bf16):
                        losses = record_losses(m(input_ids=ids, attention_mask=mask).logits, ids, mask)
                    (losses * unit_weights(row_unit) if unit_level else losses).mean().backward()
                    if unit_level:  # as dp_train: Opacus then clips each unit's summed gradient
                        for p in m.parameters():
                            if getattr(p, "grad_sample", None) is not None:
                                p.grad_sample = sum_rows_by_unit(p.grad_sample, row_unit, len(unit_sizes))
                opt.step()
                opt.zero_grad(set_to_none=True)
                if cuda:
                    torch.cuda.synchronize(dev)
            except Exception as exc:  # record, do not hide, a mode that fails
                errors[name] = f"{type(exc).__name__}: {exc}"
                continue
            cpu[name].append(time.process_time() - c0)
            wall[name].append(time.perf_counter() - w0)
    for h in hooks_list:
        h.cleanup() if hasattr(h, "cleanup") else h.remove()
    out: dict[str, Any] = {"spec": spec_name, "method": method, "batch": batch, "length": length,
                           "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
                           "threads": torch.get_num_threads(), "steps_timed": steps - 2,
                           "units": None if unit_sizes is None else len(unit_sizes), "autocast_bf16": autocast_bf16}
    for name in ["nonprivate", *modes]:
        if name in errors:
            out[f"{name}_error"] = errors[name]
            continue
        out[f"{name}_cpu_s"] = round(statistics.median(cpu[name][2:]), 4)
        out[f"{name}_wall_s"] = round(statistics.median(wall[name][2:]), 4)
        if name != "nonprivate" and "nonprivate_error" not in out:
            out[f"{name}_ratio_cpu"] = round(out[f"{name}_cpu_s"] / out["nonprivate_cpu_s"], 3)
            out[f"{name}_ratio_wall"] = round(out[f"{name}_wall_s"] / out["nonprivate_wall_s"], 3)
    return out


def step_cost_table(results: list[dict]) -> str:
    """One line per method: non-private seconds per step and every mode's DP/non-DP ratio (process time on
    CPU, synchronized wall time on CUDA)."""
    if not results:
        return ""
    key = "wall" if results[0]["device"] != "cpu" else "cpu"
    modes = [m for m in STEP_COST_MODES if any(f"{m}_cpu_s" in r or f"{m}_error" in r for r in results)]
    lines = [f"{results[0]['spec']} on {results[0]['device']}, {results[0]['threads']} thread(s), batch "
             f"{results[0]['batch']} x {results[0]['length']} tokens"
             + (f" in {results[0]['units']} units (unit-level DP)" if results[0].get("units") else "")
             + (", bf16 autocast" if results[0].get("autocast_bf16") else "")
             + f", median of {results[0]['steps_timed']} steps "
             f"({'wall' if key == 'wall' else 'process'} time); ratio = DP step / non-private step"
             + ("; bk is bk-grouped on CUDA and bk-per-layer elsewhere" if set(modes) & set(BK_SCHEDULES) else ""),
             f"{'method':<8}{'nonprivate s':>14}" + "".join(f"{m:>13}" for m in modes)]
    for r in results:
        cells = [f"{r[f'{m}_ratio_{key}']:>12.2f}x" if f"{m}_ratio_{key}" in r else f"{'n/a':>13}" for m in modes]
        lines.append(f"{r['method']:<8}{r.get(f'nonprivate_{key}_s', float('nan')):>14.4f}" + "".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``PRIVBENCH_THREADS=1 python -m defenses.dp [SPEC] [METHOD|all] [--batch B] [--length T] [--steps S]
    [--modes M1,M2] [--bf16] [--json]``:
    the DP/non-DP step ratio of each grad-sample mode, in one run (docs/benchmarks.md, "DP-SGD step cost")."""
    import argparse
    import json
    import os
    import sys

    ap = argparse.ArgumentParser(prog="python -m defenses.dp",
                                 description="Seconds per DP-SGD step against a non-private step, per method and "
                                             "grad-sample mode, on a random-init model of SPEC.")
    ap.add_argument("spec", nargs="?", default="nano", help="a built-in model spec or smollm2-135m-arch (default nano)")
    ap.add_argument("method", nargs="?", default="full", help=f"one of {', '.join(METHODS)}, or all (default full)")
    ap.add_argument("--batch", type=int, default=16, help="records per step (default 16)")
    ap.add_argument("--length", type=int, default=128, help="tokens per record (default 128)")
    ap.add_argument("--steps", type=int, default=12, help="steps per configuration, the first two warm-up (default 12)")
    ap.add_argument("--units", default=None, metavar="K1,K2,...",
                    help="records per unit, summing to --batch: time unit-level DP-SGD steps (default: record level)")
    ap.add_argument("--modes", default=None, metavar="M1,M2,...",
                    help=f"the modes to time, of {', '.join(STEP_COST_MODES)} (default: every grad-sample mode and "
                         f"the bk layer schedule bk does not use on this device)")
    ap.add_argument("--bf16", action="store_true", help="the non-private and book-keeping steps under bf16 autocast, as "
                                                        "the non-private anchors train")
    ap.add_argument("--json", action="store_true", help="print the measurements as JSON instead of a table")
    args = ap.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("PRIVBENCH_THREADS", "1") or 1))
    try:
        chosen = list(METHODS) if args.method == "all" else [args.method]
        try:
            units = None if args.units is None else [int(k) for k in args.units.split(",")]
        except ValueError:
            raise ConfigError(f"--units must be comma-separated integers (records per unit), got {args.units!r}") \
                from None
        modes = None if args.modes is None else tuple(m.strip() for m in args.modes.split(",") if m.strip())
        results = [measure_step_cost(args.spec, method=m, batch=args.batch, length=args.length, steps=args.steps,
                                     unit_sizes=units, modes=modes, autocast_bf16=args.bf16) for m in chosen]
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(results if args.method == "all" else results[0], indent=1))
    else:
        print(step_cost_table(results))
        for r in results:
            for k, v in r.items():
                if k.endswith("_error"):
                    print(f"{r['method']} {k}: {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
