"""The `privbench` command line: run suites, list plugins, show results."""

from __future__ import annotations

import json
import os
import secrets
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Optional

import typer


def _click_exception_types() -> tuple[tuple[type, ...], tuple[type, ...]]:
    """(usage-error types, abort types) of click and of the click copy that recent typer bundles."""
    usage: list[type] = []
    abort: list[type] = [typer.Abort]
    try:
        import click
        usage.append(click.ClickException)
        abort.append(click.Abort)
    except ImportError:  # pragma: no cover
        pass
    try:
        from typer._click import exceptions as bundled
        usage.append(bundled.ClickException)
    except ImportError:  # pragma: no cover - typer versions that use click itself
        pass
    return tuple(usage), tuple(abort)


CLICK_USAGE_ERRORS, CLICK_ABORTS = _click_exception_types()

from bench.errors import PrivbenchError

app = typer.Typer(
    help="privbench: how much does a language model leak, and how well does a defense stop it?\n\n"
         "Start with `privbench run --suite quick`, then `privbench show`.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
)

def _add_extensions() -> None:
    """Subcommands plugin packages provide (``privbench data`` from the tasks), through the registry."""
    from bench.registry import cli_extensions
    for name, sub in cli_extensions().items():
        app.add_typer(sub, name=name)


_add_extensions()

DB_HELP = "Results database: a SQLAlchemy URL or a path to a SQLite file."
DEFAULT_DB = "sqlite:///results.db"


def _check_format(fmt: str) -> None:
    """Refuse an unknown output format before any work runs (a run is not redone to print it)."""
    from bench.report import FORMATS
    if fmt not in FORMATS:
        raise PrivbenchError(f"unknown format {fmt!r}: use {', '.join(FORMATS[:-1])} or {FORMATS[-1]}")


def _store(db: str, create: bool = True):
    from bench.store import Store
    return Store(db, create=create)


