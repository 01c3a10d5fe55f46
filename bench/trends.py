"""Paper trends: does each paper's headline direction reproduce on the embedded models?

``privbench trends`` runs one bundled suite per claim (each an ordinary, cached, resumable run in the
results database, three seeds or more), reads its stored metrics and utility, and prints each claim with the
numbers that decide it and a verdict: ``yes``, ``NOT REPRODUCED`` or ``inconclusive`` (the claim could not be
tested: the undefended model did not leak, a private model learned nothing, or too few seeds). A direction that
does not reproduce at this scale is reported as such, with its numbers — never hidden.

The decision rules are stated next to each check and were fixed before the runs that report them; none has an
escape clause. They use the per-seed values of a run: a mean over seeds, its standard error (sd / √n), and for a
comparison the paired per-seed differences. "A clearly above B" means mean(A − B) ≥ the stated gap and
mean(A − B) − 2·SE > 0; "near chance" means |mean − 0.5| ≤ NEAR_CHANCE.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: AUC within this distance of 0.5 counts as "near chance"
NEAR_CHANCE = 0.06
#: a leak is "clearly above" another when its AUC is larger by at least this much (and by 2 SE)
CLEAR_GAP = 0.10
#: the undefended model must reach this adapt-game AUC (strongest attack) for a privacy claim to be testable
LEAK_PRECONDITION = 0.60
#: fewest seeds a verdict rests on
MIN_SEEDS = 3
#: next-token accuracies within this absolute distance count as "similar utility"
SIMILAR_ACCURACY = 0.02


@dataclass
class Stat:
    """Per-seed values of one quantity: mean, standard error, and paired differences."""

    values: np.ndarray

    @property
    def n(self) -> int:
        return int(len(self.values))

    @property
    def mean(self) -> float:
        return float(np.mean(self.values))

    @property
    def se(self) -> float:
        return float(np.std(self.values, ddof=1) / np.sqrt(self.n)) if self.n > 1 else float("inf")

    def __sub__(self, other: "Stat") -> "Stat":
        if self.n != other.n:
            raise ValueError(f"paired difference of {self.n} and {other.n} seeds")
        return Stat(self.values - other.values)

    def clearly_above(self, other: "Stat", gap: float) -> bool:
        d = self - other
        return d.mean >= gap and d.mean - 2.0 * d.se > 0.0

    def not_clearly_above(self, other: "Stat", margin: float = 0.0) -> bool:
        """No significant excess: mean(self − other) − 2 SE ≤ margin."""
        d = self - other
        return d.mean - 2.0 * d.se <= margin

    def near_chance(self) -> bool:
        return abs(self.mean - 0.5) <= NEAR_CHANCE

    def __str__(self) -> str:
        return f"{self.mean:.3f}±{self.se:.3f}" if np.isfinite(self.se) else f"{self.mean:.3f}"


@dataclass
class SuiteResults:
    """Stored rows of one complete suite run, indexed for the checks; every accessor returns per-seed values."""

    metrics: list[dict]
    utility: list[dict]
    guarantees: list[dict] = field(default_factory=list)

    @property
    def seeds(self) -> list[int]:
        return sorted({r["seed"] for r in self.metrics} | {r["seed"] for r in self.utility})

    def _per_seed(self, rows: list[dict], what: str) -> Stat:
        by_seed: dict[int, list[float]] = {}
        for r in rows:
            if r["value"] is not None:
                by_seed.setdefault(r["seed"], []).append(float(r["value"]))
        if not by_seed:
            raise KeyError(f"no {what}")
        return Stat(np.array([np.mean(by_seed[s]) for s in sorted(by_seed)]))

    def metric(self, defense: str, game: str, attack: str, metric: str = "auc", task: str | None = None) -> Stat:
        rows = [r for r in self.metrics if r["defense"] == defense and r["game"] == game and r["attack"] == attack
                and r["metric"] == metric and (task is None or r["task"] == task)]
        return self._per_seed(rows, f"{metric} for defense {defense}, game {game}, attack {attack}")

    def auc(self, defense: str, game: str, attack: str, task: str | None = None) -> Stat:
        return self.metric(defense, game, attack, "auc", task)

    def none_context(self, attacks: tuple[str, ...], game: str = "adapt") -> str:
        """The `none` anchor's AUCs in the same worlds, printed beside a rule's numbers (never part of a rule).

        θ′ = θ has expectation 0.5 in every game over b, but each seed's draw moves it, and every release that
        barely changes θ moves with it (docs/guard.md: 0.572 on Reference over seeds 0-2 of the dp/guard world,
        0.509 over seeds 3-9); `none` shows where this world's chance sits for these seeds. Empty when the run
        has no `none`."""
        try:
            stats = {a: self.auc("none", game, a) for a in attacks}
        except KeyError:
            return ""
        return "; none (θ′ = θ, this world's chance) " + ", ".join(f"{a} {stats[a]}" for a in attacks)

    def strongest(self, defense: str, game: str, attacks: tuple[str, ...], task: str | None = None
                  ) -> tuple[str, Stat]:
        """The attack with the highest mean AUC and its per-seed AUCs (a worst case over attacks: optimistic for
        the attacker, used for preconditions and for comparisons that apply it to both sides)."""
        stats = {a: self.auc(defense, game, a, task) for a in attacks}
        best = max(stats, key=lambda a: stats[a].mean)
        return best, stats[best]

    def utility_value(self, defense: str, metric: str, role: str = "adapted", dataset: str = "heldout") -> Stat:
        rows = [r for r in self.utility if r["defense"] == defense and r["role"] == role
                and r["dataset"] == dataset and r["metric"] == metric]
        return self._per_seed(rows, f"utility {metric} for defense {defense} ({role}, {dataset})")

    def retained(self, defense: str) -> Stat:
        return self.utility_value(defense, "utility_retained", dataset="retained")


@dataclass
class TrendResult:
    holds: bool | None          # None: inconclusive
    numbers: str
    why: str = ""


@dataclass(frozen=True)
class Trend:
    name: str
    paper: str
    claim: str
    suite: str | None                     # bundled suite whose run the check reads (None: a computation)
    check: Callable[[SuiteResults | None], TrendResult]


def _inconclusive(numbers: str, why: str) -> TrendResult:
    return TrendResult(None, numbers, why)


def _few_seeds(r: SuiteResults) -> TrendResult | None:
    if len(r.seeds) < MIN_SEEDS:
        return _inconclusive(f"{len(r.seeds)} seed(s)", f"fewer than {MIN_SEEDS} seeds")
    return None


# ------------------------------------------------------------------------------------------------ checks
MIA = ("loss", "min_k", "reference")


def check_dp(r: SuiteResults) -> TrendResult:
    """Marek et al. 2026: DP at small ε brings MIA AUC toward 0.5, ε = ∞ does not, and utility grows with ε.

    Rule (fixed before the run). Inconclusive unless (a) the ε = ∞ model leaks: strongest adapt-game AUC ≥
    LEAK_PRECONDITION, and (b) the ε = 8 model learned something: utility retained clearly above 0 (mean − 2 SE >
    0). Holds when, for each of loss, min_k and reference, the ε = 1 AUC is near chance and the ε = ∞ AUC is clearly
    above it (gap CLEAR_GAP), and utility retained is not clearly inverted: neither retained(ε = 1) clearly above
    retained(ε = 8) nor retained(ε = 8) clearly above retained(ε = ∞)."""
    few = _few_seeds(r)
    if few:
        return few
    small = {a: r.auc("dp-full-eps1", "adapt", a) for a in MIA}
    inf = {a: r.auc("dp-full-epsinf", "adapt", a) for a in MIA}
    ret = {e: r.retained(f"dp-full-eps{e}") for e in ("1", "8", "inf")}
    leak_attack, leak = r.strongest("dp-full-epsinf", "adapt", MIA)
    nums = ("adapt AUC ε=1 vs ε=∞ — " + "; ".join(f"{a}: {small[a]} vs {inf[a]}" for a in MIA) +
            r.none_context(MIA) +
            f"; utility retained ε=1 {ret['1']}, ε=8 {ret['8']}, ε=∞ {ret['inf']}; seeds {r.seeds}")
    if leak.mean < LEAK_PRECONDITION:
        return _inconclusive(nums, f"ε=∞ does not leak ({leak_attack} {leak} < {LEAK_PRECONDITION})")
    if not ret["8"].mean - 2 * ret["8"].se > 0:
        return _inconclusive(nums, f"DP at ε=8 learned nothing (utility retained {ret['8']})")
    holds = (all(small[a].near_chance() and inf[a].clearly_above(small[a], CLEAR_GAP) for a in MIA)
             and ret["1"].not_clearly_above(ret["8"]) and ret["8"].not_clearly_above(ret["inf"]))
    return TrendResult(holds, nums)


def check_dp_matched(r: SuiteResults) -> TrendResult:
    """DP's protection is not just its lost utility: at the same held-out utility, DP-SGD (ε = 8) leaks less than
    non-private fine-tuning shortened to that utility (``finetune-matched-eps8``: epochs matched to DP's validation
    loss in the same world).

    Rule (fixed before the run). Inconclusive unless the matched fine-tune leaks (strongest adapt AUC ≥
    LEAK_PRECONDITION) and DP at ε = 8 learned something (retained clearly above 0). Holds when the matched
    fine-tune's strongest-attack adapt AUC is clearly above DP ε = 8's strongest-attack AUC (gap 0.05)."""
    few = _few_seeds(r)
    if few:
        return few
    a_m, matched = r.strongest("finetune-matched-eps8", "adapt", MIA)
    a_d, dp = r.strongest("dp-full-eps8", "adapt", MIA)
    ret_d, ret_m = r.retained("dp-full-eps8"), r.retained("finetune-matched-eps8")
    nums = (f"strongest adapt AUC: matched fine-tune {matched} ({a_m}), DP ε=8 {dp} ({a_d}); utility retained "
            f"matched {ret_m}, DP {ret_d}; seeds {r.seeds}")
    if matched.mean < LEAK_PRECONDITION:
        return _inconclusive(nums, f"the matched fine-tune does not leak ({matched} < {LEAK_PRECONDITION})")
    if not ret_d.mean - 2 * ret_d.se > 0:
        return _inconclusive(nums, f"DP at ε=8 learned nothing (utility retained {ret_d})")
    return TrendResult(matched.clearly_above(dp, 0.05), nums)


GUARD_ATTACKS = ("loss", "min_k", "reference")


def check_guard(r: SuiteResults) -> TrendResult:
    """GUARD (anonymous preprint, under review): GUARD brings Loss / Min-K / Reference AUC near 0.5 at less utility cost than DP.

    Compared at matched utility: GUARD and KD are tuned (student learning rate, at the paper's 3 epochs) to the
    validation loss DP-LoRA (ε = 8) reaches in the same world. Rule (fixed before the run). Inconclusive unless the
    fine-tuned model leaks (strongest adapt AUC ≥ LEAK_PRECONDITION) and DP-LoRA learned something (retained clearly
    above 0), and inconclusive when a matched defense's grid did not bracket DP-LoRA's loss in some seed (stored
    ``target_bracketed`` = 0: not at matched utility). Holds when GUARD's AUC is near chance for all three attacks
    and its strongest-attack AUC is not clearly above DP-LoRA's (at the same utility it protects at least as well).
    No other clause."""
    few = _few_seeds(r)
    if few:
        return few
    g = {a: r.auc("guard", "adapt", a) for a in GUARD_ATTACKS}
    d = {a: r.auc("dp-lora-eps8", "adapt", a) for a in GUARD_ATTACKS}
    k = {a: r.auc("kd", "adapt", a) for a in GUARD_ATTACKS}
    _, ft = r.strongest("finetune", "adapt", GUARD_ATTACKS)
    _, g_max = r.strongest("guard", "adapt", GUARD_ATTACKS)
    _, d_max = r.strongest("dp-lora-eps8", "adapt", GUARD_ATTACKS)
    ret = {x: r.retained(x) for x in ("guard", "kd", "dp-lora-eps8")}
    nums = ("adapt AUC guard / KD / DP-LoRA ε=8 — " +
            "; ".join(f"{a}: {g[a]} / {k[a]} / {d[a]}" for a in GUARD_ATTACKS) + r.none_context(GUARD_ATTACKS) +
            f"; finetune strongest {ft}; utility retained guard {ret['guard']}, KD {ret['kd']}, DP-LoRA "
            f"{ret['dp-lora-eps8']}; seeds {r.seeds}")
    if ft.mean < LEAK_PRECONDITION:
        return _inconclusive(nums, f"the fine-tuned model does not leak ({ft} < {LEAK_PRECONDITION})")
    if not ret["dp-lora-eps8"].mean - 2 * ret["dp-lora-eps8"].se > 0:
        return _inconclusive(nums, f"DP-LoRA at ε=8 learned nothing (utility retained {ret['dp-lora-eps8']}): "
                                   f"matching to it compares models that did not adapt")
    unmatched = [x for x in ("guard", "kd") if _missed_target(r, x)]
    if unmatched:
        return _inconclusive(nums, f"{' and '.join(unmatched)} did not reach DP-LoRA's utility on its grid in every "
                                   f"seed (target not bracketed): not a comparison at matched utility")
    holds = all(g[a].near_chance() for a in GUARD_ATTACKS) and g_max.not_clearly_above(d_max)
    return TrendResult(holds, nums)


def _missed_target(r: SuiteResults, defense: str) -> bool:
    """Whether a matched defense's grid failed to bracket its target loss in some seed (runs stored before the
    ``target_bracketed`` row existed have none and are not judged by it)."""
    return any(u["defense"] == defense and u["dataset"] == "match" and u["metric"] == "target_bracketed"
               and u["value"] is not None and float(u["value"]) < 0.5 for u in r.utility)


def check_hush(_: SuiteResults | None) -> TrendResult:
    """Ganesh, McMahan, Nasr, Steinke and Thakurta 2025: Hush's LP preprocessing needs a smaller noise multiplier
    than no preprocessing (plain DP-SGD on all the data) for the same per-secret bounds; they report ≈ 8×.

    Computed, not trained: the sweep c = 2^k, k = -6 … 4, of their Figure 1a/1c (:func:`defenses.hush.paper_sweep`)
    on a world shaped like their section 5.1 (:func:`defenses.hush.paper_world`: 1 000 secrets, each in 50–100 of
    ≈ 17 000 examples, ≈ 4.4 secrets per example, p = 1e-10, r ~ U[2e-4, 1e-3]; B/n = 2048 / 1.7 M, T = 2000,
    their forward-KL accounting; c in units where c = 2^4 is the smallest constant that keeps every example).

    Rule (fixed before the run). Holds when the largest reduction σ(2^4) / σ(c) over c = 2^-6 … 2^3 is at least
    4, i.e. within a factor 2 of the paper's ≈ 8 at its best c. The paper sets no floor on the examples kept (its
    Figure 1b: the best c "discards many examples"), so none is part of the rule; the numbers give, per c, the
    share of examples with non-zero weight (Figure 1a's measure) and Σw / n, and the best reduction among the c
    that keep at least half of the examples."""
    from bench.registry import DEFENSES  # the core reaches plugin code through the registry only
    sweep = DEFENSES.get("hush").paper_comparison()
    rows = sweep["rows"]
    ref = next(r for r in rows if r["k"] == 4)
    pre = [r for r in rows if r["k"] < 4]
    best = max(pre, key=lambda r: r["reduction"])
    half = [r for r in pre if r["kept_nonzero"] >= 0.5]
    best_half = max(half, key=lambda r: r["reduction"]) if half else None
    table = "; ".join(f"2^{r['k']}: kept {r['kept_nonzero']:.2f} (Σw/n {r['kept_weight']:.2f}) σ {r['sigma']:.3g} "
                      f"{r['reduction']:.2f}×" for r in rows)
    at_half = (f"2^{best_half['k']}: {best_half['reduction']:.3f}× keeping {best_half['kept_nonzero']:.2f}"
               if best_half else "none keeps half")
    nums = (f"σ(2^4) / σ(c): best {best['reduction']:.2f}× at c = 2^{best['k']} keeping {best['kept_nonzero']:.2f} "
            f"of examples (paper ≈ 8×); best among c keeping ≥ half: {at_half}; no preprocessing σ {ref['sigma']:.3g} "
            f"— per c = 2^k (kept = share with w > 0): {table}; {sweep['n_secrets']} secrets, {sweep['n_examples']} "
            f"examples, {sweep['mean_secrets_per_example']:.2f} secrets per example, B {sweep['batch_size']:.3g}, "
            f"T {sweep['steps']}")
    return TrendResult(best["reduction"] >= 4.0, nums)


def check_iid_ood(r: SuiteResults) -> TrendResult:
    """Marek et al. 2026: the undefended model leaks more on IID data than on OOD data at equal training.

    Rule (fixed before the run). Inconclusive unless the IID model leaks (strongest adapt AUC ≥
    LEAK_PRECONDITION). Holds when for every attack the IID adapt-game AUC is clearly above the OOD one (gap 0.05:
    mean paired difference ≥ 0.05 and more than 2 SE above 0)."""
    few = _few_seeds(r)
    if few:
        return few
    tasks = sorted({m["task"] for m in r.metrics})
    iid = next(t for t in tasks if "iid" in t)
    ood = next(t for t in tasks if "ood" in t)
    attacks = sorted({m["attack"] for m in r.metrics})
    pairs = {a: (r.auc("finetune", "adapt", a, iid), r.auc("finetune", "adapt", a, ood)) for a in attacks}
    nums = "adapt AUC iid vs ood — " + "; ".join(f"{a}: {i} vs {o}" for a, (i, o) in pairs.items()) + \
        f"; seeds {r.seeds}"
    best = max(pairs.values(), key=lambda p: p[0].mean)[0]
    if best.mean < LEAK_PRECONDITION:
        return _inconclusive(nums, f"the IID model does not leak ({best} < {LEAK_PRECONDITION})")
    return TrendResult(all(i.clearly_above(o, 0.05) for i, o in pairs.values()), nums)


NAF = ("finetune", "cp_delta", "scp_delta_r_b", "scp_delta_r_c")


def check_naf(r: SuiteResults) -> TrendResult:
    """Segal, Shabtai and Elovici 2025 (SCP-Δr): SCP-Δr lowers canary exposure below CP-Δ and fine-tuning at similar next-token accuracy.

    Rule (fixed before the run). Inconclusive unless the fine-tuned model memorised its canaries: mean exposure of
    inserted canaries at least 2 bits above the never-inserted baseline (measured on the same game's (0, 0) units).
    Holds when both SCP-Δr variants' mean exposure of inserted canaries is clearly below CP-Δ's and fine-tuning's
    (gap 0.5 bits) and their held-out next-token accuracy is not clearly below fine-tuning's by more than
    SIMILAR_ACCURACY."""
    few = _few_seeds(r)
    if few:
        return few
    exp = {d: r.metric(d, "adapt", "exposure", "exposure_mean_pos") for d in NAF}
    base = r.metric("finetune", "adapt", "exposure", "exposure_mean_never")
    acc = {d: r.utility_value(d, "next_token_accuracy") for d in NAF}
    nums = ("mean exposure of inserted canaries (next-token accuracy) — " +
            "; ".join(f"{d}: {exp[d]} ({acc[d]})" for d in NAF) + f"; never-inserted baseline {base}; "
            f"seeds {r.seeds}")
    if not exp["finetune"].mean >= base.mean + 2.0:
        return _inconclusive(nums, "the fine-tuned model did not memorise its canaries (exposure < baseline + 2)")
    holds = all(exp[x].clearly_above(exp[s], 0.5) and acc["finetune"].not_clearly_above(acc[s], SIMILAR_ACCURACY)
                for s in ("scp_delta_r_b", "scp_delta_r_c") for x in ("cp_delta", "finetune"))
    return TrendResult(holds, nums)


def check_naf_pii(r: SuiteResults) -> TrendResult:
    """Segal, Shabtai and Elovici 2025 (SCP-Δr): SCP-Δr lowers PII extraction below CP-Δ and the undefended model.

    Rule (fixed before the run). Inconclusive unless the fine-tuned model extracts: member full-extraction rate
    (FER) of at least 0.05. Holds when both SCP-Δr variants' average extracted length (AEL) of member IDs is
    clearly below CP-Δ's and fine-tuning's (gap 0.5 digits) and their FER is not clearly above either."""
    few = _few_seeds(r)
    if few:
        return few
    ael = {d: r.metric(d, "adapt", "pii_extraction", "pii_ael_pos") for d in NAF}
    fer = {d: r.metric(d, "adapt", "pii_extraction", "pii_fer_pos") for d in NAF}
    acc = {d: r.utility_value(d, "next_token_accuracy") for d in NAF}
    nums = ("Names2IDs member AEL / FER (next-token accuracy) — " +
            "; ".join(f"{d}: {ael[d]} / {fer[d]} ({acc[d]})" for d in NAF) + f"; seeds {r.seeds}")
    if fer["finetune"].mean < 0.05:
        return _inconclusive(nums, f"the fine-tuned model extracts no ID in full (FER {fer['finetune']})")
    holds = all(ael[x].clearly_above(ael[s], 0.5) and fer[s].not_clearly_above(fer[x])
                for s in ("scp_delta_r_b", "scp_delta_r_c") for x in ("cp_delta", "finetune"))
    return TrendResult(holds, nums)


TRENDS: dict[str, Trend] = {t.name: t for t in (
    Trend("dp", "Marek et al. 2026", "DP at small ε brings MIA AUC toward 0.5; ε = ∞ does not; utility grows "
          "with ε", "dp", check_dp),
    Trend("dp_matched", "Marek et al. 2026", "at the same utility, DP (ε = 8) leaks less than a shortened "
          "non-private fine-tune", "dp", check_dp_matched),
    Trend("iid_ood", "Marek et al. 2026", "the undefended model leaks more on IID than on OOD data", "iid_ood",
          check_iid_ood),
    Trend("naf_canaries", "Segal, Shabtai, Elovici 2025", "SCP-Δr lowers canary exposure below CP-Δ and fine-tuning at "
          "similar next-token accuracy", "naf_canaries", check_naf),
    Trend("naf_pii", "Segal, Shabtai, Elovici 2025", "SCP-Δr lowers PII extraction below CP-Δ and fine-tuning", "naf",
          check_naf_pii),
    Trend("guard", "GUARD (anonymous, under review)", "GUARD: MIA AUC near 0.5, at matched utility no worse "
          "than DP-LoRA", "guard", check_guard),
    Trend("hush", "Ganesh et al. 2025", "Hush needs less noise than DP-SGD for the same per-secret bound", None,
          check_hush),
)}


def verdict(res: TrendResult) -> str:
    if res.holds is None:
        return f"inconclusive ({res.why})"
    return "yes" if res.holds else "NOT REPRODUCED"


def check_trend_names(names: list[str] | None) -> None:
    """Refuse unknown trend names, with the nearest known one."""
    import difflib

    from bench.errors import ConfigError
    for name in names or ():
        if name not in TRENDS:
            close = difflib.get_close_matches(name, list(TRENDS), n=1)
            raise ConfigError(f"unknown trend '{name}'" + (f": did you mean '{close[0]}'?" if close else "") +
                              f" (choose from {', '.join(TRENDS)})")


def run_trends(names: list[str] | None, *, store, cache, quiet: bool = False,
               run_suite: Callable[[str], int] | None = None) -> list[dict[str, Any]]:
    """Run (or reuse) each trend's suite, check its claim, and return one result row per trend."""
    chosen = list(TRENDS) if not names else names
    check_trend_names(chosen)
    out = []
    runs: dict[str, int] = {}
    for name in chosen:
        t = TRENDS[name]
        results = None
        if t.suite is not None:
            if t.suite not in runs:
                runs[t.suite] = run_suite(t.suite)
            run_id = runs[t.suite]
            results = SuiteResults(store.metric_rows(run_id), store.utility_rows(run_id),
                                   store.guarantee_rows(run_id))
        res = t.check(results)
        out.append({"trend": t.name, "paper": t.paper, "claim": t.claim, "suite": t.suite or "-",
                    "holds": verdict(res), "numbers": res.numbers})
    return out
