"""`privbench data`: build, list and inspect the standard data splits, and the dataset distance report.

The data command line belongs to the tasks: it reads what each task declares (``Task.offline``,
``variant_param``, ``record_unit``, ``extra_licenses``, ``needs``, ``relation_label()``, ``provenance()``), so a
new task appears here without editing this module, and privbench's core registers the command through its
registry (``bench.registry.CLI_EXTENSIONS``) without importing it.

A *split* is a task with the parameters that select one data set. Names:

* a registered task name, e.g. ``mini_pile``, ``names2ids``, ``random_word_canaries``;
* ``pile_subset:<subset>`` for ``pile_subset`` with ``subset=<subset>`` (``pile_subset:wiki``);
* ``canaries:<prefix_type>`` for ``canaries`` with ``prefix_type=<prefix_type>`` (``canaries:rare``).

Further parameters come as ``k=v`` (``--params max_chars_per_source=300000``); values are read as
YAML (numbers, ``true``/``false``, ``[a, b]``), except for string parameters, which keep the text.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any, List, Optional

import typer

from bench.errors import ConfigError, PrivbenchError
from bench.task import built_task_data
# split names are shared with the distance report: they live in tasks.splits (re-exported here)
from tasks.splits import make_task, offline_splits, parse_name, parse_params, split_label  # noqa: F401

data_app = typer.Typer(help="Build, list and inspect the standard data splits.", no_args_is_help=True,
                       add_completion=False, pretty_exceptions_enable=False)

CACHE_HELP = "Artifact cache dir (default $PRIVBENCH_CACHE or ~/.cache/privbench)."


# ------------------------------------------------------------------------------------------ facts

def short_license(text: str) -> str:
    """A short form of a source's recorded license: an SPDX id in parentheses, else its first clause."""
    spdx = re.search(r"\(([A-Z][A-Za-z]*(?:-[A-Za-z0-9.]+)*-\d[\d.]*(?:-only|-or-later)?)\)", text)
    if spdx:
        return spdx.group(1)
    bare = re.sub(r"\s*\([^()]*\)", "", text)
    return re.split(r"[;:]", bare)[0].strip() or text


def _licenses(task) -> list[str]:
    out: list[str] = []
    try:
        infos = task.provenance()
    except PrivbenchError as exc:  # a source package is missing: say so instead of failing the listing
        return [f"unknown ({exc})"]
    for info in infos:
        lic = short_license(str(info.get("license", "")))
        if lic and lic not in out:
            out.append(lic)
    out.extend(task.extra_licenses)
    return out


def _record_unit(task) -> str:
    try:
        return task.record_unit.format(**task.config)
    except (KeyError, IndexError):
        return task.record_unit


def _built(task, cache) -> str:
    from tasks.distance import probe_artifact

    try:
        hit = probe_artifact(task, cache)
    except PrivbenchError as exc:  # e.g. a source package is missing
        return f"cannot build: {exc}"
    if hit is None:
        return "?"
    return "yes" if hit[2] else "no"


def _cache(path: Optional[str]):
    from bench.cache import ArtifactCache
    return ArtifactCache(path)


def _partition_sizes(data) -> dict[str, dict[str, int]]:
    parts = {"pretrain": data.pretrain, "heldout": data.heldout, "population": data.population,
             "adapt": data.adapt, "targets": tuple(t.text for t in data.targets)}
    return {k: {"n_records": len(v), "n_chars": sum(len(t) for t in v)} for k, v in parts.items()}


# ------------------------------------------------------------------------------------------ commands

