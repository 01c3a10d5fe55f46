"""Paper trends: does each source paper's headline direction reproduce on the embedded models?

``privbench trends`` runs one bundled suite per claim (each an ordinary, cached, resumable run in the
results database), reads its stored metrics and utility, and prints each claim with the numbers that
decide it and whether it holds. A direction that does not reproduce at this scale is reported as such,
with its numbers — never hidden. The decision rules are stated next to each check, fixed before the run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: AUC within this distance of 0.5 counts as "near chance"
NEAR_CHANCE = 0.06
#: a leak is "clearly above" another when its AUC is larger by at least this much
CLEAR_GAP = 0.10


@dataclass
class SuiteResults:
    """Stored rows of one complete suite run, indexed for the checks."""

    metrics: list[dict]
    utility: list[dict]
    guarantees: list[dict] = field(default_factory=list)

    def auc(self, defense: str, game: str, attack: str) -> float:
        vals = [r["value"] for r in self.metrics if r["defense"] == defense and r["game"] == game
                and r["attack"] == attack and r["metric"] == "auc"]
        if not vals:
            raise KeyError(f"no AUC for defense {defense}, game {game}, attack {attack}")
        return float(np.mean(vals))

    def metric(self, defense: str, game: str, attack: str, metric: str) -> float:
        vals = [r["value"] for r in self.metrics if r["defense"] == defense and r["game"] == game
                and r["attack"] == attack and r["metric"] == metric and r["value"] is not None]
        if not vals:
            raise KeyError(f"no {metric} for defense {defense}, game {game}, attack {attack}")
        return float(np.mean(vals))

    def utility_value(self, defense: str, metric: str, role: str = "adapted", dataset: str = "heldout") -> float:
        vals = [r["value"] for r in self.utility if r["defense"] == defense and r["role"] == role
                and r["dataset"] == dataset and r["metric"] == metric]
        if not vals:
            raise KeyError(f"no utility {metric} for defense {defense} ({role}, {dataset})")
        return float(np.mean(vals))

    def base_loss(self) -> float:
        vals = [r["value"] for r in self.utility if r["role"] == "pretrained" and r["defense"] == "-"
                and r["dataset"] == "heldout" and r["metric"] == "loss"]
        return float(np.mean(vals))


@dataclass
class TrendResult:
    holds: bool
    numbers: str


@dataclass(frozen=True)
class Trend:
    name: str
    paper: str
    claim: str
    suite: str | None                     # bundled suite whose run the check reads (None: a computation)
    check: Callable[[SuiteResults | None], TrendResult]


# ------------------------------------------------------------------------------------------------ checks
def _fmt(x: float) -> str:
    return f"{x:.3f}"


def check_dp(r: SuiteResults) -> TrendResult:
    """004: DP at small ε brings MIA AUC toward 0.5 while ε = ∞ does not.

    Holds when every attack's adapt-game AUC at ε = 1 is within NEAR_CHANCE of 0.5 and ε = ∞ (same method and
    batches, no clipping or noise) is at least CLEAR_GAP above it for every attack."""
    attacks = ("loss", "min_k", "reference")
    small = {a: r.auc("dp-full-eps1", "adapt", a) for a in attacks}
    inf = {a: r.auc("dp-full-epsinf", "adapt", a) for a in attacks}
    holds = all(abs(small[a] - 0.5) <= NEAR_CHANCE and inf[a] >= small[a] + CLEAR_GAP for a in attacks)
    nums = "; ".join(f"{a}: ε=1 {_fmt(small[a])} vs ε=∞ {_fmt(inf[a])}" for a in attacks)
    return TrendResult(holds, f"adapt-game AUC — {nums}")


def check_guard(r: SuiteResults) -> TrendResult:
    """003: GUARD brings Loss / Min-K / Reference AUC near 0.5 with a smaller utility loss than DP at that AUC.

    Holds when GUARD's AUC is within NEAR_CHANCE of 0.5 for all three attacks and its held-out loss rises above
    θ's by less than DP-LoRA's (ε = 8) does, or DP-LoRA does not reach chance."""
    attacks = ("loss", "min_k", "reference")
    g = {a: r.auc("guard", "adapt", a) for a in attacks}
    d = {a: r.auc("dp-lora-eps8", "adapt", a) for a in attacks}
    f = {a: r.auc("finetune", "adapt", a) for a in attacks}
    base = r.base_loss()
    cost_g = r.utility_value("guard", "loss") - base
    cost_d = r.utility_value("dp-lora-eps8", "loss") - base
    near = all(abs(g[a] - 0.5) <= NEAR_CHANCE for a in attacks)
    dp_near = all(abs(d[a] - 0.5) <= NEAR_CHANCE for a in attacks)
    holds = near and (cost_g < cost_d or not dp_near)
    nums = "; ".join(f"{a}: finetune {_fmt(f[a])}, guard {_fmt(g[a])}, DP-LoRA ε=8 {_fmt(d[a])}" for a in attacks)
    return TrendResult(holds, f"adapt-game AUC — {nums}; held-out loss change vs θ: guard {cost_g:+.3f}, "
                              f"DP-LoRA {cost_d:+.3f}")


def check_hush(_: SuiteResults | None) -> TrendResult:
    """001: Hush needs a smaller noise multiplier than DP-SGD on the whole data for the same per-secret bound.

    Computed on 001's section 5.1 configuration (Zipf-distributed secret counts, p = 1e-10, r ~ U[2e-4, 1e-3]);
    holds when Hush's σ is smaller."""
    from bench.secret_accounting import compare_with_dpsgd
    from defenses.hush import paper_world
    secrets, targets = paper_world()
    out = compare_with_dpsgd(secrets, targets, batch_size=64, steps=1000)
    s_h, s_d = float(out["hush_sigma"]), float(out["dpsgd_sigma"])
    return TrendResult(s_h < s_d, f"σ Hush {s_h:.2f} vs DP-SGD {s_d:.2f} ({s_d / s_h:.1f}×) for the same "
                                  f"per-secret bounds; {len(targets)} secrets, batch 64, 1000 steps")


