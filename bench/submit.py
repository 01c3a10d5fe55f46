"""`privbench submit`: score a researcher's plugin on a standard suite, sandboxed, and store it as one run.

The parent process (this module's :func:`submit`) never imports the plugin. It
hashes the plugin's code, derives a content key for the submission (suite config
+ privbench code version + plugin code hash), and returns at once if that run is
already complete. Otherwise it starts a child (``python -m bench.submit --child``)
under :mod:`bench.sandbox` limits. The child installs the audit hook and runs
the suite with the suite's defenses replaced by the submitted one (or its attacks,
for an attack) into a scratch SQLite file inside the sandbox, and writes its rows
as JSON there. The submitted plugin is never imported into the child, whose runner holds the
draw: its code runs in worker processes of its own (:mod:`bench.plugin_worker`),
a defense's calls with θ and its data, an attack's games with the attacker view
and handles to the released models. Evaluation rows stay in memory until the
last game is scored, so no label is on disk while a worker lives. The parent, the single writer of the results
database, validates those rows (shapes, finiteness, AUC recomputed from the
scores) and stores them; a plugin that crashes, hangs, exceeds a limit or
breaks the sandbox leaves exactly one row: a failed run carrying the error.

Labels never come from the child: every world of a submission is drawn with a
fresh secret (handed to the child on its standard input, never on disk or in
its environment), and the parent, which built the task data before the child
started, redraws each world with that secret and checks every evaluation's world
key, target ids and labels against its own (:func:`expected_labels`); a result
whose labels differ is rejected.

The shared artifact cache is read-only to the child: it reads it through a
:class:`bench.cache.OverlayCache` and writes every new artifact and signal shard
into a private overlay inside its sandbox (``cache-overlay``), which the parent
deletes once the child has ended, without promoting anything from it into the
shared cache. Everything the child built was built in a process that had already
imported the submitted code, so none of it is evidence of what its content key
names: a manifest's checksums, written by the same process, only show that the
files are the ones it wrote. A later trusted ``privbench run`` therefore never
reads a file a submission wrote (docs/submitting.md).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import secrets
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench.errors import ConfigError, PluginError, PrivbenchError
from bench.hashing import code_version, content_hash
from bench.plugin_ref import PluginRef, resolve_plugin
from bench.sandbox import FAILURE_EXIT, MEMORY_EXIT, VIOLATION_EXIT, Limits, run_sandboxed

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULT_FILE = "result.json"
# modules privbench or its libraries import lazily mid-run; some probe sockets or run programs on import
VIOLATION_FILE = "violation.json"


@dataclass
class SubmitResult:
    run_id: int
    status: str           # complete, failed, or unchanged (an identical submission was already complete)
    error: str | None
    plugin: str
    run_key: str
    seconds: float
    isolation: str | None = None


def submission_key(suite_config: dict, plugin: PluginRef, extend: bool) -> str:
    """Content key of a submission: what is run (suite, privbench code) and what is scored (plugin code)."""
    return content_hash("submission", suite_config, code_version(), plugin.code_hash, bool(extend))


def _find_run(store, run_key: str) -> dict | None:
    from bench.errors import StoreError
    try:
        run_id = store.resolve_run(run_key)
    except StoreError:
        return None
    info = store.run_info(run_id)
    return info if info["run_key"] == run_key else None


def submit(ref: str, *, suite: str = "smoke", db: str = "sqlite:///results.db", cache: str | None = None,
           submitter: str | None = None, limits: Limits = Limits(), extend: bool = False,
           sandbox_dir: str | None = None, keep_sandbox: bool = False, log=None,
           track: str | None = None) -> SubmitResult:
    """Run the plugin ``ref`` (a .py file or an entry-point name) on ``suite`` (or on ``track``, beside the track's
    anchors, where it is ranked) in a sandbox; store one run."""
    from bench.cache import OVERLAY_DIR, ArtifactCache, check_cache_root, discard_overlay, overlay_summary
    from bench.fork_server import worker_start
    from bench.sandbox import check_apart
    from bench.store import Store
    from bench.suite import load_suite, parse_suite

    log = log or (lambda msg: None)
    t0, started = time.perf_counter(), datetime.now(timezone.utc)
    plugin = resolve_plugin(ref)
    base = parse_suite({"track": track, "defenses": []}) if track is not None else load_suite(suite)
    where = ["--track", track] if track is not None else ["--suite", suite]
    run_key = submission_key(base.config, plugin, extend)
    check_cache_root(cache)  # an unusable cache is refused before the database is created or touched
    worker_start()  # so is an unknown PRIVBENCH_WORKER_START
    store = Store(db, create=True)
    store.check_writable("store a submission")  # a read-only database is found now, not after the sandboxed run
    verified = os.environ.get("CI", "").lower() == "true"
    previous = _find_run(store, run_key)
    if previous is not None and previous["status"] == "complete":
        log(f"run {previous['id']}: plugin '{plugin.label}' (code {plugin.code_hash}) is already scored on suite "
            f"'{base.name}': nothing to do")
        return SubmitResult(previous["id"], "unchanged", None, plugin.label, run_key, time.perf_counter() - t0)
    cache_root = ArtifactCache(cache).root.resolve()
    if sandbox_dir:
        check_apart(Path(sandbox_dir).resolve(), [cache_root])
    draw_secret = os.environ.get("PRIVBENCH_DRAW_SECRET") or secrets.token_hex(16)
    # the labels, drawn here, before any plugin code runs (task data built by trusted code only)
    truth = expected_labels(base, ArtifactCache(cache_root), draw_secret)
    box = Path(sandbox_dir).resolve() if sandbox_dir else Path(tempfile.mkdtemp(prefix="privbench-submit-"))
    box.mkdir(parents=True, exist_ok=True)
    overlay = box / OVERLAY_DIR  # the child's writable cache; the shared one is read-only to it
    spec = {"plugin": plugin.to_dict(), "suite_raw": base.raw, "suite_path": base.path, "extend": extend,
            "run_key": run_key, "cache": str(cache_root), "overlay": str(overlay), "sandbox": str(box)}
    (box / "spec.json").write_text(json.dumps(spec, default=str))
    env = dict(os.environ, PRIVBENCH_CACHE=str(overlay),
               PYTHONPATH=os.pathsep.join([str(REPO_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(
                   os.pathsep) if p]))
    log(f"plugin '{plugin.label}' (code {plugin.code_hash}) on suite '{base.name}' in sandbox {box} "
        f"({limits.describe()})")
    try:
        relay = ProgressRelay(box / PROGRESS_FILE, log)
        res = run_sandboxed([sys.executable, "-m", "bench.submit", "--child", str(box / "spec.json")], sandbox=box,
                            limits=limits, env={k: v for k, v in env.items() if k != "PRIVBENCH_DRAW_SECRET"},
                            violation_file=box / VIOLATION_FILE, stdin_data=(draw_secret + "\n").encode(),
                            read_only=[cache_root], on_wait=relay)
    finally:
        # nothing the child built is promoted into the shared cache (module docstring): the overlay goes
        left = overlay_summary(overlay)
        discard_overlay(overlay)
        log(f"cache overlay discarded ({left['artifacts']} artifacts, {left['signal_shards']} signal shards built "
            f"in the sandbox; nothing from a sandbox enters the shared cache)")
    log(f"sandbox isolation: {res.isolation}")
    error = res.failure()
    payload: dict[str, Any] | None = None
    if error is None:
        try:
            payload = json.loads((box / RESULT_FILE).read_text())
            if not isinstance(payload, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as exc:
            error = f"the plugin run left no readable result ({type(exc).__name__}: {exc}): see {box}/child.stderr"
        else:
            if payload.get("status") != "complete":
                error = str(payload.get("error") or f"the plugin run failed (exit {res.returncode})")
                if res.returncode == MEMORY_EXIT:
                    error = res.failure() or error
    if error is None:
        try:
            rows = validate_rows(payload)
            check_labels(rows["evaluations"], truth)
        except PluginError as exc:
            error = f"the plugin run returned invalid results: {exc}"
    provisional = {"submission": plugin.to_dict(), "suite": base.config, "extend": extend}
    config = dict(payload.get("config") or {}, submission=plugin.to_dict()) if payload and error is None \
        else provisional
    versions = dict(payload.get("plugin_versions") or {}) if payload and error is None else {}
    versions["submission"] = f"{plugin.label}@{plugin.code_hash}"
    run_id, _ = store.begin_run(run_key=run_key, suite=base.name, config=config, config_hash=content_hash(config),
                                code_version=code_version(), plugin_versions=versions, seeds=base.seeds,
                                hardware=(payload or {}).get("hardware") or {},
                                command=" ".join(["privbench", "submit", ref, *where]),
                                submitted_by=submitter, started_at=started)
    store.mark_submission(run_id, submitter=submitter, verified=verified)
    if error is None:
        try:
            _store_rows(store, run_id, rows)
        except PrivbenchError as exc:
            error = f"the plugin run's results could not be stored: {exc}"
    status = "failed" if error else "complete"
    store.finish_run(run_id, status=status, error=error, duration_s=time.perf_counter() - t0)
    store.close()
    if not keep_sandbox and status == "complete" and not sandbox_dir:
        shutil.rmtree(box, ignore_errors=True)
    if error is None:  # a failure is the caller's to report (the CLI's error line): not said twice
        log(f"run {run_id} complete")
    return SubmitResult(run_id, status, error, plugin.label, run_key, time.perf_counter() - t0, res.isolation)


# --------------------------------------------------------------------------------- validating child rows

def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise PluginError(msg)


def validate_rows(payload: dict) -> dict:
    """Check the child's rows before anything touches the database; recompute each AUC from its scores."""
    from bench.metrics import roc_auc
    evs = payload.get("evaluations")
    _need(isinstance(evs, list) and evs, "no evaluations: the run produced no scores")
    text = ("eval_key", "task", "model", "defense", "game", "attack", "world_key")
    for ev in evs:
        _need(isinstance(ev, dict), "an evaluation is not a JSON object")
        for k in text:
            _need(isinstance(ev.get(k), str) and ev[k], f"an evaluation lacks '{k}'")
        ids, labels, scores = ev.get("target_ids"), ev.get("labels"), ev.get("scores")
        _need(all(isinstance(x, list) for x in (ids, labels, scores)) and len(ids) == len(labels) == len(scores)
              and ids, f"evaluation {ev['eval_key']}: target_ids, labels and scores must be equal-length lists")
        _need(all(lab in (0, 1) for lab in labels), f"evaluation {ev['eval_key']}: labels must be 0 or 1")
        _need(all(isinstance(s, (int, float)) and math.isfinite(s) for s in scores),
              f"evaluation {ev['eval_key']}: every score must be a finite number")
        metrics = ev.get("metrics")
        _need(isinstance(metrics, list) and metrics, f"evaluation {ev['eval_key']}: no metric rows")
        auc = [m for m in metrics if isinstance(m, dict) and m.get("metric") == "auc"]
        _need(len(auc) == 1, f"evaluation {ev['eval_key']}: expected one AUC row")
        if 0 < sum(labels) < len(labels):
            expected = roc_auc(labels, scores)
            _need(abs(float(auc[0]["value"]) - expected) <= 1e-6,
                  f"evaluation {ev['eval_key']}: stored AUC {auc[0]['value']} is not the AUC of its scores "
                  f"({expected:.6f})")
    for u in payload.get("utility") or []:
        _need(isinstance(u, dict) and isinstance(u.get("values"), dict), "a utility row is malformed")
        _need(all(isinstance(v, (int, float)) and math.isfinite(v) for v in u["values"].values()),
              f"utility of {u.get('defense')}: values must be finite numbers")
    return {"evaluations": evs, "utility": payload.get("utility") or [], "guarantees": payload.get("guarantees") or []}