@data_app.command("list")
def list_(
    fmt: str = typer.Option("table", "--format", "-f", help="table or json"),
    sizes: bool = typer.Option(False, "--sizes", help="Build every split (cached) and show its pool sizes."),
    cache: Optional[str] = typer.Option(None, "--cache", help=CACHE_HELP),
) -> None:
    """List the offline data splits (relation, units, licenses, built or not) and the tasks that need a source."""
    from bench.registry import TASKS
    from bench.report import format_rows

    if fmt not in ("table", "json"):
        raise ConfigError(f"unknown format '{fmt}': use table or json")
    store = _cache(cache)
    rows: list[dict[str, Any]] = []
    for name in offline_splits():
        task = make_task(name)
        row: dict[str, Any] = {"name": name, "relation": task.relation_label(), "unit": _record_unit(task),
                               "membership": "record", "licenses": _licenses(task), "built": _built(task, store)}
        if sizes:
            data = built_task_data(task, store)
            size = _partition_sizes(data)
            row.update(relation=data.relation, membership=data.unit, built="yes",
                       pretrain=size["pretrain"]["n_records"], adapt=size["adapt"]["n_records"],
                       targets=size["targets"]["n_records"], targets_chars=size["targets"]["n_chars"])
        rows.append(row)
    offline = {n.split(":")[0] for n in offline_splits()}
    needs, per_suite = [], []
    for tname in TASKS.names():
        if tname in offline:
            continue
        cls = TASKS.get(tname)
        entry = {"name": tname, "description": cls.description}
        if cls.needs:
            needs.append(dict(entry, needs=cls.needs))
        else:
            per_suite.append(entry)
    if fmt == "json":
        typer.echo(json.dumps({"splits": rows, "built_per_suite": per_suite, "needs_source": needs}, indent=2))
        return
    table = [dict(r, licenses="; ".join(r["licenses"])) for r in rows]
    cols = ["name", "relation", "unit", "membership", "built"]
    if sizes:
        cols += ["pretrain", "adapt", "targets", "targets_chars"]
    typer.echo("OFFLINE SPLITS (build with `privbench data build`)")
    typer.echo(format_rows(table, "table", columns=cols + ["licenses"]))
    typer.echo("\nBUILT WHEN A SUITE USES THEM (offline; their parameters are in `privbench list tasks`)")
    for it in per_suite:
        typer.echo(f"  {it['name']}")
        typer.echo(f"      {it['description']}")
    typer.echo("\nNEEDS A SOURCE (not built by `data build --all`)")
    for it in needs:
        typer.echo(f"  {it['name']}: needs {it['needs']}")
        typer.echo(f"      {it['description']}")


@data_app.command()
def build(
    names: Optional[List[str]] = typer.Argument(None, help="Splits to build (default: every offline split)."),
    all_: bool = typer.Option(False, "--all", help="Build every offline split (the default without names)."),
    params: Optional[List[str]] = typer.Option(None, "--params", "-p", help="Task parameter k=v for every "
                                                                           "split built (repeatable)."),
    cache: Optional[str] = typer.Option(None, "--cache", help=CACHE_HELP),
) -> None:
    """Build (and cache) data splits, one progress line per split with its build time."""
    store = _cache(cache)
    wanted = list(dict.fromkeys(([] if names and not all_ else offline_splits()) + list(names or [])))
    # every name and parameter is checked before anything is built
    tasks = [(name, make_task(name, parse_params(params, parse_name(name)[0]))) for name in wanted]
    start = time.perf_counter()
    for i, (name, task) in enumerate(tasks, 1):
        was = _built(task, store)
        t0 = time.perf_counter()
        data = built_task_data(task, store)
        dt = time.perf_counter() - t0
        state = "cached" if was == "yes" else "built"
        count = f"[{i:>{len(str(len(tasks)))}}/{len(tasks)}]"
        typer.echo(f"{count} {name:<24} {dt:6.1f}s  {state:<6} relation {data.relation:<7} "
                   f"pretrain {len(data.pretrain)}, adapt {len(data.adapt)}, targets {len(data.targets)}")
    typer.echo(f"{len(tasks)} split(s) ready in {time.perf_counter() - start:.1f}s (cache {store.root})")


@data_app.command()
def show(
    name: str = typer.Argument(..., help="Split name, e.g. mini_pile, pile_subset:wiki, canaries:rare."),
    extra: Optional[List[str]] = typer.Argument(None, metavar="[K=V]...", help="Task parameters as k=v."),
    params: Optional[List[str]] = typer.Option(None, "--params", "-p", help="Task parameter k=v (repeatable)."),
    cache: Optional[str] = typer.Option(None, "--cache", help=CACHE_HELP),
) -> None:
    """Build one split and print its partition sizes, relation, sources (license, provenance) and sample targets."""
    from bench.report import format_rows

    base, _ = parse_name(name)
    given = parse_params(list(params or []) + list(extra or []), base)
    task = make_task(name, given)
    data = built_task_data(task, _cache(cache))
    typer.echo(f"{split_label(name, given)}  (task {base} v{task.version})")
    typer.echo(f"relation: {data.relation}    membership unit: {data.unit}    record: {_record_unit(task)}")
    typer.echo(f"fingerprint: {data.fingerprint}")
    sizes = [{"partition": k, **v} for k, v in _partition_sizes(data).items()]
    typer.echo("")
    typer.echo(format_rows(sizes, "table", columns=["partition", "n_records", "n_chars"]))
    typer.echo("\nsources")
    for src in data.sources:
        head = f"  {src.get('name', '?')}"
        if src.get("version"):
            head += f" {src['version']}"
        if src.get("role"):
            head += f" (role: {src['role']})"
        typer.echo(head)
        typer.echo(f"      license: {src.get('license', 'not recorded')}")
        typer.echo(f"      provenance: {src.get('provenance', 'not recorded')}")
    typer.echo("\nsample targets")
    for rec in list(data.targets)[:3]:
        text = rec.text if len(rec.text) <= 200 else rec.text[:200] + " ..."
        typer.echo(f"  --- {rec.id} ({len(rec.text)} chars)")
        for line in text.splitlines() or [""]:
            typer.echo(f"  {line}")


