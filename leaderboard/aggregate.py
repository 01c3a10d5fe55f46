"""Pure pandas helpers that turn stored rows into the leaderboard's frames (no database, no plugins).

Conventions (stated on the page too):

* A *defense configuration* is (task, model, defense label, defense params); one row each.
* Seeds are aggregated as mean ± sample sd (ddof=1; blank when n = 1) over the seeds of the configuration.
  If several complete runs hold the same configuration and seed, the latest run wins.
* The *worst-case attack* of a game is the attack with the highest **mean** metric over seeds (choosing the
  maximum per seed and then averaging would bias the worst case upward by the seed noise). Even so, a
  maximum over many attacks on the same targets favours the attacker (selection bias), so the table also
  counts the attacks the worst case was taken over (``attacks (n)``).
* The 95% CI of a mean over n >= 2 seeds is the Student-t interval mean ± t_{0.975, n-1}·sd/√n over the
  per-seed values: it describes the seed-to-seed spread of the mean, which an envelope of per-seed CIs does
  not. With one seed it is that seed's stored CI (as bench.metrics computed it). The ``CI kind``
  column says which one a row shows.
* Exposure and extraction rates are aggregated per game (``extras_game``, default ``adapt``): per seed the
  worst case over the attacks of that game, then mean ± sd over seeds. Other games never leak into it.
* Privacy–utility: both axes are "lower is better" (worst-case AUC of one game, held-out loss), so the
  Pareto front is the set of points no other point weakly dominates with one strict improvement; the app
  computes it per (task, model), since held-out losses of different tasks or models are not comparable.
"""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pandas as pd
from scipy import stats

__all__ = ["KEYS", "BASELINES", "EXTRA_METRICS", "CI_LEVEL", "latest_per_seed", "seed_interval", "worst_case",
           "leaderboard_table", "pareto_front", "attack_breakdown", "config_label", "export_bytes", "format_ci"]

KEYS = ["task", "model", "defense", "params"]
BASELINES = {
    "finetune": "the `finetune` defense (undefended adaptation) of the same run, task, model and seed",
    "pretrained": "the pretrained model θ (role `pretrained`, before adaptation) of the same world/seed",
}
# Metrics shown where present: members' value (the non-members' value is the control, in the breakdown).
EXTRA_METRICS = {
    "exposure_mean_pos": "canary exposure (mean)",
    "exposure_p95_pos": "canary exposure (p95)",
    "extractable_rate_pos": "k-extractable rate",
    "pii_fer_pos": "PII FER",
    "pii_ael_pos": "PII AEL",
}
WORST = {"auc": "max AUC", "tpr@1%fpr": "max TPR@1%FPR"}
CI_LEVEL = 0.95
DEFAULT_EXTRAS_GAME = "adapt"


def config_label(row: pd.Series | dict) -> str:
    """Plain-text name of a configuration, for selectors (rendered as text, never markdown)."""
    return f"{row['task']} | {row['model']} | {row['defense']} | {row['params']}"


def format_ci(low: float, high: float) -> str:
    if low is None or high is None or not (np.isfinite(low) and np.isfinite(high)):
        return "—"
    return f"[{low:.3f}, {high:.3f}]"


def latest_per_seed(frame: pd.DataFrame) -> pd.DataFrame:
    """Keep, for each (configuration, seed), only the rows of the latest complete run that holds it."""
    if frame.empty:
        return frame
    latest = frame.groupby(KEYS + ["seed"])["run"].transform("max")
    return frame[frame["run"] == latest]


def _sd(values: pd.Series) -> float:
    return float(values.std(ddof=1)) if len(values) > 1 else float("nan")


def seed_interval(mean: float, sd: float, n: int, level: float = CI_LEVEL) -> tuple[float, float]:
    """Student-t interval of a mean over ``n >= 2`` seeds: mean ± t_{(1+level)/2, n-1}·sd/√n.

    Why t and not normal: with 2-5 seeds the sd is itself uncertain, and the t quantile accounts for it.
    """
    if n < 2:
        raise ValueError(f"a t-interval needs at least 2 seeds, got n={n}: use the per-seed CI for one seed")
    half = float(stats.t.ppf(0.5 + level / 2.0, n - 1)) * sd / math.sqrt(n)
    return mean - half, mean + half


