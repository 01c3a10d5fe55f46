"""`privbench compare`: the regression gate between a baseline results database and the current one.

For every built-in attack × built-in defense × game × task × model × seed present
in the latest complete run of the suite in both databases:

* **privacy**: the current AUC must lie inside the baseline's bootstrap CI
  ``[ci_low, ci_high]`` widened by ``tolerance`` on each side (default 0.05 AUC:
  CPU kernels and thread counts differ between machines, which moves a small
  world's AUC by a step or two of 1/(n_pos·n_neg) granularity);
* **utility**: each held-out utility value of a released model (loss and
  next-token accuracy of θ, the reference and every built-in defense's θ') must
  lie within ``utility_tolerance`` (default 10 %) of the baseline value,
  relative; utility rows have no CI, so a relative band stands in for one.

Anything outside is an offender; the gate fails (exit 1) when there is one.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.errors import ConfigError, StoreError

UTILITY_METRICS = ("loss", "next_token_accuracy")


@dataclass
class Offender:
    kind: str          # auc or a utility metric
    cell: dict
    baseline: float
    current: float
    allowed_low: float
    allowed_high: float

    def row(self) -> dict:
        return {**self.cell, "metric": self.kind, "baseline": round(self.baseline, 4),
                "current": round(self.current, 4), "allowed": f"[{self.allowed_low:.4f}, {self.allowed_high:.4f}]"}


@dataclass
class Comparison:
    baseline_run: int
    current_run: int
    compared: int
    offenders: list[Offender]
    tolerance: float
    utility_tolerance: float
    #: plugins of the current run the gate leaves out (not built in), as "defense NAME" / "attack NAME"
    skipped: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.offenders


def _latest_complete_run(store, suite: str | None, what: str) -> int:
    runs = [r for r in store.list_runs() if r["status"] == "complete" and (suite is None or r["suite"] == suite)]
    if not runs:
        which = f" of suite '{suite}'" if suite else ""
        raise ConfigError(f"the {what} database {store.display_url} has no complete run{which}: run "
                          f"`privbench run --suite {suite or 'smoke'} --db ...` into it first")
    return max(r["id"] for r in runs)


def _builtin_names() -> tuple[set[str], set[str]]:
    """Names of attacks and defenses whose code ships with privbench (not installed or submitted plugins)."""
    from bench.registry import ATTACKS, BUILTIN_MODULES, DEFENSES

    def builtin(reg, kind):
        return {n for n in reg.names() if reg.get(n).__module__ in BUILTIN_MODULES[kind]}
    return builtin(ATTACKS, "attack"), builtin(DEFENSES, "defense")


def _open(db: str, what: str):
    from bench.store import Store
    try:
        return Store(db, create=False)
    except StoreError as exc:
        raise StoreError(f"{what} database: {exc}") from None


def compare(baseline: str, current: str, *, suite: str | None = "smoke", tolerance: float = 0.05,
            utility_tolerance: float = 0.10) -> Comparison:
    """Compare the latest complete ``suite`` runs of two databases; see the module docstring for the rule."""
    if not 0 <= tolerance < 1 or not 0 <= utility_tolerance < 1:
        raise ConfigError(f"tolerances must be in [0, 1) (got {tolerance}, {utility_tolerance}): e.g. --tolerance "
                          f"0.05")
    if suite is not None and not suite.strip():
        raise ConfigError("--suite is empty text: give the name of the suite whose latest runs to compare (e.g. "
                          "--suite smoke)")
    base_store, cur_store = _open(baseline, "baseline"), _open(current, "current")
    try:
        base_run = _latest_complete_run(base_store, suite, "baseline")
        cur_run = _latest_complete_run(cur_store, suite, "current")
        attacks, defenses = _builtin_names()
        key_f = ("task", "model", "defense", "seed", "game", "attack")

        def aucs(store, run):
            return {tuple(r[k] for k in key_f): r for r in store.metric_rows(run)
                    if r["metric"] == "auc" and r["attack"] in attacks and r["defense"] in defenses}

        def utilities(store, run):
            return {(r["task"], r["model"], r["defense"], r["seed"], r["role"], r["metric"]): r["value"]
                    for r in store.utility_rows(run) if r["metric"] in UTILITY_METRICS
                    and (r["defense"] in defenses or r["role"] != "adapted")}

        current_rows = cur_store.metric_rows(cur_run)
        skipped = tuple(sorted({f"defense {r['defense']}" for r in current_rows if r["defense"] not in defenses} |
                               {f"attack {r['attack']}" for r in current_rows if r["attack"] not in attacks}))
        b_auc, c_auc = aucs(base_store, base_run), aucs(cur_store, cur_run)
        b_util, c_util = utilities(base_store, base_run), utilities(cur_store, cur_run)
    finally:
        base_store.close()
        cur_store.close()
    shared = sorted(set(b_auc) & set(c_auc))
    shared_util = sorted(set(b_util) & set(c_util))
    if not shared and not shared_util:
        raise ConfigError(f"no overlap between baseline run {base_run} and current run {cur_run}: no built-in "
                          f"(task, model, defense, seed, game, attack) cell is in both; run the same suite into both")
    offenders: list[Offender] = []
    for k in shared:
        b, c = b_auc[k], c_auc[k]
        lo = (b["ci_low"] if b["ci_low"] is not None else b["value"]) - tolerance
        hi = (b["ci_high"] if b["ci_high"] is not None else b["value"]) + tolerance
        if not lo <= c["value"] <= hi:
            offenders.append(Offender("auc", dict(zip(key_f, k)), b["value"], c["value"], lo, hi))
    for k in shared_util:
        b, c = b_util[k], c_util[k]
        band = utility_tolerance * abs(b)
        if not b - band <= c <= b + band:
            cell = {"task": k[0], "model": k[1], "defense": k[2], "seed": k[3], "game": "-", "attack": f"({k[4]})"}
            offenders.append(Offender(k[5], cell, b, c, b - band, b + band))
    return Comparison(base_run, cur_run, len(shared) + len(shared_util), offenders, tolerance, utility_tolerance,
                      skipped)


def format_comparison(result: Comparison) -> str:
    from bench.report import format_rows
    head = (f"compared {result.compared} cells of baseline run {result.baseline_run} and current run "
            f"{result.current_run} (AUC: baseline CI ± {result.tolerance:g}; utility: ± "
            f"{100 * result.utility_tolerance:g}% of baseline)")
    if result.skipped:
        head += (f"\nnot compared: {', '.join(result.skipped)} (not built in: the gate watches privbench's own "
                 f"attacks and defenses; compare a plugin with its anchors on the leaderboard)")
    if result.ok:
        return head + "\nno regressions"
    cols = ["task", "model", "defense", "seed", "game", "attack", "metric", "baseline", "current", "allowed"]
    return (head + f"\n{len(result.offenders)} cells drifted outside their allowed range:\n" +
            format_rows([o.row() for o in result.offenders], "table", columns=cols))