@app.command()
def run(
    suite: Optional[str] = typer.Option(None, "--suite", "-s", help="Bundled suite name (smoke, quick) or path to a "
                                        "YAML file."),
    track: Optional[str] = typer.Option(None, "--track", help="Run a track (`privbench tracks`) with its anchors only; "
                                        "a suite naming the track adds defenses."),
    db: str = typer.Option(DEFAULT_DB, "--db", help=DB_HELP),
    cache: Optional[str] = typer.Option(None, "--cache", help="Artifact cache dir (default $PRIVBENCH_CACHE or "
                                                              "~/.cache/privbench)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress output; print only the report."),
    report: bool = typer.Option(True, "--report/--no-report", help="Print a summary of the run at the end."),
    executor: str = typer.Option("local", "--executor", help="Where jobs run: local (in process) or ray."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Join this Ray cluster (e.g. auto, "
                                              "ray://host:10001) instead of starting a local Ray instance."),
    artifact_store: Optional[str] = typer.Option(None, "--artifact-store", help="fsspec URL (file:///dir, "
                                                 "s3://bucket/prefix) through which nodes without a shared disk "
                                                 "share artifacts and signals; each keeps its own --cache."),
    secret_draw: bool = typer.Option(False, "--secret-draw", help="Salt every world's draw with a fresh secret kept "
                                     "in memory, so no plugin can recompute the labels from the suite and seed; "
                                     "the run is then not reproducible from the suite alone."),
) -> None:
    """Run every (defense, attack) pair of a suite on every game and store scores, metrics and utility."""
    from bench.cache import ArtifactCache
    from bench.executors import make_executor
    from bench.report import summarize
    from bench.runner import Runner
    from bench.suite import load_suite

    if (suite is None) == (track is None):
        raise PrivbenchError("give exactly one of --suite (a bundled suite or a YAML file) and --track (a track "
                             "name from `privbench tracks`)")
    runner_executor = make_executor(executor, ray_address=ray_address)
    if track is not None:
        from bench.suite import parse_suite
        s = parse_suite({"track": track, "defenses": []})
    else:
        s = load_suite(suite)
    from bench.artifact_store import open_store
    from bench.cache import check_cache_root
    shared = open_store(artifact_store)  # checked before the database is touched
    check_cache_root(cache)
    store = _store(db)
    artifacts = ArtifactCache(cache, store=shared)  # created only once the database opened
    draw_secret = secrets.token_hex(16) if secret_draw else None
    runner = Runner(s, store, artifacts, command=" ".join(["privbench"] + sys.argv[1:]), quiet=quiet,
                    executor=runner_executor, draw_secret=draw_secret)
    result = runner.run()
    if report:
        rows = store.metric_rows(result.run_id)
        typer.echo(summarize(rows))
        typer.echo("")
        typer.echo(_utility_table(store.utility_rows(result.run_id)))
        typer.echo(f"\nrun {result.run_id} ({result.status}) in {result.seconds:.1f}s; "
                   f"`privbench show {result.run_id} --format json` prints every metric row.")


@app.command()
def audit(
    suite: str = typer.Option(..., "--suite", "-s", help="Bundled suite name (e.g. audit) or path to a YAML file."),
    db: str = typer.Option(DEFAULT_DB, "--db", help=DB_HELP),
    cache: Optional[str] = typer.Option(None, "--cache", help="Artifact cache dir (default $PRIVBENCH_CACHE or "
                                                              "~/.cache/privbench)."),
    quiet: bool = typer.Option(True, "--quiet/--progress", help="No progress output; print only the table."),
    fmt: str = typer.Option("table", "--format", "-f", help="table, json or csv"),
) -> None:
    """Run only the audit games of a suite and print, per defense: claimed ε, ε lower bounds, verdict."""
    import dataclasses

    from bench.audit_report import audit_rows
    from bench.cache import ArtifactCache
    from bench.game import b_only_game
    from bench.report import format_rows
    from bench.runner import Runner
    from bench.suite import load_suite

    s = load_suite(suite)
    # a task that trains b = 0 units as neighbours (secrets_replaced) makes its b games claim checks of Hush
    neighbours = any(getattr(t.instance, "replace_negatives", False) for t in s.tasks)
    games = [g for g in s.games if g.audit_pool or (neighbours and b_only_game(g))]
    if not games:
        raise PrivbenchError(f"suite '{s.name}' has no audit game: add `audit` to its games and set world n_audit "
                             f"(e.g. 100), or `audit/pretrain` and n_audit_pretrain, or use the bundled suite "
                             f"`audit` (or `hush_audit` for a secret-level claim)")
    s = dataclasses.replace(s, games=games)
    _check_format(fmt)
    from bench.cache import check_cache_root
    check_cache_root(cache)
    store = _store(db)
    result = Runner(s, store, ArtifactCache(cache), command=" ".join(["privbench"] + sys.argv[1:]),
                    quiet=quiet).run()
    typer.echo(format_rows(audit_rows(store.metric_rows(result.run_id)), fmt))
    if fmt == "table":
        typer.echo(f"\nrun {result.run_id} ({result.status}) in {result.seconds:.1f}s; confidence: of the largest "
                   f"bound over the attacks (1 - attacks x (1 - suite confidence)); a verdict per attack holds at the "
                   f"suite's confidence ({s.audit['confidence']}). docs/audit.md says when each bound is valid.")


@app.command()
def plan(
    suite: str = typer.Option(..., "--suite", "-s", help="Bundled suite name (smoke, quick) or path to a YAML file."),
    db: str = typer.Option(DEFAULT_DB, "--db", help=DB_HELP),
    cache: Optional[str] = typer.Option(None, "--cache", help="Artifact cache dir (default $PRIVBENCH_CACHE or "
                                                              "~/.cache/privbench)."),
    summary: bool = typer.Option(False, "--summary", help="Print only the totals per job kind."),
) -> None:
    """Print a suite's job graph: jobs, their keys and dependencies, and which the cache or database hold."""
    from bench.cache import ArtifactCache
    from bench.plan import build_plan
    from bench.runner import Runner
    from bench.suite import load_suite

    from bench.cache import check_cache_root
    from bench.errors import NoDatabase
    s = load_suite(suite)
    check_cache_root(cache)  # before the database is touched
    try:
        store = _store(db, create=False)  # plan only reads: it never creates a database or changes its mode
    except NoDatabase:
        store = None  # nothing stored yet: the plan shows what the cache holds
    runner = Runner(s, store, ArtifactCache(cache), quiet=True)
    run_id = _run_id_for_key(store, runner.run_key) if store is not None else None
    if run_id is not None:
        runner.done_evals = {e["eval_key"] for e in store.evaluations(run_id)}
    typer.echo(build_plan(runner, run_id).describe(verbose=not summary))


def _run_id_for_key(store, run_key: str):
    """The id of the run with this exact run key, or None (nothing of it stored yet)."""
    try:
        run_id = store.resolve_run(run_key)
    except PrivbenchError:
        return None
    return run_id if store.run_info(run_id).get("run_key") == run_key else None


def _utility_table(rows: list[dict]) -> str:
    from bench.report import format_rows
    pivot: dict[tuple, dict] = {}
    for r in rows:
        if r["dataset"] == "retained":  # utility retained belongs on its model's held-out row
            if r["metric"] != "utility_retained":
                continue
            k = (r["task"], r["model"], r["seed"], r["role"], r["defense"], "heldout")
            metric = "retained"
        else:
            k = (r["task"], r["model"], r["seed"], r["role"], r["defense"], r["dataset"])
            metric = r["metric"]
        pivot.setdefault(k, {"task": k[0], "model": k[1], "seed": k[2], "role": k[3], "defense": k[4],
                             "data": k[5]})
        pivot[k][metric] = r["value"]
    cols = ["task", "model", "seed", "role", "defense", "data", "loss", "retained", "perplexity",
            "next_token_accuracy", "rouge1", "rougeL", "adapt_seconds", "train_seconds"]
    cols = [c for c in cols if any(c in row for row in pivot.values())]  # a measure no model reported is no column
    return ("utility (held-out, out-of-domain and matched-utility rows; retained = share of fine-tuning's held-out "
            "gain;\nadapt_seconds = adapt's wall time as privbench measured it, train_seconds = the defense's own "
            "report)\n" + format_rows(list(pivot.values()), "table", columns=cols))


@app.command()
def trends(
    only: Optional[str] = typer.Option(None, "--only", help="Comma-separated trends to check (default: all): "
                                       "dp, dp_matched, iid_ood, naf_canaries, naf_pii, guard, hush."),
    db: str = typer.Option(DEFAULT_DB, "--db", help=DB_HELP),
    cache: Optional[str] = typer.Option(None, "--cache", help="Artifact cache dir (default $PRIVBENCH_CACHE or "
                                                              "~/.cache/privbench)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress output."),
    fmt: str = typer.Option("table", "--format", help="table, json or csv."),
) -> None:
    """Check whether each paper's headline direction reproduces on the embedded models (the paper-trends
    suites): runs (or reuses) one bundled suite per claim and prints the claim, its numbers and whether it holds."""
    from bench.cache import ArtifactCache
    from bench.report import format_rows
    from bench.runner import Runner
    from bench.suite import load_suite
    from bench.trends import run_trends

    _check_format(fmt)
    names = [n.strip() for n in only.split(",") if n.strip()] if only is not None else None
    if names == []:
        raise PrivbenchError(f"--only {only!r} names no trend: give some of dp, dp_matched, iid_ood, naf_canaries, "
                             f"naf_pii, guard, hush (or leave --only out for all)")
    from bench.cache import check_cache_root
    from bench.trends import check_trend_names
    check_trend_names(names)  # before the cache or the database is touched
    check_cache_root(cache)
    store = _store(db)
    art = ArtifactCache(cache)

    def run_suite(name: str) -> int:
        return Runner(load_suite(name), store, art, command=" ".join(["privbench"] + sys.argv[1:]),
                      quiet=quiet).run().run_id

    rows = run_trends(names, store=store, cache=art, quiet=quiet, run_suite=run_suite)
    typer.echo(format_rows(rows, fmt, columns=["trend", "paper", "holds", "claim", "numbers"]))


@app.command("list")
def list_(
    what: str = typer.Argument("all", help="attacks, defenses, tasks, games, models, suites or all"),
    fmt: str = typer.Option("table", "--format", "-f", help="table or json"),
) -> None:
    """List registered plugins (built-in and installed through entry points) with versions and parameters."""
    from bench.game import GAMES
    from bench.modeling import BUILTIN_SPECS
    from bench.registry import REGISTRIES
    from bench.suite import bundled_suites

    kinds = ["attacks", "defenses", "tasks", "games", "models", "suites"]
    if what != "all" and what not in kinds:
        raise PrivbenchError(f"cannot list '{what}': use one of {', '.join(kinds)} or all")
    if fmt not in ("table", "json"):  # before the registries load (and warn about broken plugins)
        raise PrivbenchError(f"unknown format '{fmt}': use table or json")
    out: dict[str, list] = {}
    for kind in kinds if what == "all" else [what]:
        if kind in REGISTRIES:
            reg = REGISTRIES[kind]
            out[kind] = [dict(reg.get(n).info(), origin=reg.origin(n)) for n in reg.names()]
            for err in reg.load_errors:
                typer.echo(f"warning: could not load {err}", err=True)
        elif kind == "games":
            out[kind] = [{"name": g.name, "stage": g.stage, "description": g.description} for g in GAMES.values()]
        elif kind == "models":
            out[kind] = [{"name": m.name, "layers": m.num_layers, "hidden": m.hidden_size, "heads": m.num_heads,
                          "context": m.context_length, "vocab": m.vocab_size} for m in BUILTIN_SPECS.values()]
        else:
            out[kind] = [{"name": n} for n in bundled_suites()]
    if fmt == "json":
        typer.echo(json.dumps(out, indent=2, default=str))
        return
    for kind, items in out.items():
        typer.echo(f"\n{kind.upper()}")
        for it in items:
            head = f"  {it['name']}"
            if "version" in it:
                head += f"  v{it['version']}"
            if it.get("origin") and it["origin"] != "builtin":
                head += f"  [{it['origin']}]"
            if it.get("requires"):
                head += f"  needs: {', '.join(it['requires'])}"
            if it.get("stage"):
                head += f"  ({it['stage']})"
            typer.echo(head)
            if it.get("description"):
                typer.echo(f"      {it['description']}")
            if it.get("reference"):  # attacks: the paper and equation the score follows
                typer.echo(f"      paper: {it['reference']}")
            if "layers" in it:
                typer.echo(f"      {it['layers']} layers, hidden {it['hidden']}, {it['heads']} heads, "
                           f"context {it['context']}, vocab {it['vocab']}")
            for p in it.get("params", []):
                rng = ""
                if p.get("choices"):
                    rng = f" one of {p['choices']}"
                elif p.get("low") is not None or p.get("high") is not None:
                    rng = f" in [{p.get('low')}, {p.get('high')}]"
                typer.echo(f"      - {p['name']} ({p['type']}, default {p['default']!r}){rng}: {p['help']}")


@app.command()
def tracks(
    fmt: str = typer.Option("table", "--format", "-f", help="table or json"),
) -> None:
    """List the frozen tracks results are ranked on: name, content hash, headline game, task, model, seeds."""
    from bench.suite import parse_suite
    from bench.tracks import bundled_tracks, load_track

    out = []
    for name in bundled_tracks():
        t = load_track(name)
        cfg = parse_suite(t.suite_raw(), path=t.path).config
        out.append({"name": t.name, "hash": t.hash, "headline_game": t.headline_game,
                    "tasks": [x["label"] for x in cfg["tasks"]], "models": [m["name"] for m in cfg["models"]],
                    "seeds": cfg["seeds"], "anchors": [d["label"] for d in cfg["defenses"]],
                    "attacks": [a["label"] for a in cfg["attacks"]], "description": t.description})
    if fmt == "json":
        typer.echo(json.dumps(out, indent=2))
        return
    if fmt != "table":
        raise PrivbenchError(f"unknown format '{fmt}': use table or json")
    for t in out:
        typer.echo(f"{t['name']:<11} {t['hash']}  {t['headline_game']:<7} {', '.join(t['tasks'])} · "
                   f"{', '.join(t['models'])} · seeds {t['seeds']} · {len(t['attacks'])} attacks\n"
                   f"{'':<12}{t['description']}")
    typer.echo("\nRun one with a suite that names it (`track: quick` and your defenses); the anchors none and "
               "finetune are added.")


@app.command()
def show(
    run_ref: Optional[str] = typer.Argument(None, metavar="[RUN]", help="Run id, suite name or run-key prefix "
                                                                        "(default: the latest run)."),
    fmt: str = typer.Option("table", "--format", "-f", help="table, json or csv"),
    db: str = typer.Option(DEFAULT_DB, "--db", help=DB_HELP),
    utility: bool = typer.Option(False, "--utility", help="Show utility rows instead of metric rows."),
    summary: bool = typer.Option(False, "--summary", help="One line per defense configuration, ranked as the "
                                 "leaderboard ranks them: worst-case TPR@1%FPR and AUC, utility retained, guarantee, "
                                 "cost."),
    list_runs: bool = typer.Option(False, "--list", help="List runs instead of showing one."),
) -> None:
    """Print a run's metric rows (AUC, TPR@FPR with CIs, counts) as a table, JSON or CSV; --summary ranks its
    defenses as the leaderboard does."""
    from bench.report import format_rows

    if list_runs and (run_ref is not None or utility or summary):
        extra = "run" if run_ref is not None else ("--utility" if utility else "--summary")
        raise PrivbenchError(f"--list lists every run and takes no {extra}: use `privbench show --list`, or "
                             f"`privbench show RUN [--utility | --summary]` for one run")
    if utility and summary:
        raise PrivbenchError("--utility and --summary are two views: give one (the summary holds utility retained)")
    _check_format(fmt)
    store = _store(db, create=False)
    if list_runs:
        typer.echo(format_rows(store.list_runs(), fmt))
        return
    if summary and run_ref is None:  # the latest run that can be ranked, not one still in progress
        complete = [r["id"] for r in store.list_runs() if r["status"] == "complete"]
        if not complete:
            raise PrivbenchError("no complete run to summarise: `privbench show --list` lists the runs, and rerunning "
                                 "a run's command completes it")
        run_ref = str(max(complete))
    run_id = store.resolve_run(run_ref)
    rows = [] if summary else store.utility_rows(run_id) if utility else store.metric_rows(run_id)
    info = store.run_info(run_id)
    if summary and info.get("status") != "complete":
        state = ("marked running: still in progress, or stopped without a trace (rerun its command to complete it)"
                 if info.get("status") == "running" else f"{info.get('status')} (rerunning its command completes it)")
        raise PrivbenchError(f"run {run_id} is {state}: a summary ranks complete runs, as the leaderboard does; "
                             f"`privbench show {run_id}` prints the rows it stored")
    if summary:
        with store.database_errors("read the rows of the run"):
            text = _board_text(db, fmt, run=run_id)
    elif fmt == "table" and not utility:
        cols = ["task", "model", "defense", "seed", "game", "attack", "metric", "value", "ci_low", "ci_high",
                "n_pos", "n_neg", "flag"]
        text = format_rows(rows, fmt, columns=cols)
    else:
        text = format_rows(rows, fmt)
    if info.get("status") != "complete":  # on stderr, so JSON and CSV on stdout stay clean
        state = ("marked running: still in progress, or stopped without a trace" if info.get("status") == "running"
                 else str(info.get("status")))
        why = f" ({str(info['error']).splitlines()[0]})" if info.get("error") else ""
        typer.echo(f"warning: run {run_id} is {state}{why}; its rows are partial: rerun its command to complete "
                   f"it", err=True)
    typer.echo(text)


def _board_text(db: str, fmt: str, *, run: int | None = None, group: str | None = None) -> str:
    """The ranked tables of the leaderboard (or of one run) as text: per group a heading and its table, or, as JSON
    and CSV, one row per configuration led by its group."""
    from bench.report import format_rows
    from leaderboard.aggregate import DISPLAY_COLUMNS, RANKING_RULE
    from leaderboard.board import board_rows, load_board
    from leaderboard.queries import LeaderboardError, read_only_engine

    _check_format(fmt)
    try:
        engine = read_only_engine(db)
        try:
            board = load_board(engine, run=run)
        finally:
            engine.dispose()
    except LeaderboardError as exc:
        raise PrivbenchError(str(exc).replace("`-- --db PATH` to streamlit", "--db PATH")) from None
    if group is not None and group not in board.groups:
        raise PrivbenchError(f"no group {group!r} on the board: it has {', '.join(board.names) or 'none'} "
                             f"(`privbench board show` lists them all)")
    names = [group] if group is not None else board.names
    if fmt != "table":
        return format_rows(board_rows(board, names), fmt, columns=["group", "kind", "game", *DISPLAY_COLUMNS])
    if not names:
        return "no complete run with metric rows: nothing to rank yet"
    parts = []
    for name in names:
        g = board.groups[name]
        parts.append(f"{g.title()} · headline game {g.game} · worst case over {g.n_attacks} attack(s)\n"
                     + format_rows(g.display.to_dict("records"), "table", columns=DISPLAY_COLUMNS))
    return "\n\n".join(parts) + "\n\n" + textwrap.fill(RANKING_RULE, width=116)


# ---------------------------------------------------------------------- the database schema

db_app = typer.Typer(help="The results database's schema: `privbench db upgrade` migrates an older database.",
                     no_args_is_help=True)
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
def db_upgrade(db: str = typer.Option(DEFAULT_DB, "--db", help=DB_HELP)) -> None:
    """Migrate a results database to this privbench's schema (bench/migrations), in one transaction; databases
    written before the schema was versioned are recognised by their tables and stamped at the baseline first."""
    from bench.store import Store
    store = Store(db, create=False, upgrade=True)
    before, after = store.upgraded or (None, "")
    store.close()
    if before == after:
        typer.echo(f"{store.display_url} is already at schema revision {after}")
    else:
        typer.echo(f"upgraded {store.display_url} from {before or 'unversioned'} to schema revision {after}")


# ---------------------------------------------------------------------- the board (leaderboard export)

board_app = typer.Typer(help="The leaderboard: one ranking per track, a page per defense configuration. "
                             "`streamlit run leaderboard/app.py` serves it; `privbench board export` writes it as "
                             "static files.", no_args_is_help=True)
app.add_typer(board_app, name="board")


@board_app.command("export")
def board_export(
    out: str = typer.Option(..., "--out", "-o", help="Directory to write index.html, board.json, defense/ and "
                                                     "specs/ into (created if missing)."),
    db: str = typer.Option(DEFAULT_DB, "--db", help=DB_HELP + " Opened read-only."),
) -> None:
    """Write the leaderboard as static files: index.html (ranked tables and plots per track, viewable offline),
    a page per defense configuration, the Vega-Lite specs of the plots and board.json with the data behind them."""
    from bench.store import Store
    from leaderboard.export import check_out, export_db
    from leaderboard.queries import LeaderboardError

    if not out.strip():
        raise PrivbenchError("--out is empty text: give the directory to write the board into (e.g. --out site/)")
    if Path(out).exists() and not Path(out).is_dir():
        raise PrivbenchError(f"--out {out} is a file, not a directory: give a directory (created if missing)")
    try:
        check_out(out, db)  # before the database is opened: a board that cannot be written, or would overwrite it
    except LeaderboardError as exc:
        raise PrivbenchError(str(exc)) from None
    # the checks `privbench show` makes, with its messages: the URL (password masked), the driver, the file, the
    # schema revision; it only reads, and is closed before the export opens the database read-only
    store = Store(db, create=False)
    store.close()
    try:
        with store.database_errors("read the rows of the board"):  # a damaged file, a lost connection: as `show` says them
            data = export_db(db, out)
    except LeaderboardError as exc:
        raise PrivbenchError(str(exc).replace("`-- --db PATH` to streamlit", "--db PATH")) from None
    except OSError as exc:
        raise PrivbenchError(f"cannot write the board into {out} ({exc.strerror or exc}): give a directory you can "
                             f"write") from None
    n = sum(len(g["display"]) for g in data["groups"])
    typer.echo(f"wrote {out}/index.html and {out}/board.json: {len(data['groups'])} group(s) "
               f"({', '.join(g['name'] for g in data['groups']) or 'none'}), {n} configuration(s)")


@board_app.command("show")
def board_show(
    group: Optional[str] = typer.Argument(None, metavar="[GROUP]", help="A track, or a suite without one "
                                                                        "(default: every group)."),
    fmt: str = typer.Option("table", "--format", "-f", help="table, json or csv"),
    db: str = typer.Option(DEFAULT_DB, "--db", help=DB_HELP + " Opened read-only."),
) -> None:
    """Print the leaderboard's ranked tables in the terminal: the first screen of the app, group by group."""
    from bench.store import Store
    store = Store(db, create=False)  # the checks and messages of `privbench show`; it only reads
    store.close()
    with store.database_errors("read the rows of the board"):
        typer.echo(_board_text(db, fmt, group=group))


# ---------------------------------------------------------------------- submitting plugins and the regression gate

class CheckFailed(PrivbenchError):
    """A check ran and found problems (validate, compare): exit status 1."""

    exit_code = 1


PLUGIN_HELP = "A plugin file (path/to/plugin.py) or the entry-point name of an installed plugin package."


#: the least address space (GiB) in which a sandboxed child imports torch, transformers and the runner (measured:
#: 1 GiB is enough, 0.3 GiB is not)
MIN_SANDBOX_GIB = 1.0


def _limits(timeout: float, memory_gb: float):
    from bench.sandbox import Limits
    import math
    if not (math.isfinite(timeout) and math.isfinite(memory_gb)) or timeout <= 0 or memory_gb <= 0:
        raise PrivbenchError(f"--timeout {timeout:g} and --memory {memory_gb:g} must be positive and finite: e.g. "
                             f"--timeout 3600 --memory 16")
    if memory_gb < MIN_SANDBOX_GIB:  # the child would fail to load torch, and the failure would read as the plugin's
        raise PrivbenchError(f"--memory {memory_gb:g} GiB is too little for the sandboxed child to load PyTorch and "
                             f"privbench: give at least {MIN_SANDBOX_GIB:g} (e.g. --memory 16)")
    if timeout > 1e15 or memory_gb > 1e15:  # past any machine; int() of the product would be meaningless
        raise PrivbenchError(f"--timeout {timeout:g} or --memory {memory_gb:g} is past any machine's limits: e.g. "
                             f"--timeout 3600 --memory 16")
    from bench.sandbox import check_limits
    return check_limits(Limits(wall_s=float(timeout), memory_bytes=int(memory_gb * (1 << 30))))


@app.command()
def validate(
    plugin: str = typer.Argument(..., metavar="PATH_OR_ENTRYPOINT", help=PLUGIN_HELP),
    cache: Optional[str] = typer.Option(None, "--cache", help="Artifact cache dir (default $PRIVBENCH_CACHE)."),
    timeout: float = typer.Option(900, "--timeout", help="Wall-clock limit in seconds for the sandboxed check."),
    memory: float = typer.Option(16, "--memory", help="Memory (address-space) limit in GiB."),
) -> None:
    """Check a plugin before submitting: registration, parameters, and a run on a tiny smoke world (sandboxed)."""
    from bench.validate import validate as run_validate
    checks = run_validate(plugin, cache=cache, limits=_limits(timeout, memory))
    for c in checks:
        typer.echo(c.line())
    failed = [c for c in checks if not c.ok]
    if failed:
        raise CheckFailed(f"{len(failed)} of {len(checks)} checks failed ({', '.join(c.name for c in failed)}): "
                          f"fix them, then run `privbench validate {plugin}` again")
    typer.echo(f"all {len(checks)} checks passed: submit with `privbench submit {plugin}`")


@app.command()
def submit(
    plugin: str = typer.Argument(..., metavar="PATH_OR_ENTRYPOINT", help=PLUGIN_HELP),
    suite: Optional[str] = typer.Option(None, "--suite", "-s", help="Suite to score the plugin on (bundled name or "
                                                                   "YAML; default smoke)."),
    track: Optional[str] = typer.Option(None, "--track", help="Score a defense on a track (`privbench tracks`), "
                                                             "beside its anchors, ranked on the leaderboard."),
    db: str = typer.Option(DEFAULT_DB, "--db", help=DB_HELP),
    submitter: Optional[str] = typer.Option(None, "--submitter", help="Your name or handle, shown on the "
                                                                        "leaderboard."),
    cache: Optional[str] = typer.Option(None, "--cache", help="Artifact cache dir (default $PRIVBENCH_CACHE)."),
    extend: bool = typer.Option(False, "--extend/--replace", help="Keep the suite's own defenses (attacks) next "
                                                                  "to the plugin instead of replacing them."),
    timeout: float = typer.Option(3600, "--timeout", help="Wall-clock limit in seconds; the plugin is killed "
                                                          "after it."),
    memory: float = typer.Option(16, "--memory", help="Memory (address-space) limit in GiB."),
) -> None:
    """Score a plugin on a suite in a sandboxed process (limits, no network) and store it as one run."""
    from bench.submit import submit as run_submit
    if suite is not None and track is not None:
        raise PrivbenchError("give at most one of --suite and --track: a suite that names a track (`track: NAME`) "
                             "is how to add settings to a track")
    res = run_submit(plugin, suite=suite or "smoke", track=track, db=db, cache=cache, submitter=submitter,
                     extend=extend, limits=_limits(timeout, memory),
                     log=lambda m: typer.echo(f"[privbench] {m}", err=True))
    if res.status == "failed":
        from bench.errors import PluginError
        raise PluginError(f"submission of '{res.plugin}' failed and is recorded as run {res.run_id}: {res.error}")
    what = "already scored (unchanged plugin): nothing to do" if res.status == "unchanged" else "scored"
    typer.echo(f"run {res.run_id}: '{res.plugin}' {what}; see `privbench show {res.run_id}` or "
               f"`streamlit run leaderboard/app.py`")


@app.command()
def compare(
    baseline: str = typer.Option(..., "--baseline", help="Baseline results database (e.g. tests/baselines/smoke.db)."),
    db: str = typer.Option(DEFAULT_DB, "--db", help=DB_HELP),
    suite: str = typer.Option("smoke", "--suite", "-s", help="Compare the latest complete run of this suite."),
    tolerance: float = typer.Option(0.05, "--tolerance", help="AUC slack added to each side of the baseline CI."),
    utility_tolerance: float = typer.Option(0.10, "--utility-tolerance", help="Relative slack for utility values."),
) -> None:
    """Regression gate: fail when a built-in attack's AUC or a built-in defense's utility drifts from a baseline."""
    from bench.compare import compare as run_compare
    from bench.compare import format_comparison
    result = run_compare(baseline, db, suite=suite, tolerance=tolerance, utility_tolerance=utility_tolerance)
    typer.echo(format_comparison(result))
    if not result.ok:
        raise CheckFailed(f"{len(result.offenders)} cells drifted from the baseline (table above): find the change "
                          f"that moved them, or regenerate the baseline as tests/baselines/README.md says")


#: warnings about the libraries' own internals, nothing a user can act on; a quiet run prints only its report.
#: peft's get_peft_model reads transformers' deprecated ``is_gradient_checkpointing`` alias, and its prefix tuning
#: passes the prefix as the deprecated ``past_key_values``; torch.func has no batching rule for CPU
#: scaled-dot-product attention, which per-example gradients under vmap (Hush) go through; torch notes that a full
#: backward hook (Opacus' per-record gradients) fires on the first layer, whose inputs need no gradient
LIBRARY_WARNINGS = ((r"`is_gradient_checkpointing` is deprecated", FutureWarning),
                    (r"`past_key_values` is deprecated", FutureWarning),
                    (r"Full backward hook is firing when gradients are computed with respect to module outputs",
                     UserWarning),
                    (r"There is a performance drop because we have not yet implemented the batching rule",
                     UserWarning))


def main(argv: list[str] | None = None) -> int:
    """Entry point: one-line errors and non-zero exit codes for everything a user can get wrong."""
    from bench.allocator import tune_allocator
    tune_allocator()
    for message, category in LIBRARY_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    command = typer.main.get_command(app)
    try:
        command.main(args=argv, prog_name="privbench", standalone_mode=False)
    except PrivbenchError as exc:
        typer.echo(f"error: {exc}", err=True)
        return exc.exit_code
    except CLICK_ABORTS:
        typer.echo("aborted", err=True)
        return 130
    except CLICK_USAGE_ERRORS as exc:
        exc.show()
        return exc.exit_code
    except KeyboardInterrupt:
        typer.echo("interrupted: the run is recorded as failed; rerun the same command to resume", err=True)
        return 130
    except Exception as exc:  # not the input's fault: a bug in privbench or a library it calls
        if os.environ.get("PRIVBENCH_DEBUG", "").strip() not in ("", "0"):
            raise
        detail = str(exc).splitlines()[0] if str(exc) else ""
        typer.echo(f"error: internal error ({type(exc).__name__}{': ' + detail if detail else ''}): rerun with "
                   f"PRIVBENCH_DEBUG=1 for the traceback and report it with the command", err=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
