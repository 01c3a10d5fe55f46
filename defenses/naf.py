"""NAF defenses of Segal et al. 2025: CP-Δ, CP-ΔKL, CP-Fuse, CP-Δr, SCP-Δr-b and SCP-Δr-c.

Why: a fine-tuned model memorises its training records; a near-access-free (NAF) model stays close to k
constituent models fine-tuned on *disjoint* partitions of the data, so a record that only one constituent saw
cannot dominate the released distribution (Segal et al. §2.3, Def. 2.1). ``adapt`` fine-tunes k copies of θ with the
``finetune`` recipe on partitions split by content hash (a record repeated in the data lands in one partition,
as Segal et al. (§5.2) insert each canary's repeats "all in the same partition"); the release is an aggregating
:class:`~bench.lm.LanguageModel` whose next-token distribution at every position is the variant's combination
(:mod:`bench.aggregate`):

* ``cp_delta`` (Def. 2.2), ``cp_delta_kl`` (Vyas et al. 2023), ``cp_fuse`` (Abad et al. 2025),
  ``cp_delta_r`` (Def. 2.6), ``scp_delta_r_b`` (Algorithm 1 with θ as the base model b, m = 10) and
  ``scp_delta_r_c`` (Algorithm 1 with a constant base: θ's logits averaged over positions of 100 texts, §5.1).

Guarantee: :meth:`NAF.guarantee` reports the per-input bound k_x (Def. 2.1; Thm 2.3 / 2.7 for k = 2) of the
released distribution against its constituents (the smoothed ones for SCP-Δr, §4.1) at every next-token
position of (up to ``guarantee_texts`` of) the defense's own training texts, computed at adaptation time: those
are the inputs whose protection matters (they contain the records to protect) and the only data a defense sees;
value = the 99th percentile (Segal et al. Fig. 1(b), Table 4), with the mean, 95th percentile and max in the details.

Deviations: k_x is taken over next-token positions of the training texts rather than Segal et al.'s held-out
prompts; the constant base of SCP-Δr-c averages θ's logits over the defense's own training texts (Segal et al.
average over 100 held-out examples; a defense sees no other data; ``constant_base: uniform`` takes a uniform base
instead); CP-Fuse's history is the continuation after the prompt (the whole text when scored without a prefix).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench import aggregate as agg
from bench.defense import Adapted, Defense, TrainContext
from bench.errors import ConfigError, DataError
from bench.game import AdaptationData
from bench.hashing import content_hash, module_hash, text_hash
from bench.lm import (HFLanguageModel, LanguageModel, SignalCache, left_padded, right_padded,
                      signals_from_logprobs)
from bench.params import Param
from bench.registry import register_defense
from bench.release import Release, register_release
from bench.signals import TokenSignals
from defenses.finetune import ADAPT_PARAMS, FineTune

#: texts whose positions θ's logits are averaged over for SCP-Δr-c's constant base (Segal et al. 2025, §5.1)
CONSTANT_TEXTS = 100


# ----------------------------------------------------------------------------------------------- partition
def partition(texts: Sequence[str], k: int) -> list[tuple[str, ...]]:
    """k disjoint parts, a pure function of content: distinct texts sorted by hash, dealt round-robin, so equal
    texts (a repeated canary) share a part and parts differ in size by at most one distinct text."""
    distinct = sorted(set(texts), key=text_hash)
    if len(distinct) < k:
        raise DataError(f"naf: {len(distinct)} distinct training texts cannot fill k = {k} disjoint partitions: "
                        f"lower `k` or give more adaptation data")
    part_of = {t: i % k for i, t in enumerate(distinct)}
    parts: list[list[str]] = [[] for _ in range(k)]
    for t in texts:
        parts[part_of[t]].append(t)
    return [tuple(p) for p in parts]


# ----------------------------------------------------------------------------------------------- the model
class NAFLanguageModel(LanguageModel):
    """The released aggregate: every next-token distribution is the variant's combination of the constituents'.

    Each query runs all constituents (and θ for SCP-Δr-b) on the same batch, aggregates in fp32 log space and
    derives the same signals an :class:`HFLanguageModel` does; signals are cached under this model's fingerprint
    in the runner's signal cache, so a rerun costs no model pass.
    """

    def __init__(self, constituents: Sequence[HFLanguageModel], *, variant: str, m: int = 10,
                 base: HFLanguageModel | None = None, constant_logp: torch.Tensor | None = None,
                 fuse_grid: int = 10, fingerprint: str, cache: SignalCache | None = None,
                 exact_fingerprint: bool = False, min_log_prob: float | None = None) -> None:
        """``exact_fingerprint``: ``fingerprint`` already names the release and its scoring settings (the runner's
        bench.keys.scoring_fingerprint of the release's artifact key, which covers variant, m and code)."""
        if variant not in agg.VARIANTS:
            raise ConfigError(f"unknown NAF variant '{variant}': use one of {list(agg.VARIANTS)}")
        if len(constituents) < 2:
            raise ConfigError(f"a NAF release needs at least 2 constituents, got {len(constituents)}")
        if variant == "cp_fuse" and len(constituents) != 2:
            raise ConfigError("cp_fuse combines exactly 2 constituents: use k = 2")
        if variant == "scp_delta_r_b" and base is None:
            raise ConfigError("scp_delta_r_b needs the base model θ: pass base")
        if variant == "scp_delta_r_c" and constant_logp is None:
            raise ConfigError("scp_delta_r_c needs a constant base distribution: pass constant_logp")
        self.constituents = list(constituents)
        self.variant, self.m, self.fuse_grid = variant, int(m), int(fuse_grid)
        self.min_log_prob = None if min_log_prob is None else float(min_log_prob)
        self.base = base if variant == "scp_delta_r_b" else None
        self.constant_logp = constant_logp.float() if (variant == "scp_delta_r_c" and constant_logp is not None) \
            else None
        first = self.constituents[0]
        self.device, self.max_length, self.batch_size = first.device, first.max_length, first.batch_size
        self._tok = first.tokenizer
        self._cache = cache or SignalCache(None)
        floor = {} if self.min_log_prob is None else {"min_log_prob": self.min_log_prob}
        self.fingerprint = fingerprint if exact_fingerprint else content_hash({"naf": fingerprint, "variant": variant, "m": self.m, "grid": self.fuse_grid,
                                         "max_length": self.max_length, **floor,
                                         "code": module_hash("bench.lm", "bench.signals", "bench.aggregate",
                                                             "defenses.naf")})

    # -- the per-position distributions ---------------------------------------------------------
    def _models(self) -> list[torch.nn.Module]:
        models = [c._model for c in self.constituents]  # HFLanguageModel keeps its module in `_model`
        return models + ([self.base._model] if self.base is not None else [])

    @torch.no_grad()
    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor | None = None
                 ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """fp32 log-probs (B, T, V) of every constituent, and of the base (θ, or the constant) if any."""
        out = []
        for model in self._models():
            kw = {"position_ids": pos} if pos is not None else {}
            logits = model(input_ids=ids, attention_mask=mask, **kw).logits
            out.append(agg.floor_log_probs(torch.log_softmax(logits.float(), dim=-1), self.min_log_prob))
        if self.base is not None:
            return out[:-1], out[-1]
        if self.constant_logp is not None:
            return out, agg.floor_log_probs(self.constant_logp.to(ids.device), self.min_log_prob)
        return out, None

    def combine(self, logps: Sequence[torch.Tensor], log_base: torch.Tensor | None, tokens: torch.Tensor | None = None,
                start: torch.Tensor | None = None, history: torch.Tensor | None = None) -> torch.Tensor:
        """The released log-distribution from the constituents' (and base's) log-probs at the same positions.

        CP-Fuse needs the continuation: teacher-forced ``tokens`` (B, T) with the continuation from ``start``,
        or, for one position, the running ``history`` (B, 2). ``min_log_prob`` floors the rule's inputs (in
        :meth:`_forward`), not its output: the release is exactly the rule's combination, so k_x is the
        divergence the paper's theorems bound (docs/naf.md, "How the floor is met")."""
        if self.variant != "cp_fuse":
            out = agg.aggregate(self.variant, logps, log_base=log_base, m=self.m)
        elif tokens is not None:
            out = agg.cp_fuse_sequence(logps[0], logps[1], tokens, start, self.fuse_grid)
        else:
            hist = history if history is not None else torch.zeros(logps[0].shape[0], 2, device=logps[0].device)
            out = agg.fuse_step(logps[0], logps[1], hist, self.fuse_grid)[0]
        return out

    # -- signals --------------------------------------------------------------------------------
    def split_at_token(self, text: str, n_tokens: int) -> tuple[str, str]:
        return self.constituents[0].split_at_token(text, n_tokens)

    def token_signals(self, texts: Sequence[str], prefix: str | None = None) -> list[TokenSignals]:
        keys = [text_hash(t) if prefix is None else text_hash(f"{text_hash(prefix)}\x1f{t}") for t in texts]
        have = self._cache.lookup(self.fingerprint, keys)
        todo = {k: t for k, t in zip(keys, texts) if k not in have}
        if todo:
            computed = self._compute(list(todo), list(todo.values()), prefix, want="signals")
            self._cache.add(self.fingerprint, computed)
            have.update(computed)
        return [have[k] for k in keys]

    def naf_bounds(self, texts: Sequence[str]) -> np.ndarray:
        """k_x (Def. 2.1) at every next-token position of ``texts`` (concatenated), float64."""
        parts = self._compute([str(i) for i in range(len(texts))], list(texts), None, want="bounds")
        return np.concatenate([parts[str(i)] for i in range(len(texts))]) if texts else np.zeros(0)

    def _encode(self, texts: list[str], prefix: str | None) -> tuple[list[list[int]], list[int]]:
        first = self.constituents[0]
        if prefix is None:
            return [first.encode(t) for t in texts], [1] * len(texts)
        pairs = [first.encode_with_prefix(prefix, t) for t in texts]
        return [e for e, _ in pairs], [s for _, s in pairs]

    @torch.no_grad()
    def _compute(self, keys: list[str], texts: list[str], prefix: str | None, want: str) -> dict[str, Any]:
        encoded, starts = self._encode(texts, prefix)
        order = sorted(range(len(texts)), key=lambda i: -len(encoded[i]))
        pad = self._tok.pad_token_id if self._tok.pad_token_id is not None else 0
        out: dict[str, Any] = {}
        for b0 in range(0, len(order), self.batch_size):
            batch = order[b0:b0 + self.batch_size]
            ids, mask = right_padded([encoded[i] for i in batch], pad, self.device)
            logps, log_base = self._forward(ids, mask)
            logps = [lp[:, :-1] for lp in logps]
            if log_base is not None and log_base.dim() == 3:
                log_base = log_base[:, :-1]
            tgt = ids[:, 1:]
            # position j predicts token j + 1: the continuation (CP-Fuse's history) starts at the text's first token
            start = torch.tensor([starts[i] - 1 for i in batch], device=self.device)
            logp = self.combine(logps, log_base, tokens=tgt, start=start)
            if want == "bounds":
                kx = agg.naf_bound(self.variant, logp, logps, log_base=log_base, m=self.m)
                for r, i in enumerate(batch):
                    out[keys[i]] = kx[r, max(starts[i] - 1, 0): len(encoded[i]) - 1].double().cpu().numpy()
                continue
            spans = [slice(max(starts[i] - 1, 0), len(encoded[i]) - 1) for i in batch]
            for i, sig in zip(batch, signals_from_logprobs(logp, tgt, spans)):
                out[keys[i]] = sig
        return out

    # -- next token and generation ----------------------------------------------------------------
    def _left_padded(self, seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return left_padded(seqs, self._tok.pad_token_id if self._tok.pad_token_id is not None else 0, self.device)

    @torch.no_grad()
    def _next(self, seqs: list[list[int]], history: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        ids, mask, pos = self._left_padded(seqs)
        logps, log_base = self._forward(ids, mask, pos)
        last = [lp[:, -1] for lp in logps]
        if log_base is not None and log_base.dim() == 3:
            log_base = log_base[:, -1]
        return self.combine(last, log_base, history=history), last

    def next_token_logprobs(self, prefixes: Sequence[str]) -> np.ndarray:
        rows = []
        enc = self.constituents[0].encode
        for s in range(0, len(prefixes), self.batch_size):
            logr, _ = self._next([enc(p) for p in prefixes[s:s + self.batch_size]])
            rows.append(logr.cpu().numpy())
        return np.concatenate(rows) if rows else np.zeros((0, 0), np.float32)

    @torch.no_grad()
    def generate(self, prompts: Sequence[str], max_new_tokens: int) -> list[str]:
        """Greedy decoding from the aggregated distribution, stopping a row at EOS (as HF ``generate`` does)."""
        eos = self._tok.eos_token_id
        enc = self.constituents[0].encode
        outs: list[str] = []
        for s in range(0, len(prompts), self.batch_size):
            seqs = [enc(p) for p in prompts[s:s + self.batch_size]]
            new: list[list[int]] = [[] for _ in seqs]
            done = [False] * len(seqs)
            hist = torch.zeros(len(seqs), 2, device=self.device)
            for _ in range(int(max_new_tokens)):
                logr, last = self._next([a + b for a, b in zip(seqs, new)], hist)
                nxt = logr.argmax(-1)
                if self.variant == "cp_fuse":
                    hist = hist - torch.cat([lp.gather(-1, nxt[:, None]) for lp in last], dim=-1)
                for r, t in enumerate(nxt.tolist()):
                    if not done[r]:
                        new[r].append(t)
                        done[r] = eos is not None and t == eos
                if all(done):
                    break
            outs.extend(self._tok.decode(n, skip_special_tokens=True) for n in new)
        return outs


# ----------------------------------------------------------------------------------------------- release
class NAFRelease(Release):
    """The constituents (and θ for SCP-Δr-b, or the constant base for -c) as files, plus the rule's settings."""

    kind = "naf"

    def __init__(self, constituents: list[torch.nn.Module], tokenizer, *, meta: dict[str, Any],
                 base: torch.nn.Module | None = None, constant_logp: torch.Tensor | None = None) -> None:
        self.constituents, self.tokenizer, self.meta = constituents, tokenizer, meta
        self.base, self.constant_logp = base, constant_logp

    def save(self, directory: Path) -> dict[str, Any]:
        directory = Path(directory)
        for i, model in enumerate(self.constituents):
            model.save_pretrained(directory / f"constituent_{i}")
            self.tokenizer.save_pretrained(directory / f"constituent_{i}")
        if self.base is not None:
            self.base.save_pretrained(directory / "base")
            self.tokenizer.save_pretrained(directory / "base")
        if self.constant_logp is not None:
            np.save(directory / "constant_logp.npy", self.constant_logp.cpu().numpy().astype(np.float32))
        return {**self.meta, "k": len(self.constituents), "has_base": self.base is not None}


@register_release("naf")
def load_naf(directory: Path, meta: dict, *, device: torch.device, fingerprint: str, make_lm) -> NAFLanguageModel:
    """Rebuild the aggregate: each constituent (and θ) as an HFLanguageModel with the runner's settings."""
    from bench.modeling import load_model

    def lm(sub: str) -> HFLanguageModel:
        model, tok = load_model(directory / sub, device=device)
        return make_lm(model, tok, suffix=sub)

    constituents = [lm(f"constituent_{i}") for i in range(int(meta["k"]))]
    base = lm("base") if meta.get("has_base") else None
    const = directory / "constant_logp.npy"
    constant = torch.from_numpy(np.load(const)) if const.is_file() else None
    return NAFLanguageModel(constituents, variant=meta["variant"], m=int(meta["m"]), base=base,
                            constant_logp=constant, fuse_grid=int(meta.get("fuse_grid", 10)),
                            fingerprint=fingerprint, cache=getattr(constituents[0], "_cache", None),
                            exact_fingerprint=True, min_log_prob=meta.get("min_log_prob"))


# ----------------------------------------------------------------------------------------------- defense
@torch.no_grad()
def mean_logits_logp(model: torch.nn.Module, ctx: TrainContext, texts: Sequence[str], batch_size: int = 16
                     ) -> torch.Tensor:
    """log-softmax of θ's logits averaged over every position of ``texts`` (SCP-Δr-c's constant base,
    Segal et al. 2025, §5.1)."""
    seqs = ctx.encode(list(texts))
    total, count = None, 0
    for s in range(0, len(seqs), batch_size):
        chunk = seqs[s:s + batch_size]
        width = max(len(c) for c in chunk)
        ids = torch.full((len(chunk), width), ctx.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, c in enumerate(chunk):
            ids[r, : len(c)] = torch.tensor(c)
            mask[r, : len(c)] = 1
        logits = model(input_ids=ids.to(ctx.device), attention_mask=mask.to(ctx.device)).logits.float()
        m = mask.to(ctx.device).unsqueeze(-1).float()
        part = (logits * m).sum((0, 1))
        total = part if total is None else total + part
        count += int(mask.sum())
    return torch.log_softmax(total / max(count, 1), dim=-1).cpu()


@register_defense("naf")
class NAF(Defense):
    description = ("NAF aggregation (Segal et al. 2025): k constituents fine-tuned on disjoint partitions, released as "
                   "their token-level combination (CP-Δ, CP-ΔKL, CP-Fuse, CP-Δr, SCP-Δr-b/-c); reports k_x.")
    version = "0.2.0"  # 0.2.0: the paper's e^-20 floor on the rule's inputs by default (0.1.0: no floor)
    code_modules = ("bench.aggregate",)
    params = ADAPT_PARAMS + (
        Param("variant", str, "scp_delta_r_b", "aggregation rule", choices=agg.VARIANTS),
        Param("k", int, 2, "constituent models, each on its own disjoint partition (Segal et al. 2025: 2)", low=2),
        Param("m", int, 10, "SCP-Δr smoothing: tokens that keep their own relative probability "
              "(Segal et al. 2025: 10)", low=1),
        Param("constant_base", str, "mean_logits", "SCP-Δr-c base: θ's logits averaged over 100 texts, or uniform",
              choices=("mean_logits", "uniform")),
        Param("fuse_grid", int, 10, "CP-Fuse grid points on [0, 2) per exponent (then 2..10)", low=2),
        Param("guarantee_texts", int, 256, "training texts k_x is computed on (0: no guarantee)", low=0),
        Param("min_log_prob", float, -20.0, "floor on every log-probability of the constituents and the base, the "
              "rule's inputs (Segal et al. 2025: -20); null = none, as naf 0.1.0", nullable=True),
    )

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        if self.variant == "cp_fuse" and self.k != 2:
            raise ConfigError(f"defense 'naf': variant cp_fuse combines exactly 2 models, got k = {self.k}: "
                              f"set k: 2 or pick another variant")
        self._guarantee: dict[str, Any] | None = None

    def adapt(self, model, data: AdaptationData, ctx: TrainContext):
        vocab = model.get_output_embeddings().weight.shape[0]
        if self.variant.startswith("scp") and self.m >= vocab:
            raise ConfigError(f"defense 'naf': m = {self.m} must be below the vocabulary size {vocab}: lower `m`")
        if self.min_log_prob is not None and self.min_log_prob >= -math.log(vocab):
            raise ConfigError(f"defense 'naf': min_log_prob = {self.min_log_prob} must be below -log V = "
                              f"{-math.log(vocab):.3f} for the vocabulary of {vocab}: lower it (Segal et al.: -20)")
        parts = partition(data.texts, self.k)
        trainer = FineTune(**{p.name: getattr(self, p.name) for p in ADAPT_PARAMS})
        constituents, reports = [], []
        for i, part in enumerate(parts):
            sub = dataclasses.replace(ctx, seed=ctx.seed * 1000 + i)
            m_i = trainer.adapt(copy.deepcopy(model), AdaptationData(part), sub)
            constituents.append(m_i.model.eval())
            reports.append({"n_texts": len(part), **m_i.report})
        base = constant = None
        if self.variant == "scp_delta_r_b":
            base = model.eval()
        elif self.variant == "scp_delta_r_c":
            constant = (torch.full((vocab,), -float(np.log(vocab))) if self.constant_base == "uniform" else
                        mean_logits_logp(model.eval(), ctx, sorted(set(data.texts), key=text_hash)[:CONSTANT_TEXTS]))
        meta = {"variant": self.variant, "m": self.m, "fuse_grid": self.fuse_grid,
                "partition_sizes": [len(p) for p in parts]}
        if self.min_log_prob is not None:  # absent when off: the releases stored without a floor keep their meta
            meta["min_log_prob"] = self.min_log_prob
        self._report = {"constituents": reports, "train": {
            "seconds": sum(r["train"]["seconds"] for r in reports), "steps": sum(r["train"]["steps"] for r in reports),
            "tokens": sum(r["train"]["tokens"] for r in reports),
            "final_loss": float(np.mean([r["train"]["final_loss"] for r in reports]))}}
        self._guarantee = self._bound(constituents, base, constant, ctx, data.texts) if self.guarantee_texts else None
        return Adapted(NAFRelease(constituents, ctx.tokenizer, meta=meta, base=base, constant_logp=constant),
                       self._report, self._guarantee)

    def _bound(self, constituents, base, constant, ctx: TrainContext, texts: Sequence[str]) -> dict[str, Any]:
        def hf(m: torch.nn.Module, name: str) -> HFLanguageModel:
            return HFLanguageModel(m, ctx.tokenizer, fingerprint=name, max_length=ctx.max_length, batch_size=8,
                                  device=ctx.device)

        lm = NAFLanguageModel([hf(c, f"c{i}") for i, c in enumerate(constituents)], variant=self.variant, m=self.m,
                              base=hf(base, "base") if base is not None else None, constant_logp=constant,
                              fuse_grid=self.fuse_grid, fingerprint="guarantee", min_log_prob=self.min_log_prob)
        chosen = sorted(set(texts), key=text_hash)[: self.guarantee_texts]
        kx = lm.naf_bounds(chosen)
        return {"name": f"naf_k_x_{agg.DIVERGENCE[self.variant]}", "value": float(np.percentile(kx, 99)),
                "variant": self.variant, "divergence": agg.DIVERGENCE[self.variant], "k": self.k,
                "m": self.m if self.variant.startswith("scp") else None,
                **({} if self.min_log_prob is None else {"min_log_prob": self.min_log_prob}),
                "mean": float(kx.mean()), "p95": float(np.percentile(kx, 95)), "p99": float(np.percentile(kx, 99)),
                "max": float(kx.max()), "n_positions": int(kx.size), "n_texts": len(chosen),
                "inputs": "every next-token position of the defense's own training texts (distinct, by hash order)"}

    def guarantee(self) -> dict[str, Any] | None:
        return self._guarantee