def expected_labels(suite, cache, draw_secret: str) -> dict[tuple[str, int, str], tuple[str, dict[str, int]]]:
    """The challenger's truth for every (task, seed, game) of ``suite``: (world key, target id -> label).

    Computed in the parent from built-in task plugins (a submission replaces defenses or attacks, never tasks),
    with the submission's secret draw, so nothing the child sends back can change it.
    """
    from bench.game import Challenger
    out: dict[tuple[str, int, str], tuple[str, dict[str, int]]] = {}
    for t in suite.tasks:
        data = t.instance.build(cache)
        for seed in suite.seeds:
            ch = Challenger(data, suite.world, seed, secret=draw_secret)
            for game in suite.games:
                if game.name not in ch.games_defined():
                    continue
                inst = ch.instance(game)
                out[(t.label, int(seed), game.name)] = (
                    ch.world_key, {tgt.id: int(y) for tgt, y in zip(inst.targets, inst.labels)})
    return out


def check_labels(evaluations: list[dict], truth: dict) -> None:
    """Every evaluation must carry the parent's world key, target ids and labels; else the run is rejected."""
    for ev in evaluations:
        key = (ev["task"], int(ev["seed"]), ev["game"])
        _need(key in truth, f"evaluation {ev['eval_key']}: task {key[0]!r}, seed {key[1]}, game {key[2]!r} is not "
                            f"a world of the submitted suite")
        world_key, labels = truth[key]
        _need(ev["world_key"] == world_key, f"evaluation {ev['eval_key']}: world key differs from the "
                                            f"challenger's: the run did not score the drawn world")
        _need(sorted(ev["target_ids"]) == sorted(labels), f"evaluation {ev['eval_key']}: target ids differ from "
                                                          f"the challenger's")
        _need(all(labels[i] == int(y) for i, y in zip(ev["target_ids"], ev["labels"])),
              f"evaluation {ev['eval_key']}: labels differ from the challenger's: rejected")