def _over_seeds(frame: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Per group of ``by``: mean, sd, n over seeds and the 95% CI (t over seeds, or the stored one for 1 seed).

    Rows of one seed are first averaged into one per-seed value, so n counts seeds, not rows.
    """
    per_seed = (frame.groupby(by + ["seed"], sort=True)
                .agg(value=("value", "mean"), ci_low=("ci_low", "min"), ci_high=("ci_high", "max"))
                .reset_index())
    out = (per_seed.groupby(by, sort=True)
           .agg(mean=("value", "mean"), sd=("value", _sd), n=("seed", "nunique"),
                seed_low=("ci_low", "first"), seed_high=("ci_high", "first"))
           .reset_index())
    lows, highs, kinds = [], [], []
    for mean, sd, n, lo, hi in zip(out["mean"], out["sd"], out["n"], out["seed_low"], out["seed_high"]):
        if n >= 2:
            lo, hi = seed_interval(mean, sd, int(n))
            kinds.append(f"Student-t over {int(n)} seeds")
        else:
            kinds.append("stored per-seed CI (1 seed)")
        lows.append(lo)
        highs.append(hi)
    out["ci_low"], out["ci_high"], out["ci_kind"] = lows, highs, kinds
    return out.drop(columns=["seed_low", "seed_high"])


def worst_case(metrics: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per (configuration, game): the attack with the highest mean ``metric`` over seeds, with its
    mean, sd, n, CI and CI kind, and ``n_attacks``, the number of attacks the maximum was taken over
    (see the module docstring)."""
    cols = KEYS + ["game", "attack", "mean", "sd", "n", "ci_low", "ci_high", "ci_kind", "n_attacks"]
    m = metrics[metrics["metric"] == metric]
    if m.empty:
        return pd.DataFrame(columns=cols)
    per = _over_seeds(m, KEYS + ["game", "attack"])
    per["n_attacks"] = per.groupby(KEYS + ["game"])["attack"].transform("nunique")
    # Highest mean; ties go to the alphabetically first attack (stable sort on the sorted groups).
    per = per.sort_values(KEYS + ["game", "mean"], ascending=[True] * (len(KEYS) + 1) + [False], kind="stable")
    return per.drop_duplicates(KEYS + ["game"], keep="first")[cols].reset_index(drop=True)


def _extras_columns(metrics: pd.DataFrame, game: str) -> pd.DataFrame:
    """Exposure / extraction of one game: per seed the worst case over that game's attacks, then mean ± sd."""
    cols = {}
    g = metrics[metrics["game"] == game]
    for metric, title in EXTRA_METRICS.items():
        m = g[g["metric"] == metric]
        if m.empty:
            continue
        per_seed = m.groupby(KEYS + ["seed"])["value"].max().reset_index()
        agg = per_seed.groupby(KEYS)["value"].agg(["mean", _sd])
        cols[f"{game} · {title}"] = agg["mean"]
        cols[f"{game} · {title} sd"] = agg["_sd"]
        cols[f"{game} · {title} attacks (n)"] = m.groupby(KEYS)["attack"].nunique()
    return pd.DataFrame(cols)


def leaderboard_table(metrics: pd.DataFrame, utility: pd.DataFrame, guarantees: pd.DataFrame, *,
                      games: list[str], baseline: str = "finetune", extras_game: str | None = None) -> pd.DataFrame:
    """The main view: one row per defense configuration (see the module docstring for conventions).

    ``metrics`` is already filtered (task, model, attack family, games) and reduced with
    :func:`latest_per_seed`; ``utility`` and ``guarantees`` are joined on (run, task, model, defense, seed).
    Exposure and extraction columns come from ``extras_game`` only (default: ``adapt`` when shown, else the
    first of ``games``), so a game with larger values cannot leak into another game's numbers.
    """
    if metrics.empty:
        return pd.DataFrame()
    configs = metrics[KEYS + ["seed", "run"]].drop_duplicates()
    out = configs.groupby(KEYS).agg(n_seeds=("seed", "nunique"),
                                    seeds=("seed", lambda s: ", ".join(str(x) for x in sorted(set(s)))))
    out = out.rename(columns={"n_seeds": "seeds (n)", "seeds": "seed list"})
    for game in games:
        for metric, title in WORST.items():
            w = worst_case(metrics[metrics["game"] == game], metric).set_index(KEYS)
            short = "AUC" if metric == "auc" else "TPR"
            block = pd.DataFrame(index=w.index)
            block[f"{game} · {title}"] = w["mean"]
            block[f"{game} · {short} sd"] = w["sd"]
            block[f"{game} · {short} 95% CI"] = [format_ci(lo, hi) for lo, hi in zip(w["ci_low"], w["ci_high"])]
            block[f"{game} · {short} CI kind"] = w["ci_kind"]
            block[f"{game} · {short} attack"] = w["attack"]
            block[f"{game} · {short} attacks (n)"] = w["n_attacks"]
            out = out.join(block)
    if extras_game is None:
        extras_game = DEFAULT_EXTRAS_GAME if DEFAULT_EXTRAS_GAME in games or not games else games[0]
    extras = _extras_columns(metrics, extras_game)
    if not extras.empty:
        out = out.join(extras)
    out = out.join(_utility_columns(configs, utility, baseline))
    out = out.join(_guarantee_columns(configs, guarantees))
    cost = metrics.drop_duplicates("evaluation_id").groupby(KEYS + ["seed"])["duration_s"].sum().reset_index()
    out = out.join(cost.groupby(KEYS)["duration_s"].mean().rename("attack seconds (mean per seed)"))
    prov = metrics[KEYS + ["run", "code_version", "command"]].drop_duplicates()
    out = out.join(prov.groupby(KEYS).agg(
        runs=("run", lambda s: ", ".join(str(x) for x in sorted(set(s)))),
        **{"code version": ("code_version", lambda s: ", ".join(sorted(set(map(str, s))))),
           "command": ("command", lambda s: " ; ".join(sorted(set(map(str, s)))))}))
    return out.reset_index()


def _utility_columns(configs: pd.DataFrame, utility: pd.DataFrame, baseline: str) -> pd.DataFrame:
    if utility.empty:
        return pd.DataFrame(index=configs.set_index(KEYS).index.unique())
    on = ["run", "task", "model", "defense", "seed"]
    adapted = utility[utility["role"] == "adapted"].pivot_table(index=on, columns="metric", values="value",
                                                                aggfunc="mean")
    rows = configs.merge(adapted.reset_index(), on=on, how="left")
    if baseline == "pretrained":
        base = utility[utility["role"] == "pretrained"]
    else:
        base = utility[(utility["role"] == "adapted") & (utility["defense"] == "finetune")]
    base = (base[base["metric"] == "loss"].groupby(["run", "task", "model", "seed"])["value"].mean()
            .rename("baseline_loss").reset_index())
    rows = rows.merge(base, on=["run", "task", "model", "seed"], how="left")
    cols = {}
    if "loss" in rows:
        rows["delta_loss"] = rows["loss"] - rows["baseline_loss"]
        cols.update({"held-out loss": ("loss", "mean"), "held-out loss sd": ("loss", _sd),
                     f"Δ loss vs {baseline}": ("delta_loss", "mean"),
                     f"Δ loss vs {baseline} sd": ("delta_loss", _sd)})
    if "perplexity" in rows:
        cols["perplexity"] = ("perplexity", "mean")
    if "train_seconds" in rows:
        cols["train seconds (mean)"] = ("train_seconds", "mean")
    if not cols:
        return pd.DataFrame(index=configs.set_index(KEYS).index.unique())
    return rows.groupby(KEYS).agg(**cols)


def _guarantee_columns(configs: pd.DataFrame, guarantees: pd.DataFrame) -> pd.DataFrame:
    """One column per guarantee name (e.g. epsilon, a NAF bound): its mean over seeds (inf stays inf)."""
    if guarantees.empty:
        return pd.DataFrame(index=configs.set_index(KEYS).index.unique())
    on = ["run", "task", "model", "defense", "seed"]
    rows = configs.merge(guarantees[on + ["name", "value"]], on=on, how="inner")
    if rows.empty:
        return pd.DataFrame(index=configs.set_index(KEYS).index.unique())
    wide = rows.pivot_table(index=KEYS, columns="name", values="value", aggfunc="mean", dropna=False)
    wide.columns = [f"guarantee: {c}" for c in wide.columns]
    return wide


def pareto_front(x: np.ndarray | pd.Series, y: np.ndarray | pd.Series) -> np.ndarray:
    """Boolean mask of the points on the Pareto front when both coordinates are minimised.

    A point is on the front unless another point is ≤ in both coordinates and < in at least one. Points
    with a missing coordinate are never on the front. O(n log n): sort by (x, y), keep running min of y.
    """
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    on = np.zeros(len(xs), dtype=bool)
    ok = np.nonzero(np.isfinite(xs) & np.isfinite(ys))[0]
    order = ok[np.lexsort((ys[ok], xs[ok]))]
    best_y = math.inf
    prev = None
    for i in order:
        if ys[i] < best_y:
            on[i], best_y, prev = True, ys[i], (xs[i], ys[i])
        elif prev is not None and (xs[i], ys[i]) == prev:
            on[i] = True  # an exact duplicate of a front point is not dominated either
    return on


def attack_breakdown(metrics: pd.DataFrame) -> pd.DataFrame:
    """Every (game, attack, metric) of one configuration: mean, sd and n over seeds, the 95% CI of the mean
    (same rule as the leaderboard), class counts and flags; each attack's own value, before any worst case."""
    if metrics.empty:
        return pd.DataFrame()
    by = ["game", "attack", "family", "metric"]
    stats_ = _over_seeds(metrics, by)
    rest = (metrics.groupby(by, sort=True)
            .agg(n_pos=("n_pos", "max"), n_neg=("n_neg", "max"),
                 flag=("flag", lambda s: ", ".join(sorted({str(v) for v in s if v is not None and v == v}))))
            .reset_index())
    return stats_.merge(rest, on=by, how="left")


def export_bytes(frame: pd.DataFrame, fmt: str) -> bytes:
    """The shown frame as CSV (header + rows, no index) or JSON (list of records; NaN/inf as null)."""
    if fmt == "csv":
        buf = io.StringIO()
        frame.to_csv(buf, index=False)
        return buf.getvalue().encode("utf-8")
    if fmt == "json":
        records = frame.astype(object).where(frame.notna(), None).to_dict(orient="records")
        clean = [{str(k): (None if isinstance(v, float) and not math.isfinite(v) else
                           (v.item() if isinstance(v, np.generic) else v)) for k, v in r.items()} for r in records]
        return json.dumps(clean, indent=1, default=str).encode("utf-8")
    raise ValueError(f"unknown export format {fmt!r}: use 'csv' or 'json'")