def check_iid_ood(r: SuiteResults) -> TrendResult:
    """004: the undefended model leaks more on IID data than on OOD data at equal training.

    Holds when every attack's adapt-game AUC on the iid task exceeds its AUC on the ood task."""
    tasks = sorted({m["task"] for m in r.metrics})
    iid = next(t for t in tasks if "iid" in t)
    ood = next(t for t in tasks if "ood" in t)
    attacks = sorted({m["attack"] for m in r.metrics})

    def auc(task, a):
        return float(np.mean([m["value"] for m in r.metrics if m["task"] == task and m["game"] == "adapt"
                              and m["attack"] == a and m["metric"] == "auc" and m["defense"] == "finetune"]))
    pairs = {a: (auc(iid, a), auc(ood, a)) for a in attacks}
    holds = all(i > o for i, o in pairs.values())
    return TrendResult(holds, "adapt-game AUC iid vs ood — " +
                       "; ".join(f"{a}: {_fmt(i)} vs {_fmt(o)}" for a, (i, o) in pairs.items()))


#: next-token accuracies within this absolute distance count as "similar utility"
SIMILAR_ACCURACY = 0.02


def check_naf(r: SuiteResults) -> TrendResult:
    """000: SCP-Δr lowers canary exposure below CP-Δ and the undefended model at similar next-token accuracy.

    Holds when both SCP-Δr variants' mean exposure of inserted canaries is below CP-Δ's and fine-tuning's, and
    their held-out next-token accuracy is no more than SIMILAR_ACCURACY below fine-tuning's."""
    labels = ("finetune", "cp_delta", "scp_delta_r_b", "scp_delta_r_c")
    exp = {d: r.metric(d, "adapt", "exposure", "exposure_mean_pos") for d in labels}
    acc = {d: r.utility_value(d, "next_token_accuracy") for d in labels}
    holds = all(exp[s] < exp["cp_delta"] and exp[s] < exp["finetune"]
                and acc[s] >= acc["finetune"] - SIMILAR_ACCURACY for s in ("scp_delta_r_b", "scp_delta_r_c"))
    return TrendResult(holds, "mean exposure of inserted canaries (next-token accuracy) — " +
                       "; ".join(f"{d}: {exp[d]:.2f} ({acc[d]:.3f})" for d in labels) +
                       " ; baseline for a never-inserted canary 1.44")