def _store_rows(store, run_id: int, rows: dict) -> None:
    for ev in rows["evaluations"]:
        store.write_evaluation(
            run_id, ev["eval_key"], task=ev["task"], model=ev["model"], defense=ev["defense"],
            defense_params=ev.get("defense_params") or {}, seed=ev["seed"], game=ev["game"], attack=ev["attack"],
            attack_params=ev.get("attack_params") or {}, world_key=ev["world_key"], target_ids=ev["target_ids"],
            labels=ev["labels"], scores=ev["scores"], metrics=ev["metrics"], duration_s=ev.get("duration_s", 0.0))
    for u in rows["utility"]:
        store.write_utility(run_id, content_hash(u["task"], u["model"], u["defense"], u["seed"], u["role"],
                                                 u["dataset"]),
                            task=u["task"], model=u["model"], defense=u["defense"], seed=u["seed"], role=u["role"],
                            dataset=u["dataset"], values=u["values"], n_tokens=u["n_tokens"])
    for g in rows["guarantees"]:
        store.write_guarantee(run_id, task=g["task"], model=g["model"], defense=g["defense"], seed=g["seed"],
                              name=g["name"], value=g["value"], details=g["details"] or {})


# --------------------------------------------------------------------------------- the child

PROGRESS_FILE = "progress.log"


