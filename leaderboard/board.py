"""The board: every group (track, or suite without a track) of a results database with its ranked table.

One function, :func:`load_board`, turns a read-only engine into what both the Streamlit app (leaderboard/app.py)
and the static export (leaderboard/export.py, ``privbench board export``) show, so the two cannot disagree. No
plugin import: everything comes from the stored rows (leaderboard/queries.py) and pure pandas
(leaderboard/aggregate.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
from sqlalchemy.engine import Engine

from leaderboard.aggregate import (
    GAME_ORDER, KEYS, SELECTION_BIAS, display_ranking, game_attack_grid, group_table, latest_per_seed,
    per_attack_table, run_groups, track_ranking, world_groups,
)
from leaderboard.queries import check_schema, guarantee_frame, metric_frame, run_frame, utility_frame

__all__ = ["Group", "Board", "load_board", "board_from_frames", "board_rows"]


#: metric rows of the privacy audit (bench/audit.py): ROC and one-run ε lower bounds, the DP claim's verdict, and the
#: secret-level (Hush) KL claim's verdict
AUDIT_METRIC_PREFIXES = ("eps_lb_roc@", "eps_lb_one_run@", "dp_claim@", "secret_claim@", "kl_lb@")
#: ``bound`` names the quantity and the procedure: ε (ROC, one-run, one-run at the claimed δ) or KL (secret-level)
AUDIT_COLUMNS = ["seed", "game", "bound", "confidence, δ", "lower bound", "attack", "claimed", "flag"]
DP_CLAIM_BOUND = "ε, one-run at the claimed δ"
SECRET_CLAIM_BOUND = "KL, secret-level"


def audit_summary(audit: pd.DataFrame) -> str:
    """One line for a defense page's facts: the claim's verdict where a game checked one (a DP ε, or a secret-level
    KL bound), else the largest ε lower bound stored, else that none is."""
    if audit.empty:
        return "no ε lower bound stored"
    parts = []
    for bound, what, how in ((DP_CLAIM_BOUND, "ε", "one-run"), (SECRET_CLAIM_BOUND, "KL", "secret-level")):
        claims = audit[audit["bound"] == bound]
        if not claims.empty:
            worst = claims.sort_values("lower bound", ascending=False).iloc[0]
            verdict = "claim_violated" if (claims["flag"] == "claim_violated").any() else "claim_ok"
            parts.append(f"claimed {what} {worst['claimed']:.3g} vs audited {what} ≥ {worst['lower bound']:.3g} "
                         f"({worst['confidence, δ']}, {how}, attack {worst['attack']}): {verdict}")
    if parts:
        return "; ".join(parts)
    eps = audit[audit["bound"].str.startswith("ε")]
    if eps.empty:
        best = audit.sort_values("lower bound", ascending=False).iloc[0]
        return f"KL ≥ {best['lower bound']:.3g} ({best['game']} game, attack {best['attack']}); no claim audited"
    best = eps.sort_values("lower bound", ascending=False).iloc[0]
    note = f", {best['flag']}" if best["flag"] else ""
    return (f"ε ≥ {best['lower bound']:.3g} ({best['bound']}, {best['confidence, δ']}, {best['game']} game, "
            f"attack {best['attack']}{note}); no DP claim audited")


@dataclass
class Group:
    """One ranked group: its metadata (a row of ``aggregate.group_table``), its rows and its tables."""

    name: str
    meta: dict
    metrics: pd.DataFrame
    utility: pd.DataFrame
    guarantees: pd.DataFrame
    ranking: pd.DataFrame          # aggregate.RANKING_COLUMNS, in rank order
    display: pd.DataFrame          # aggregate.DISPLAY_COLUMNS, the same rows as text

    @property
    def kind(self) -> str:
        return self.meta["kind"]

    @property
    def game(self) -> str:
        return self.meta["headline_game"]

    @property
    def n_attacks(self) -> int:
        n = self.ranking["n_attacks"].max() if not self.ranking.empty else 0
        return int(n) if n == n else 0

    def selection_bias(self) -> str:
        return SELECTION_BIAS.format(n=self.n_attacks)

    def per_attack(self) -> pd.DataFrame:
        return per_attack_table(self.metrics, self.ranking, self.game)

    def title(self) -> str:
        what = "track" if self.kind == "track" else "suite without a track"
        return f"{self.name} ({what})"

    def config(self, config_id: str) -> pd.Series:
        sel = self.ranking[self.ranking["config_id"] == config_id]
        if sel.empty:
            raise KeyError(f"no configuration {config_id!r} in {self.name!r}")
        return sel.iloc[0]

    def facts(self, cfg: pd.Series | dict) -> pd.DataFrame:
        """The head of a defense page: rank, plugin, parameters, privacy, utility, guarantee, cost, provenance."""
        r = cfg
        rank = "anchor" if r["anchor"] else (str(int(r["rank"])) if r["rank"] == r["rank"] else "unranked")
        disp = self.display.iloc[int(self.ranking.index[self.ranking["config_id"] == r["config_id"]][0])]
        facts = [("group", self.title()), ("rank", rank),
                 ("Pareto layer", "—" if r["pareto_layer"] != r["pareto_layer"] else str(int(r["pareto_layer"]))),
                 ("defense label", r["defense"]), ("plugin", f"{r['name']} {r['version']}".strip()),
                 ("parameters", r["params_summary"]), ("task", r["task"]), ("model", r["model"]),
                 ("headline game", r["game"]),
                 ("TPR@1%FPR [95% CI]", f"{disp['TPR@1%FPR [95% CI]']} (attack {r['tpr_attack']}; "
                                        f"{r['tpr_ci_kind']})"),
                 ("AUC [95% CI]", f"{disp['AUC [95% CI]']} (attack {r['auc_attack']}; {r['auc_ci_kind']})"),
                 ("utility retained [95% CI]", disp["utility retained [95% CI]"]), ("guarantee", r["guarantee"]),
                 ("audit (claimed vs audited)", audit_summary(self.config_audit(r))),
                 ("cost (train + attack, mean per seed)", disp["cost (train+attack)"]), ("seeds", r["seeds"]),
                 ("runs", r["runs"]), ("code version", r["code_version"])]
        return pd.DataFrame(facts, columns=["", "value"]).astype(str)

    def config_rows(self, cfg: pd.Series | dict) -> pd.DataFrame:
        """The metric rows of one configuration, the latest run per seed (as ranked)."""
        sel = pd.Series(True, index=self.metrics.index)
        for k in KEYS:
            sel &= self.metrics[k] == cfg[k]
        return latest_per_seed(self.metrics[sel])

    def _of_config(self, cfg: pd.Series | dict, frame: pd.DataFrame) -> pd.DataFrame:
        """Rows of ``frame`` (utility, guarantees: keyed by run, task, model, defense label, seed) that belong to
        the runs and seeds the configuration's ranked metric rows come from."""
        if frame.empty:
            return frame
        runs = self.config_rows(cfg)[["run", "task", "model", "defense", "seed"]].drop_duplicates()
        return frame.merge(runs, on=["run", "task", "model", "defense", "seed"], how="inner")

    def config_utility(self, cfg: pd.Series | dict) -> pd.DataFrame:
        """Per seed, role and dataset: every stored utility metric of the configuration (one column each)."""
        u = self._of_config(cfg, self.utility)
        if u.empty:
            return pd.DataFrame(columns=["seed", "role", "dataset"])
        wide = u.pivot_table(index=["seed", "role", "dataset"], columns="metric", values="value", aggfunc="mean")
        wide.columns.name = None
        return wide.reset_index()

    def config_audit(self, cfg: pd.Series | dict) -> pd.DataFrame:
        """Claimed ε next to the audited ε lower bounds of one configuration (rows of bench/audit.py), per seed,
        game and bound: the largest bound over attacks and the attack that reached it. ``dp_claim`` rows carry
        the claimed ε (value) and the one-run bound at the claimed δ (ci_low), flagged ``claim_violated`` or
        ``claim_ok``; ``secret_claim`` rows likewise the claimed KL μ of a secret-level guarantee (Hush) and the KL
        lower bound; ROC bounds flagged ``indicative`` come from many targets scored on one model."""
        rows = self.config_rows(cfg)
        rows = rows[rows["metric"].astype(str).str.startswith(AUDIT_METRIC_PREFIXES)]
        if rows.empty:
            return pd.DataFrame(columns=AUDIT_COLUMNS)
        out = []
        for (seed, game, metric), g in rows.groupby(["seed", "game", "metric"], sort=True):
            bound, _, conditions = str(metric).partition("@")
            if bound in ("dp_claim", "secret_claim"):
                worst = g.sort_values("ci_low", ascending=False, na_position="last").iloc[0]
                violated = (g["flag"] == "claim_violated").any()
                out.append((seed, game, DP_CLAIM_BOUND if bound == "dp_claim" else SECRET_CLAIM_BOUND, conditions,
                            worst["ci_low"], worst["attack"], worst["value"],
                            "claim_violated" if violated else "claim_ok"))
            else:
                best = g.sort_values("value", ascending=False).iloc[0]
                kind = {"eps_lb_roc": "ε, ROC", "eps_lb_one_run": "ε, one-run", "kl_lb": "KL"}[bound]
                out.append((seed, game, kind, conditions, best["value"], best["attack"], float("nan"),
                            best["flag"] if isinstance(best["flag"], str) else ""))
        return pd.DataFrame(out, columns=AUDIT_COLUMNS)

    def compare(self, a: pd.Series | dict, b: pd.Series | dict) -> pd.DataFrame:
        """Two configurations side by side, for a maintainer reviewing a submission: per game, attack and metric
        (AUC, TPR@1%FPR) each one's mean and 95% CI over seeds, the difference B − A, and whether the CIs are
        disjoint (a difference the seeds support, as the regression gate reads it). Cells only one has: NaN."""
        keys = ["game", "attack", "metric"]
        cols = keys + ["mean", "ci_low", "ci_high", "n"]
        ga = game_attack_grid(self.config_rows(a))[cols]
        gb = game_attack_grid(self.config_rows(b))[cols]
        m = ga.merge(gb, on=keys, how="outer", suffixes=(" A", " B"))
        m["Δ (B − A)"] = m["mean B"] - m["mean A"]
        m["CIs disjoint"] = (m["ci_low B"] > m["ci_high A"]) | (m["ci_high B"] < m["ci_low A"])
        order = {g: i for i, g in enumerate(GAME_ORDER)}
        m["_g"] = m["game"].map(lambda g: order.get(g, len(order)))
        return m.sort_values(["metric", "_g", "game", "attack"]).drop(columns="_g").reset_index(drop=True)

    def compare_facts(self, a: pd.Series | dict, b: pd.Series | dict) -> pd.DataFrame:
        """The two defense pages' facts in two columns (A, B), row by row."""
        fa, fb = self.facts(a), self.facts(b)
        return pd.DataFrame({"": fa[""], "A": fa["value"], "B": fb["value"].values})

    def config_guarantees(self, cfg: pd.Series | dict) -> pd.DataFrame:
        g = self._of_config(cfg, self.guarantees)
        cols = ["seed", "name", "value", "details"]
        return g[cols].sort_values(["name", "seed"]).reset_index(drop=True) if not g.empty \
            else pd.DataFrame(columns=cols)