def check_naf_pii(r: SuiteResults) -> TrendResult:
    """000: SCP-Δr lowers PII extraction below CP-Δ and the undefended model.

    Holds when both SCP-Δr variants' average extracted length of member IDs is below CP-Δ's and fine-tuning's
    and their full extraction rate is not above either."""
    labels = ("finetune", "cp_delta", "scp_delta_r_b", "scp_delta_r_c")
    ael = {d: r.metric(d, "adapt", "pii_extraction", "pii_ael_pos") for d in labels}
    fer = {d: r.metric(d, "adapt", "pii_extraction", "pii_fer_pos") for d in labels}
    acc = {d: r.utility_value(d, "next_token_accuracy") for d in labels}
    holds = all(ael[s] < ael["cp_delta"] and ael[s] < ael["finetune"] and fer[s] <= min(fer["cp_delta"],
                fer["finetune"]) for s in ("scp_delta_r_b", "scp_delta_r_c"))
    return TrendResult(holds, "Names2IDs member AEL / FER (next-token accuracy) — " +
                       "; ".join(f"{d}: {ael[d]:.2f} / {fer[d]:.2f} ({acc[d]:.3f})" for d in labels))


TRENDS: dict[str, Trend] = {t.name: t for t in (
    Trend("dp", "004", "DP at small ε brings MIA AUC toward 0.5; ε = ∞ does not", "dp", check_dp),
    Trend("iid_ood", "004", "the undefended model leaks more on IID than on OOD data", "iid_ood", check_iid_ood),
    Trend("naf_canaries", "000", "SCP-Δr lowers canary exposure below CP-Δ and fine-tuning at similar "
          "next-token accuracy", "naf_canaries", check_naf),
    Trend("naf_pii", "000", "SCP-Δr lowers PII extraction below CP-Δ and fine-tuning", "naf", check_naf_pii),
    Trend("guard", "003", "GUARD: MIA AUC near 0.5 at a smaller utility loss than DP", "guard", check_guard),
    Trend("hush", "001", "Hush needs less noise than DP-SGD for the same per-secret bound", None, check_hush),
)}


def run_trends(names: list[str] | None, *, store, cache, quiet: bool = False,
               run_suite: Callable[[str], int] | None = None) -> list[dict[str, Any]]:
    """Run (or reuse) each trend's suite, check its claim, and return one result row per trend."""
    from bench.errors import ConfigError
    chosen = list(TRENDS) if not names else names
    unknown = [n for n in chosen if n not in TRENDS]
    if unknown:
        raise ConfigError(f"unknown trend(s) {unknown}: choose from {', '.join(TRENDS)}")
    out = []
    for name in chosen:
        t = TRENDS[name]
        results = None
        if t.suite is not None:
            run_id = run_suite(t.suite)
            results = SuiteResults(store.metric_rows(run_id), store.utility_rows(run_id),
                                   store.guarantee_rows(run_id))
        res = t.check(results)
        out.append({"trend": t.name, "paper": t.paper, "claim": t.claim, "suite": t.suite or "-",
                    "holds": "yes" if res.holds else "NOT REPRODUCED", "numbers": res.numbers})
    return out