class ProgressRelay:
    """The parent's end of the child's progress lines (``progress.log`` in the sandbox, written by the child's
    trusted runner; the plugin's workers cannot write there): each new complete line, shown once, through
    ``log``, with anything unprintable dropped."""

    def __init__(self, path: Path, log) -> None:
        self.path, self.log, self.offset = path, log, 0

    def __call__(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        end = data.rfind(b"\n")
        if end < 0:
            return
        self.offset += end + 1
        for raw in data[:end].split(b"\n"):
            line = "".join(c for c in raw.decode("utf-8", "replace") if c.isprintable())[:300]
            if line:
                self.log(line)


def submission_suite(raw: dict, kind: str, name: str, extend: bool) -> dict:
    """The suite with its defenses (or attacks) replaced, or extended, by the submitted plugin. An entry of the
    suite that names the plugin with parameters is refused: a submission runs the plugin's defaults."""
    raw = dict(raw)
    key = "defenses" if kind == "defense" else "attacks"
    own = list(raw.get(key) or [])
    for entry in own:
        if isinstance(entry, dict) and entry.get("name") == name and entry.get("params"):
            raise ConfigError(f"the suite gives the submitted {kind} '{name}' parameters {sorted(entry['params'])}, "
                              f"but a submission runs a plugin with its default parameters: make them the plugin's "
                              f"defaults (a new version), or drop `params` from the suite")
    named = (lambda e: (e.get("name") if isinstance(e, dict) else e) == name)
    raw[key] = ([e for e in own if not named(e)] if extend else []) + [{"name": name}]
    return raw


def export_rows(store, run_id: int) -> dict:
    """Everything a run wrote to the child's scratch store, as plain JSON for the parent."""
    metrics: dict[tuple, list] = {}
    for m in store.metric_rows(run_id):
        k = (m["task"], m["model"], m["defense"], m["seed"], m["game"], m["attack"])
        metrics.setdefault(k, []).append({f: m[f] for f in ("metric", "value", "ci_low", "ci_high", "n_pos",
                                                            "n_neg", "flag")})
    evs = []
    for e in store.evaluations(run_id):
        ids, labels, scores = store.scores_for(e["id"])
        k = (e["task"], e["model"], e["defense"], e["seed"], e["game"], e["attack"])
        evs.append({**{f: e[f] for f in ("eval_key", "task", "model", "defense", "defense_params", "seed", "game",
                                         "attack", "attack_params", "world_key", "duration_s")},
                    "target_ids": ids, "labels": labels, "scores": scores, "metrics": metrics.get(k, [])})
    util: dict[tuple, dict] = {}
    for u in store.utility_rows(run_id):
        k = (u["task"], u["model"], u["defense"], u["seed"], u["role"], u["dataset"])
        row = util.setdefault(k, {"task": k[0], "model": k[1], "defense": k[2], "seed": k[3], "role": k[4],
                                  "dataset": k[5], "values": {}, "n_tokens": u["n_tokens"]})
        row["values"][u["metric"]] = u["value"]
    guarantees = [{f: g[f] for f in ("task", "model", "defense", "seed", "name", "value", "details")}
                  for g in store.guarantee_rows(run_id)]
    return {"evaluations": evs, "utility": list(util.values()), "guarantees": guarantees}


def _child(spec_path: str) -> int:
    """In the sandbox: trusted imports, then the guard; a defense in workers (bench/plugin_worker.py), an attack
    imported here; rows go to result.json."""
    spec = json.loads(Path(spec_path).read_text())
    box = Path(spec["sandbox"])
    draw_secret = sys.stdin.readline().strip() or None  # from the parent's pipe, before any plugin code runs
    sys.stdin.close()
    out = box / RESULT_FILE

    def write(obj: dict) -> None:
        tmp = box / (RESULT_FILE + ".tmp")
        tmp.write_text(json.dumps(obj, default=str))
        os.replace(tmp, out)

    from bench.fork_server import ForkServer, fork_server_usable
    from bench.plugin_worker import WORKERS_DIR, worker_env

    # the server that forks the plugin's workers starts first: it imports torch and transformers while this
    # process does the same (bench/fork_server.py)
    server = None
    if fork_server_usable():
        where = box / WORKERS_DIR / "server"
        for sub in ("home", "tmp"):
            (where / sub).mkdir(parents=True, exist_ok=True)
        server = ForkServer(where, worker_env(box, where))
    from bench.cache import OverlayCache
    from bench.plugin_ref import PluginRef
    from bench.plugin_worker import (WorkerIsolation, WorkerSession, WorkerViolation, make_non_dumpable,
                                     spawn_allowed, worker_attack, worker_defense)
    from bench.sandbox import arm_sandbox, preload_trusted

    # the shared cache read-only, new artifacts and signal shards into the overlay inside the sandbox
    cache = OverlayCache(spec["cache"], spec["overlay"])
    make_non_dumpable()  # this process will hold the draw: no /proc/<pid>/mem or ptrace for the plugin's workers
    isolation = WorkerIsolation.probe([spec["cache"]])  # probed now: it starts programs
    isolation = dataclasses.replace(isolation, server=server)
    # the parent relays these lines while the child runs (ProgressRelay): how the workers are isolated, then the jobs
    progress = open(box / PROGRESS_FILE, "a", encoding="utf-8", buffering=1)
    progress.write(f"plugin workers: {isolation.describe()}\n")
    violation = box / VIOLATION_FILE
    plugin = PluginRef(**spec["plugin"])
    try:
        # the plugin's kind, name and defaults, from a worker: the plugin is never imported here. The worker
        # starts first and this process does its own trusted imports while it loads (no registry is read, so no
        # installed plugin is imported, until builtins_only below)
        with WorkerSession(plugin, box, violation, isolation) as w:
            preload_trusted()
            from bench.registry import builtins_only, register_attack, register_defense
            from bench.runner import Runner
            from bench.store import Store
            from bench.suite import parse_suite
            info = w.info
        builtins_only()  # no installed plugin, the submitted one included, is imported into this process
        kind, name = info["kind"], info["name"]
        if kind == "defense":
            cls = register_defense(name)(worker_defense(plugin, info, box, violation, isolation))
        else:
            cls = register_attack(name)(worker_attack(plugin, info, box, violation, isolation))
        hardware = arm_sandbox(box, violation, may_spawn=spawn_allowed(box),
                               sockets=() if server is None else (server.sock,))
        suite = parse_suite(submission_suite(spec["suite_raw"], kind, name, spec["extend"]), path=spec["suite_path"])


        class SubmissionRunner(Runner):
            def log(self, msg: str) -> None:  # job by job, for the parent to relay (ProgressRelay)
                progress.write(msg.replace("\n", " ") + "\n")

            @property
            def run_key(self) -> str:  # the plugin's code is part of what was run
                return content_hash(super().run_key, plugin.code_hash)

            def plugin_versions(self) -> dict[str, str]:
                out = super().plugin_versions()
                out[f"{kind}:{name}"] = f"{cls.version}+{plugin.code_hash}"
                return out

            def _run(self, run_id: int) -> None:
                """Evaluation rows (they hold labels) are kept in memory until the last game is scored, so no
                label is on disk while any worker of the plugin runs."""
                self._held: list = []
                super()._run(run_id)
                for held in self._held:
                    Runner.apply(self, *held)

            def apply(self, run_id: int, job, result) -> None:
                if job.kind == "evaluate":
                    self._held.append((run_id, job, result))
                else:
                    super().apply(run_id, job, result)

        store = Store(f"sqlite:///{box / 'scratch.db'}")
        runner = SubmissionRunner(suite, store, cache, quiet=True, draw_secret=draw_secret)
        result = runner.run()
        rows = export_rows(store, result.run_id)
        write({"status": "complete", "config": suite.config, "plugin_versions": runner.plugin_versions(),
               "plugin": {"kind": kind, "name": name, "version": cls.version}, "hardware": hardware,
               **rows})
        return 0
    except WorkerViolation:  # the worker wrote its report; end as it did
        return VIOLATION_EXIT
    except MemoryError:
        write({"status": "failed", "error": "memory limit exceeded (MemoryError)"})
        return MEMORY_EXIT
    except BaseException as exc:  # noqa: BLE001 - every failure of the plugin becomes a failed run
        if isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc).lower():
            write({"status": "failed", "error": "memory limit exceeded (a tensor allocation failed)"})
            return MEMORY_EXIT
        msg = str(exc) if isinstance(exc, PrivbenchError) else f"the plugin raised {type(exc).__name__}: {exc}"
        write({"status": "failed", "error": msg.splitlines()[0][:2000] if msg else type(exc).__name__})
        return FAILURE_EXIT
    finally:
        if server is not None:
            server.close()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        sys.stdout.flush()
        os._exit(_child(sys.argv[2]))
    raise SystemExit("error: usage: python -m bench.submit --child SPEC.json (use `privbench submit` instead)")