@data_app.command()
def report(
    names: Optional[List[str]] = typer.Argument(None, help="Splits to compare (default: every pile subset and "
                                                           "wiki with relation overlap)."),
    n: int = typer.Option(200, "--n", help="Records sampled per set."),
    seed: int = typer.Option(0, "--seed", help="Seed of the samples."),
    pool: str = typer.Option("targets", "--pool", help="Which pool of each split: targets or adapt."),
    params: Optional[List[str]] = typer.Option(None, "--params", "-p", help="Task parameter k=v for every "
                                                                           "split (repeatable)."),
    fmt: str = typer.Option("table", "--format", "-f", help="table or json"),
    cache: Optional[str] = typer.Option(None, "--cache", help=CACHE_HELP),
) -> None:
    """Wasserstein distance of sentence embeddings between each split and the pretraining data
    (Marek et al. 2026, Table 1)."""
    from bench.report import format_rows
    from tasks.distance import (DEFAULT_SPLITS, check_ood_farther, check_report_args, distance_report,
                                ood_farther_than_iid)

    if fmt not in ("table", "json"):
        raise ConfigError(f"unknown format '{fmt}': use table or json")
    check_report_args(n, pool)
    specs = [(name, {}) for name in names] if names else list(DEFAULT_SPLITS)
    if params:
        specs = [(name, {**parse_params(params, parse_name(name)[0]), **fixed}) for name, fixed in specs]
    t0 = time.perf_counter()
    rows = distance_report(specs, n=n, seed=seed, cache=_cache(cache), pool=pool,
                           progress=lambda msg: typer.echo(msg, err=True))
    checks = {m: check_ood_farther(rows, m) for m in ("w_mean", "w_min", "w_all")}
    verdict = ood_farther_than_iid(rows)
    if fmt == "json":
        typer.echo(json.dumps({"rows": rows, "checks": checks, "ood_farther_than_iid": verdict,
                               "seconds": round(time.perf_counter() - t0, 1)}, indent=2))
        return
    sources = [k for k in dict.fromkeys(k for r in rows for k in r) if k.startswith("w:")]
    cols = ["split", "relation", "n_pool", "n", "w_mean", "w_min", "nearest", "w_all"] + sources
    typer.echo(f"W1 (Euclidean, all-MiniLM-L6-v2 embeddings) between each split's {pool} and the pretraining "
               f"data; w_mean/w_min over the mixture's sources")
    typer.echo(format_rows(rows, "table", columns=cols))
    typer.echo("\nacceptance: every ood split farther than every iid/overlap split")
    for metric, c in checks.items():
        tag = " (extra)" if metric == "w_all" else ""
        if c["holds"] is None:
            typer.echo(f"  {metric}{tag}: cannot check: needs at least one ood and one iid/overlap split")
            continue
        rel = ">" if c["holds"] else "<="
        typer.echo(f"  {metric}{tag}: {'holds' if c['holds'] else 'DOES NOT HOLD'}: min ood {c['min_far']:.4f} "
                   f"({c['min_far_split']}) {rel} max iid {c['max_near']:.4f} ({c['max_near_split']})")
        if not c["holds"]:
            pairs = ", ".join(f"{a} >= {b}" for a, b in c["violations"])
            typer.echo(f"      violating pairs (iid >= ood): {pairs}")
    typer.echo(f"ood farther than iid (w_mean and w_min): {'yes' if verdict else 'NO'}"
               f"   [{time.perf_counter() - t0:.1f}s]")