@dataclass
class Board:
    groups: dict[str, Group] = field(default_factory=dict)   # in display order
    runs: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def names(self) -> list[str]:
        return list(self.groups)

    def default(self) -> str | None:
        return next(iter(self.groups), None)


def _restrict(frame: pd.DataFrame, worlds: pd.DataFrame, group: str) -> pd.DataFrame:
    keys = worlds[worlds["group"] == group][["run", "task", "model"]]
    if frame.empty:
        return frame
    return frame.merge(keys, on=["run", "task", "model"], how="inner")


def board_from_frames(metrics: pd.DataFrame, utility: pd.DataFrame, guarantees: pd.DataFrame,
                      runs: pd.DataFrame) -> Board:
    """The board from the four ``queries`` frames (pure pandas)."""
    complete = runs[runs["status"] == "complete"] if "status" in runs else runs  # a failed run names no group
    worlds = world_groups(run_groups(complete), metrics)
    table = group_table(worlds, metrics)
    board = Board(runs=runs)
    for meta in table.to_dict("records"):
        name = meta["group"]
        m = _restrict(metrics, worlds, name)
        u = _restrict(utility, worlds, name)
        g = _restrict(guarantees, worlds, name)
        ranking = track_ranking(m, u, g, runs, group=name, game=meta["headline_game"])
        board.groups[name] = Group(name, meta, m, u, g, ranking, display_ranking(ranking))
    return board


def load_board(engine: Engine, run: int | None = None) -> Board:
    """Read a results database (read-only engine from ``queries.read_only_engine``) into a :class:`Board`.

    With ``run``, the board of that run alone (its groups, its configurations ranked among themselves): what
    ``privbench show RUN --summary`` prints. Like the board, it reads complete runs only."""
    check_schema(engine)
    frames = [metric_frame(engine), utility_frame(engine), guarantee_frame(engine), run_frame(engine)]
    if run is not None:
        frames = [f[f["run"] == run] for f in frames]
    return board_from_frames(*frames)


def board_rows(board: Board, groups: list[str] | None = None) -> list[dict]:
    """The ranked tables of ``groups`` (default: every group) as rows of text cells, each led by its group, kind
    and headline game: what ``privbench board show`` and ``privbench show --summary`` print."""
    rows = []
    for name in groups if groups is not None else board.names:
        g = board.groups[name]
        for cells in g.display.to_dict("records"):
            rows.append({"group": name, "kind": g.kind, "game": g.game, **cells})
    return rows
