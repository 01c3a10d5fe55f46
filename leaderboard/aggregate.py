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

Per track (the board's first screen, :func:`run_groups` to :func:`display_ranking`):

* Every run belongs to one *group*: the track named in its config (``config["track"]["name"]``), or, for a run
  of a suite that names no track, its suite. Tracks are listed first (``quick`` first, then by name), suites
  after. Results measured on different versions of a track (another content hash) are never ranked together:
  the newest hash keeps the track's name, older ones are ``name@hash``. A suite group holding several
  (task, model) worlds is split per world.
* Per defense configuration of a group: privacy is the worst-case attack (highest mean over seeds, as above) on
  the group's headline game, for TPR at 1% FPR and for AUC separately; utility retained is the mean over seeds
  of the stored ``utility_retained`` rows with its Student-t CI; guarantees, cost and the number of seeds come
  with it. The ranking rule is :data:`RANKING_RULE`.
"""

from __future__ import annotations

import hashlib
import io
import json
import math

import numpy as np
import pandas as pd
from scipy import stats

__all__ = ["KEYS", "BASELINES", "EXTRA_METRICS", "CI_LEVEL", "latest_per_seed", "seed_interval", "worst_case",
           "leaderboard_table", "pareto_front", "attack_breakdown", "config_label", "export_bytes", "format_ci",
           "ANCHOR_LABELS", "GAME_ORDER", "RANK_METRIC", "RANKING_RULE", "SELECTION_BIAS", "DISPLAY_COLUMNS",
           "run_groups", "world_groups", "group_table", "params_summary", "format_number", "pareto_layers",
           "rank_configurations", "track_ranking", "display_ranking", "per_attack_table", "game_attack_grid",
           "config_id"]

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


def _is_rate(metric) -> bool:
    """AUC and TPR@FPR: values in [0, 1], so an interval of their mean is too."""
    return isinstance(metric, str) and (metric == "auc" or metric.startswith("tpr@"))


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
    if "metric" in out.columns:
        metric_of = list(out["metric"])
    else:
        only = frame["metric"].unique() if "metric" in frame.columns else []
        metric_of = [only[0] if len(only) == 1 else None] * len(out)
    for mean, sd, n, lo, hi, metric in zip(out["mean"], out["sd"], out["n"], out["seed_low"], out["seed_high"],
                                           metric_of):
        if n >= 2:
            lo, hi = seed_interval(mean, sd, int(n))
            if _is_rate(metric):  # a mean of values in [0, 1] lies in [0, 1]: the t-interval is cut to it
                lo, hi = max(lo, 0.0), min(hi, 1.0)
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
    cost = metrics.drop_duplicates("evaluation_id").groupby(KEYS + ["seed"])["attack_cost_s"].sum().reset_index()
    out = out.join(cost.groupby(KEYS)["attack_cost_s"].mean().rename("attack seconds (mean per seed)"))
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
    if "adapt_seconds" in rows:
        cols["adapt seconds, measured (mean)"] = ("adapt_seconds", "mean")
    if "train_seconds" in rows:
        cols["train seconds, self-reported (mean)"] = ("train_seconds", "mean")
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


# ---------------------------------------------------------------- per track: groups, ranking, display

ANCHOR_LABELS = ("none", "finetune")
#: the anchor whose training time the cost column compares every configuration's with
FINETUNE_ANCHOR = "finetune"
PRIMARY_TRACK = "quick"
GAME_ORDER = ["pretrain", "adapt", "joint/fresh", "joint/seen", "joint/both", "post_adapt", "null"]
RANK_METRIC = "tpr@1%fpr"
RANKING_RULE = (
    "Ranking rule: two axes, both on the track's headline game — privacy risk, the worst-case attack's TPR at 1% "
    "FPR (lower is better), and utility retained (higher is better; none = 0, finetune = 1). Configurations are "
    "sorted by Pareto layer: layer 1 is the Pareto front (no other configuration of the track has lower-or-equal "
    "TPR and higher-or-equal utility retained with one of them strictly better), layer 2 is the front of the rest, "
    "and so on. Within a layer, higher utility retained comes first, then lower worst-case AUC. Ranks use the "
    "means over seeds, not the CIs: rows whose intervals overlap may swap with more seeds. The anchors none (θ "
    "released unchanged) and finetune (undefended) take part in the layers but get no rank number; a configuration "
    "without a privacy or a utility-retained value is listed after the ranked ones, unranked. Utility retained "
    "above 1 means a held-out loss below the fine-tuning anchor's; it happens where the anchor's recipe overfits "
    "(the pii track's anchor trains 24 epochs so that it gives up IDs) and says nothing of privacy.")
SELECTION_BIAS = (
    "Selection bias: each privacy number is the maximum over the attacks run on the same targets (the worst case "
    "over {n} attacks here), which overstates what any single attack achieves — the more attacks, the more "
    "optimistic for the attacker. The per-attack view shows each attack's own value.")
DISPLAY_COLUMNS = ["rank", "defense", "parameters", "TPR@1%FPR [95% CI]", "AUC [95% CI]", "worst attack",
                   "utility retained [95% CI]", "guarantee", "cost (train+attack)", "seeds"]
#: parameters shown first in the one-line summary (then the others by name); (short name, value before name)
PARAM_SHORT = {"method": ("", False), "variant": ("", False), "epsilon": ("ε", False),
               "noise_multiplier": ("σ", False), "clip": ("clip", False), "lr": ("lr", False), "epochs": ("ep", True),
               "r": ("r", False), "k": ("k", False), "m": ("m", False), "h": ("h", False),
               "max_per_user": ("max/user", False), "unit": ("per", False)}
#: training plumbing that is the same for almost every configuration; on the defense page, not in the summary
PARAM_HIDDEN = {"batch_size", "chunk_length", "weight_decay", "target_modules", "grad_sample_mode", "accountant",
                "dropout", "alpha", "prefix_length", "delta"}
PARAM_SUMMARY_ITEMS = 5
#: values that say only "as usual" (dp_adapt's unit record: DP-SGD on records); left out of the summary
PARAM_QUIET = {"unit": "record"}
#: shown parameters that only mean something for some values of a configuration's ``method`` (dp_adapt stores a
#: LoRA rank for every method, but full fine-tuning under DP has none); the other LoRA and prefix settings are hidden
PARAM_FOR_METHOD = {"r": {"lora"}}


def _json(value):
    if isinstance(value, (dict, list)):
        return value
    try:
        return json.loads(value) if isinstance(value, str) and value else None
    except ValueError:
        return None


def run_groups(runs: pd.DataFrame) -> pd.DataFrame:
    """Per run (rows of ``queries.run_frame``): the group it is ranked in — the track its config names, else its
    suite — with kind ("track"/"suite"), track name, track hash and headline game (see the module docstring)."""
    cols = ["run", "group", "kind", "track", "track_hash", "headline_game"]
    rows = []
    for run, suite, config in zip(runs["run"], runs["suite"], runs["config"]):
        cfg = _json(config)
        track = cfg.get("track") if isinstance(cfg, dict) else None
        if isinstance(track, dict) and track.get("name"):
            rows.append({"run": int(run), "kind": "track", "track": str(track["name"]),
                         "track_hash": str(track.get("hash") or ""), "headline_game": str(track.get("headline_game")
                                                                                          or ""), "suite": str(suite)})
        else:
            rows.append({"run": int(run), "kind": "suite", "track": "", "track_hash": "", "headline_game": "",
                         "suite": str(suite)})
    if not rows:
        return pd.DataFrame(columns=cols)
    g = pd.DataFrame(rows)
    names = {}
    tracks = g[g["kind"] == "track"]
    for name, grp in tracks.groupby("track"):
        newest = grp.loc[grp["run"].idxmax(), "track_hash"]
        for h in grp["track_hash"].unique():
            names[("track", name, h)] = name if h == newest else f"{name}@{h}"
    track_names = set(tracks["track"])
    g["group"] = [names[("track", t, h)] if k == "track" else (s if s not in track_names else f"{s} (suite)")
                  for k, t, h, s in zip(g["kind"], g["track"], g["track_hash"], g["suite"])]
    return g[cols]


def world_groups(groups: pd.DataFrame, metrics: pd.DataFrame) -> pd.DataFrame:
    """(run, task, model) → group and its metadata; a group holding several (task, model) worlds is split into
    ``group · task · model`` (tracks have one world by construction)."""
    cols = ["run", "task", "model", "group", "kind", "track", "track_hash", "headline_game"]
    if metrics.empty or groups.empty:
        return pd.DataFrame(columns=cols)
    w = metrics[["run", "task", "model"]].drop_duplicates().merge(groups, on="run", how="inner")
    n_worlds = w.groupby("group")[["task", "model"]].apply(lambda d: len(d.drop_duplicates()))
    multi = w["group"].map(n_worlds) > 1
    w.loc[multi, "group"] = w.loc[multi, "group"] + " · " + w.loc[multi, "task"] + " · " + w.loc[multi, "model"]
    return w[cols].reset_index(drop=True)


def _headline(game: str, present: set[str]) -> str:
    if game and game in present:
        return game
    for g in ["adapt"] + GAME_ORDER:
        if g in present:
            return g
    return sorted(present)[0] if present else game


def group_table(worlds: pd.DataFrame, metrics: pd.DataFrame) -> pd.DataFrame:
    """One row per group, in display order (tracks, ``quick`` first, then suites): kind, track hash, headline game
    (the track's; for a suite ``adapt`` when present), task, model, seeds, attacks, games, runs, configurations."""
    cols = ["group", "kind", "track", "track_hash", "headline_game", "task", "model", "seeds", "attacks", "games",
            "runs", "n_configs"]
    if worlds.empty:
        return pd.DataFrame(columns=cols)
    m = metrics.merge(worlds[["run", "task", "model", "group"]], on=["run", "task", "model"], how="inner")
    rows = []
    for name, w in worlds.groupby("group", sort=False):
        gm = m[m["group"] == name]
        present = set(gm["game"])
        games = [g for g in GAME_ORDER if g in present] + sorted(present - set(GAME_ORDER))
        rows.append({"group": name, "kind": w["kind"].iloc[0], "track": w["track"].iloc[0],
                     "track_hash": ", ".join(sorted(set(w["track_hash"]) - {""})),
                     "headline_game": _headline(w["headline_game"].iloc[0], present),
                     "task": ", ".join(sorted(set(w["task"]))), "model": ", ".join(sorted(set(w["model"]))),
                     "seeds": ", ".join(str(s) for s in sorted(set(gm["seed"]))),
                     "attacks": ", ".join(sorted(set(gm["attack"]))), "games": ", ".join(games),
                     "runs": ", ".join(str(r) for r in sorted(set(w["run"]))),
                     "n_configs": int(len(gm[KEYS].drop_duplicates()))})
    out = pd.DataFrame(rows, columns=cols)
    order = [(k != "track", not (k == "track" and g == PRIMARY_TRACK), g) for k, g in zip(out["kind"], out["group"])]
    return out.iloc[sorted(range(len(out)), key=order.__getitem__)].reset_index(drop=True)


def config_id(group: str, row: pd.Series | dict) -> str:
    """Stable short id of a configuration of a group (file names of the export, URLs)."""
    key = json.dumps([group] + [str(row[k]) for k in KEYS])
    return hashlib.sha1(key.encode("utf-8")).hexdigest()[:10]


def format_number(v, digits: int = 6) -> str:
    """Short human form of a number with at most ``digits`` significant digits: 0.002 → 2e-3, 4.0 → 4, inf → ∞,
    0.25 → 0.25."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        v = float(v)
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "∞" if v > 0 else "-∞"
        if v == 0:
            return "0"
        if abs(v) < 0.01 or abs(v) >= 1e5:
            mant, exp = f"{v:.{max(digits - 1, 0)}e}".split("e")
            mant = mant.rstrip("0").rstrip(".") if "." in mant else mant
            return f"{mant}e{int(exp)}"
        return f"{v:.{digits}g}"
    return str(v)


def params_summary(params, max_items: int = PARAM_SUMMARY_ITEMS) -> str:
    """One readable line for a configuration's parameters, e.g. ``lr 2e-3 · 4 ep · r 8``: the defining ones first
    (:data:`PARAM_SHORT`), training plumbing (:data:`PARAM_HIDDEN`), unset values and those another ``method``
    would use (:data:`PARAM_FOR_METHOD`) left out; all of them are on the defense page. "—" when nothing is left."""
    p = _json(params) if not isinstance(params, dict) else params
    if not isinstance(p, dict) or not p:
        return "—"
    keys = [k for k in PARAM_SHORT if k in p] + sorted(k for k in p if k not in PARAM_SHORT)
    parts = []
    for k in keys:
        v = p[k]
        if k in PARAM_HIDDEN or v is None or isinstance(v, (list, dict)) or PARAM_QUIET.get(k, object()) == v:
            continue
        if k in PARAM_FOR_METHOD and "method" in p and p["method"] not in PARAM_FOR_METHOD[k]:
            continue
        short, value_first = PARAM_SHORT.get(k, (k, False))
        text = format_number(v)
        parts.append(text if not short else (f"{text} {short}" if value_first else f"{short} {text}"))
    if not parts:
        return "—"
    return " · ".join(parts[:max_items]) + (" · …" if len(parts) > max_items else "")


def pareto_layers(risk, utility) -> np.ndarray:
    """Non-dominated sorting with ``risk`` minimised and ``utility`` maximised: 1 for the Pareto front, 2 for the
    front of the rest, ...; 0 where either value is missing (unranked)."""
    x = np.asarray(risk, dtype=float)
    y = -np.asarray(utility, dtype=float)
    layers = np.zeros(len(x), dtype=int)
    left = np.isfinite(x) & np.isfinite(y)
    layer = 0
    while left.any():
        layer += 1
        idx = np.nonzero(left)[0]
        front = idx[pareto_front(x[idx], y[idx])]
        layers[front] = layer
        left[front] = False
    return layers


def rank_configurations(frame: pd.DataFrame) -> pd.DataFrame:
    """Sort a group's configurations by :data:`RANKING_RULE` and number them.

    Needs columns ``tpr`` (worst-case TPR at 1% FPR), ``auc`` (worst-case AUC), ``retained`` (utility retained),
    ``anchor``, ``defense`` and ``params``; adds ``pareto_layer`` (NaN = unranked) and ``rank`` (1, 2, ... over the
    ranked non-anchor rows; NaN for anchors and unranked rows)."""
    out = frame.copy()
    layers = pareto_layers(out["tpr"], out["retained"]) if len(out) else np.zeros(0, dtype=int)
    out["pareto_layer"] = np.where(layers > 0, layers, np.nan)
    out["_unranked"] = layers == 0
    out = out.sort_values(["_unranked", "pareto_layer", "retained", "auc", "tpr", "defense", "params"],
                          ascending=[True, True, False, True, True, True, True], na_position="last", kind="stable")
    numbered = (~out["_unranked"]) & (~out["anchor"].astype(bool))
    out["rank"] = np.where(numbered, numbered.cumsum(), np.nan)
    return out.drop(columns="_unranked").reset_index(drop=True)


def _train_cost(configs: pd.DataFrame, utility: pd.DataFrame) -> pd.DataFrame:
    """Per configuration: ``train_seconds``, the mean over seeds of the adaptation's wall time, and
    ``train_seconds_source``. A seed's time is what privbench measured around ``adapt`` (utility ``adapt_seconds``)
    where stored; a run made before privbench measured it has only the defense's own report (``train_seconds``),
    and any configuration that leans on one such seed is marked ``self-reported``.

    ``train_vs_finetune`` is the mean over seeds of a seed's measured time over the ``finetune`` anchor's measured
    time in the same run and seed: the two ran on one machine, so the ratio compares configurations run on machines
    of different speeds, where seconds do not (NaN without a measured anchor beside it)."""
    on = ["run", "task", "model", "defense", "seed"]
    cols = KEYS + ["train_seconds", "train_seconds_source", "train_vs_finetune"]
    adapted = utility[(utility["role"] == "adapted") & utility["metric"].isin(["adapt_seconds", "train_seconds"])]
    rows = configs.merge(adapted[on + ["metric", "value"]], on=on, how="inner")
    if rows.empty:
        return pd.DataFrame(columns=cols)
    # a seed's rows summed (min_count: a stored NULL stays missing, never a measured 0 s); one run per configuration
    # and seed (``configs`` holds the latest), kept in the index so the anchor of that run can be found
    wide = rows.groupby(KEYS + ["run", "seed", "metric"])["value"].sum(min_count=1).unstack("metric")
    measured = wide["adapt_seconds"] if "adapt_seconds" in wide else pd.Series(np.nan, index=wide.index)
    reported = wide["train_seconds"] if "train_seconds" in wide else pd.Series(np.nan, index=wide.index)
    per_seed = pd.DataFrame({"value": measured.fillna(reported), "reported": measured.isna() & reported.notna()})
    per_seed = per_seed[per_seed["value"].notna()].reset_index()
    out = per_seed.groupby(KEYS).agg(train_seconds=("value", "mean"), reported=("reported", "any")).reset_index()
    out["train_seconds_source"] = np.where(out["reported"], "self-reported", "measured")
    # the anchor of the configuration's own run and seed, whichever run is the anchor's latest
    world = ["run", "task", "model", "seed"]
    anchor = adapted[(adapted["defense"] == FINETUNE_ANCHOR) & (adapted["metric"] == "adapt_seconds")]
    anchor = anchor.groupby(world)["value"].sum(min_count=1).rename("anchor_seconds")
    rates = measured.rename("seconds").reset_index().merge(anchor.reset_index(), on=world, how="inner")
    rates["ratio"] = rates["seconds"] / rates["anchor_seconds"].where(rates["anchor_seconds"] > 0)
    ratio = rates.dropna(subset=["ratio"]).groupby(KEYS)["ratio"].mean().rename("train_vs_finetune").reset_index()
    out = out.merge(ratio, on=KEYS, how="left")
    return out[cols]


def _mean_ci(frame: pd.DataFrame, by: list[str], value: str, prefix: str) -> pd.DataFrame:
    """Mean over seeds of ``value`` per ``by`` (one value per seed: rows of a seed averaged first), sd, n and the
    Student-t 95% CI for n >= 2 (NaN for one seed: a single derived value has no interval)."""
    cols = by + [prefix, f"{prefix}_sd", f"{prefix}_low", f"{prefix}_high", f"{prefix}_n"]
    if frame.empty:
        return pd.DataFrame(columns=cols)
    per_seed = frame.groupby(by + ["seed"])[value].mean().reset_index()
    out = per_seed.groupby(by)[value].agg(["mean", _sd, "count"]).reset_index()
    lows, highs = [], []
    for mean, sd, n in zip(out["mean"], out["_sd"], out["count"]):
        lo, hi = seed_interval(mean, sd, int(n)) if n >= 2 and np.isfinite(sd) else (np.nan, np.nan)
        lows.append(lo)
        highs.append(hi)
    out = out.rename(columns={"mean": prefix, "_sd": f"{prefix}_sd", "count": f"{prefix}_n"})
    out[f"{prefix}_low"], out[f"{prefix}_high"] = lows, highs
    return out[cols]


def _submitted(runs: pd.DataFrame, run: int, name: str) -> str:
    """"SUBMITTER, unverified" (or "verified in CI") where defense ``name`` is the plugin a `privbench submit` run
    scored (its version carries the submission's code hash); "" for a built-in or locally run defense."""
    row = runs[runs["run"] == run]
    if row.empty:
        return ""
    cfg = _json(row["config"].iloc[0]) or {}
    versions = _json(row["plugin_versions"].iloc[0]) or {}
    sub = cfg.get("submission") if isinstance(cfg, dict) else None
    code = sub.get("code_hash") if isinstance(sub, dict) else None
    if not code or not isinstance(versions, dict) or not str(versions.get(f"defense:{name}", "")).endswith(f"+{code}"):
        return ""
    who = str(row["submitter"].iloc[0]) if "submitter" in row else "—"
    return f"{who}, {'verified in CI' if row['verified'].iloc[0] == 'yes' else 'unverified'}"


def _defense_meta(runs: pd.DataFrame, run: int, label: str) -> tuple[str, str]:
    """(plugin name, version) of the defense labelled ``label`` in a run, from its stored config and plugin
    versions (no plugin import)."""
    row = runs[runs["run"] == run]
    if row.empty:
        return label, ""
    cfg = _json(row["config"].iloc[0]) or {}
    versions = _json(row["plugin_versions"].iloc[0]) or {}
    entry = next((d for d in cfg.get("defenses", []) if isinstance(d, dict) and d.get("label", d.get("name")) == label),
                 None) if isinstance(cfg, dict) else None
    name = str(entry.get("name", label)) if entry else label
    version = (entry or {}).get("version") or (versions.get(f"defense:{name}") if isinstance(versions, dict) else None)
    return name, str(version or "")


def _epsilon_unit(rows: pd.DataFrame) -> str | None:
    """The privacy unit an ε guarantee names in its details (``unit``: user, secret, text), when it is not a
    record; None for record-level DP, for other guarantees, and for details that cannot be read."""
    if "details" not in rows:
        return None
    found = set()
    for details in rows.loc[rows["name"] == "epsilon", "details"]:
        d = _json(details) if not isinstance(details, dict) else details
        found.add(d.get("unit", "record") if isinstance(d, dict) else "record")
    found.discard("record")
    return "/".join(sorted(found)) or None


def _guarantee_text(values: dict[str, float], epsilon_unit: str | None = None) -> str:
    """``ε 8`` (per record), ``ε 8 per user`` for unit-level DP, then the other guarantees by name."""
    parts = []
    for name in sorted(values, key=lambda n: (n != "epsilon", n)):
        if isinstance(values[name], float) and math.isnan(values[name]):
            parts.append(f"{name} —")
            continue
        text = f"{'ε' if name == 'epsilon' else name} {format_number(float(values[name]), 3)}"
        if name == "epsilon" and epsilon_unit and math.isfinite(float(values[name])):
            text += f" per {epsilon_unit}"
        parts.append(text)
    return "; ".join(parts) if parts else "—"


RANKING_COLUMNS = ["rank", "pareto_layer", "anchor", "config_id", "defense", "name", "version", "params",
                   "params_summary", "task", "model", "game", "tpr", "tpr_low", "tpr_high", "tpr_ci_kind", "tpr_attack",
                   "auc", "auc_low", "auc_high", "auc_ci_kind", "auc_attack", "n_attacks", "retained", "retained_sd",
                   "retained_low", "retained_high", "retained_n", "guarantee", "guarantees", "train_seconds",
                   "train_seconds_source", "train_vs_finetune",
                   "attack_seconds", "n_seeds", "seeds", "runs", "code_version", "command", "submitted"]


def track_ranking(metrics: pd.DataFrame, utility: pd.DataFrame, guarantees: pd.DataFrame, runs: pd.DataFrame, *,
                  group: str, game: str) -> pd.DataFrame:
    """The ranked table of one group: one row per defense configuration, columns :data:`RANKING_COLUMNS`.

    ``metrics``, ``utility`` and ``guarantees`` hold the group's rows (``queries`` frames restricted to the group's
    worlds); the latest run wins per configuration and seed. ``runs`` is ``queries.run_frame`` (defense plugin
    name and version from each run's config). ``game`` is the headline game the privacy columns are taken on."""
    metrics = latest_per_seed(metrics)
    if metrics.empty:
        return pd.DataFrame(columns=RANKING_COLUMNS)
    configs = metrics[KEYS + ["seed", "run"]].drop_duplicates()
    out = configs.groupby(KEYS).agg(
        n_seeds=("seed", "nunique"), seeds=("seed", lambda s: ", ".join(str(x) for x in sorted(set(s)))),
        runs=("run", lambda s: ", ".join(str(x) for x in sorted(set(s)))), latest_run=("run", "max")).reset_index()
    g = metrics[metrics["game"] == game]
    for metric, short in ((RANK_METRIC, "tpr"), ("auc", "auc")):
        w = worst_case(g, metric)
        w = w[KEYS + ["attack", "mean", "ci_low", "ci_high", "ci_kind", "n_attacks"]].rename(columns={
            "attack": f"{short}_attack", "mean": short, "ci_low": f"{short}_low", "ci_high": f"{short}_high",
            "ci_kind": f"{short}_ci_kind", "n_attacks": f"{short}_n_attacks"})
        out = out.merge(w, on=KEYS, how="left")
    out["n_attacks"] = out[["tpr_n_attacks", "auc_n_attacks"]].max(axis=1)
    on = ["run", "task", "model", "defense", "seed"]
    util = utility if not utility.empty else pd.DataFrame(columns=on + ["role", "dataset", "metric", "value"])
    ret = util[(util["dataset"] == "retained") & (util["metric"] == "utility_retained")]
    ret = configs.merge(ret[on + ["value"]], on=on, how="inner")
    out = out.merge(_mean_ci(ret, KEYS, "value", "retained"), on=KEYS, how="left")
    out = out.merge(_train_cost(configs, util), on=KEYS, how="left")
    cost = metrics.drop_duplicates("evaluation_id").groupby(KEYS + ["seed"])["attack_cost_s"].sum()
    out = out.merge(cost.groupby(KEYS).mean().rename("attack_seconds").reset_index(), on=KEYS, how="left")
    gts, units = {}, {}
    if not guarantees.empty:
        cols = on + ["name", "value"] + (["details"] if "details" in guarantees else [])
        gr = configs.merge(guarantees[cols], on=on, how="inner")
        for key, grp in gr.groupby(KEYS):
            gts[key] = {n: float(v.mean()) for n, v in grp.groupby("name")["value"]}
            units[key] = _epsilon_unit(grp)
    keys = list(zip(*(out[k] for k in KEYS)))
    out["guarantees"] = [json.dumps(gts.get(k, {}), sort_keys=True) for k in keys]
    out["guarantee"] = [_guarantee_text(gts.get(k, {}), units.get(k)) for k in keys]
    meta = [_defense_meta(runs, int(r), d) for r, d in zip(out["latest_run"], out["defense"])]
    out["name"] = [m[0] for m in meta]
    out["version"] = [m[1] for m in meta]
    out["submitted"] = [_submitted(runs, int(r), n) for r, n in zip(out["latest_run"], out["name"])]
    out["anchor"] = out["defense"].isin(ANCHOR_LABELS)
    out["params_summary"] = out["params"].map(params_summary)
    out["game"] = game
    out["config_id"] = [config_id(group, r) for r in out[KEYS].to_dict("records")]
    prov = metrics[KEYS + ["code_version", "command"]].drop_duplicates()
    prov = prov.groupby(KEYS).agg(code_version=("code_version", lambda s: ", ".join(sorted(set(map(str, s))))),
                                  command=("command", lambda s: " ; ".join(sorted(set(map(str, s)))))).reset_index()
    out = out.merge(prov, on=KEYS, how="left")
    for col in RANKING_COLUMNS:
        if col not in out:
            out[col] = np.nan
    return rank_configurations(out)[RANKING_COLUMNS]


def _value_ci(mean, low, high) -> str:
    if mean is None or not np.isfinite(mean):
        return "—"
    if low is None or high is None or not (np.isfinite(low) and np.isfinite(high)):
        return f"{mean:.3f}"
    return f"{mean:.3f} [{low:.3f}, {high:.3f}]"


def _seconds(v) -> str:
    if v is None or not np.isfinite(v):
        return "—"
    return f"{v:.1f} s" if v < 10 else f"{v:.0f} s"


def _vs_finetune(r: dict) -> str:
    """" (0.83× finetune)": the training time against the finetune anchor's in the same runs, for every row but the
    anchors (``none`` trains nothing, ``finetune`` is the unit)."""
    v = r.get("train_vs_finetune")
    if bool(r.get("anchor")) or v is None or not np.isfinite(v):
        return ""
    return f" ({v:.2f}× finetune)"


def display_ranking(ranking: pd.DataFrame) -> pd.DataFrame:
    """The ranked table as people read it (:data:`DISPLAY_COLUMNS`, every cell text): what the app's first screen
    and the exported index.html both show, cell for cell."""
    rows = []
    for r in ranking.to_dict("records"):
        if bool(r["anchor"]):
            rank = "anchor"
        else:
            rank = "—" if r["rank"] is None or not np.isfinite(r["rank"]) else str(int(r["rank"]))
        name = str(r["name"]) if r["name"] == r["name"] else str(r["defense"])
        version = str(r["version"]) if r["version"] == r["version"] and r["version"] else ""
        plugin = f"{name} {version}".strip()
        defense = f"{r['defense']} {version}".strip() if name == r["defense"] else f"{r['defense']} ({plugin})"
        if isinstance(r.get("submitted"), str) and r["submitted"]:
            defense += f" · submitted by {r['submitted']}"
        ta, aa = r["tpr_attack"], r["auc_attack"]
        ta = ta if isinstance(ta, str) else "—"
        aa = aa if isinstance(aa, str) else "—"
        rows.append({"rank": rank, "defense": defense, "parameters": r["params_summary"],
                     "TPR@1%FPR [95% CI]": _value_ci(r["tpr"], r["tpr_low"], r["tpr_high"]),
                     "AUC [95% CI]": _value_ci(r["auc"], r["auc_low"], r["auc_high"]),
                     "worst attack": ta if ta == aa else f"{ta} / {aa}",
                     "utility retained [95% CI]": _value_ci(r["retained"], r["retained_low"], r["retained_high"]),
                     "guarantee": r["guarantee"],
                     "cost (train+attack)": f"{_seconds(r['train_seconds'])}{_vs_finetune(r)} + "
                                            f"{_seconds(r['attack_seconds'])}"
                                            + (" (train self-reported)"
                                               if r.get("train_seconds_source") == "self-reported" else ""),
                     "seeds": str(int(r["n_seeds"]))})
    return pd.DataFrame(rows, columns=DISPLAY_COLUMNS)


def per_attack_table(metrics: pd.DataFrame, ranking: pd.DataFrame, game: str) -> pd.DataFrame:
    """Each attack's own TPR at 1% FPR and AUC (means over seeds) on ``game``, one row per configuration in rank
    order: the view behind the worst case, without the selection over attacks."""
    m = latest_per_seed(metrics)
    m = m[(m["game"] == game) & m["metric"].isin([RANK_METRIC, "auc"])]
    cols = ["defense", "parameters"]
    if m.empty or ranking.empty:
        return pd.DataFrame(columns=cols)
    means = _over_seeds(m, KEYS + ["attack", "metric"])
    attacks = sorted(set(means["attack"]))
    rows = []
    for r in ranking.to_dict("records"):
        sel = means
        for k in KEYS:
            sel = sel[sel[k] == r[k]]
        row = {"defense": r["defense"], "parameters": r["params_summary"]}
        for a in attacks:
            vals = {mt: sel[(sel["attack"] == a) & (sel["metric"] == mt)]["mean"] for mt in (RANK_METRIC, "auc")}
            txt = [f"{v.iloc[0]:.3f}" if len(v) else "—" for v in vals.values()]
            row[f"{a} (TPR · AUC)"] = " · ".join(txt)
        rows.append(row)
    return pd.DataFrame(rows)


def game_attack_grid(rows: pd.DataFrame) -> pd.DataFrame:
    """One configuration's metric rows → per (game, attack, metric ∈ {AUC, TPR@1%FPR}): mean, sd, n over seeds and
    the 95% CI (same rule as everywhere); the data of the defense page's heatmap."""
    m = rows[rows["metric"].isin(["auc", RANK_METRIC])]
    if m.empty:
        return pd.DataFrame(columns=["game", "attack", "metric", "mean", "sd", "n", "ci_low", "ci_high", "ci_kind"])
    out = _over_seeds(m, ["game", "attack", "metric"])
    out["metric"] = out["metric"].map({"auc": "AUC", RANK_METRIC: "TPR@1%FPR"})
    order = {g: i for i, g in enumerate(GAME_ORDER)}
    out["_g"] = out["game"].map(lambda g: order.get(g, len(order)))
    return out.sort_values(["metric", "_g", "game", "attack"]).drop(columns="_g").reset_index(drop=True)
