"""Runs a suite: the run's lifecycle in the database, around a job graph.

The runner is the single writer of the database. It plans the suite's jobs
(bench/plan.py: each named by the content key of what it produces, bench/keys.py),
hands them to an executor (bench/executors.py: in process or Ray) that runs the
job functions (bench/jobs.py) against the suite's lazily built worlds
(bench/world.py), and writes the rows (bench/schema.py) they hand back. Every
evaluation is keyed by content, so a rerun skips what is stored and a killed run
resumes where it stopped; model artifacts and per-token signals come from the cache.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from bench.allocator import tune_allocator
from bench.cache import ArtifactCache
from bench.device import configure_determinism, select_device, set_threads
from bench.errors import PrivbenchError
from bench.hashing import code_version, content_hash
from bench.jobs import JobResult, run_job
from bench.keys import retained_key
from bench.schema import UtilityRow
from bench.store import Store
from bench.suite import Suite
from bench.world import Worlds

__all__ = ["JobResult", "LocalExecutor", "RunResult", "Runner", "hardware_info"]


@dataclass
class RunResult:
    run_id: int
    status: str
    new_evaluations: int
    skipped_evaluations: int
    seconds: float


def cpu_model() -> str:
    """The CPU's name and, on Linux, its family/model/stepping: two CPUs that report the same generic name
    ("Intel(R) Xeon(R) Processor") can sum floats in a different order (docs/determinism.md), so a run
    records which one it ran on."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            fields: dict[str, str] = {}
            for line in fh:
                if not line.strip():
                    break  # the first processor's block describes them all
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor() or platform.machine()
    name = fields.get("model name") or platform.processor() or platform.machine()
    ids = [f"{k} {fields[k]}" for k in ("cpu family", "model", "stepping") if k in fields]
    return f"{name} ({', '.join(ids)})" if ids else name


def hardware_info() -> dict:
    info = {"platform": platform.platform(), "python": sys.version.split()[0], "torch": torch.__version__,
            "cpu": cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(), "cuda": torch.cuda.is_available()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def _log(msg: str) -> None:
    print(f"[privbench] {msg}", file=sys.stderr, flush=True)


class LocalExecutor:
    """In process, in plan order: what the runner always did."""

    name = "local"

    def execute(self, runner, plan, apply: Callable[[object, object], None]) -> None:
        todo = [j for j in plan.jobs.values() if not j.done]
        for i, job in enumerate(todo, 1):
            runner.log(f"job {i}/{len(todo)} {job.kind}: {job.label}")
            apply(job, runner.run_job(job))


class Runner:
    def __init__(self, suite: Suite, store: Store | None, cache: ArtifactCache, *, command: str | None = None,
                 quiet: bool = False, executor=None, draw_secret: str | None = None) -> None:
        self.suite = suite
        #: salts every world's draw (bench.game.Challenger); None = the public, reproducible draw
        self.draw_secret = draw_secret
        self.store = store
        self.cache = cache
        self.command = command
        self.quiet = quiet
        self.code_version = code_version()
        self.executor = executor  # None: in-process (bench.executors.LocalExecutor)
        self.done_evals: set[str] = set()
        #: the suite's worlds, built lazily from the cache (bench/world.py)
        self.worlds = Worlds(suite, cache, draw_secret=draw_secret, quiet=quiet, log=self.log)

    def log(self, msg: str) -> None:
        if not self.quiet:
            _log(msg)

    @property
    def draw(self) -> str:
        """How worlds were drawn: "public" (reproducible from the suite) or "secret:<id>" (salted, see docs/attacks.md)."""
        if self.draw_secret is None:
            return "public"
        return "secret:" + content_hash("world-secret-id", self.draw_secret, length=10)

    @property
    def run_key(self) -> str:
        key = [self.suite.config, self.code_version]
        return content_hash(*key) if self.draw_secret is None else content_hash(*key, self.draw)

    @property
    def run_config(self) -> dict:
        """The suite's config as stored with the run, with how its worlds were drawn."""
        return dict(self.suite.config, draw=self.draw)

    @property
    def device(self) -> torch.device:
        return select_device(self.suite.device)

    def plugin_versions(self) -> dict[str, str]:
        s = self.suite
        out = {f"attack:{e.name}": e.instance.version for e in s.attacks}
        out.update({f"defense:{e.name}": e.instance.version for e in s.defenses})
        out.update({f"task:{e.name}": e.instance.version for e in s.tasks})
        return out

    def run(self) -> RunResult:
        set_threads()
        tune_allocator()
        configure_determinism()
        t0 = time.perf_counter()
        s = self.suite
        _ = self.device  # an unavailable device is refused before the run is recorded
        run_id, previous = self.store.begin_run(
            run_key=self.run_key, suite=s.name, config=self.run_config, config_hash=s.config_hash,
            code_version=self.code_version, plugin_versions=self.plugin_versions(), seeds=s.seeds,
            hardware=hardware_info(), command=self.command)
        if previous == "complete":
            self.log(f"run {run_id} of suite '{s.name}' is already complete for this code version: nothing to do")
            return RunResult(run_id, "complete", 0, 0, time.perf_counter() - t0)
        self.log(f"run {run_id}: suite '{s.name}' ({'resuming' if previous != 'new' else 'new'}), "
                 f"code {self.code_version}")
        self._new = self._skipped = 0
        try:
            self._run(run_id)
        except BaseException as exc:
            msg = str(exc) if isinstance(exc, PrivbenchError) else f"{type(exc).__name__}: {exc}"
            self.store.finish_run(run_id, status="failed", error=msg, duration_s=time.perf_counter() - t0)
            raise
        dt = time.perf_counter() - t0
        self.store.finish_run(run_id, status="complete", duration_s=dt)
        self.log(f"run {run_id} complete in {dt:.1f}s: {self._new} new evaluations, {self._skipped} already stored")
        return RunResult(run_id, "complete", self._new, self._skipped, dt)

    def _run(self, run_id: int) -> None:
        from bench.plan import build_plan
        self.done_evals = {e["eval_key"] for e in self.store.evaluations(run_id)}
        plan = build_plan(self, run_id)
        self.log(f"plan: {len(plan.jobs)} jobs, {sum(j.done for j in plan.jobs.values())} already done")
        self._skipped += sum(j.done for j in plan.jobs.values() if j.kind == "evaluate")
        (self.executor or LocalExecutor()).execute(self, plan, lambda job, res: self.apply(run_id, job, res))
        self._write_retained(run_id)

    def _write_retained(self, run_id: int) -> None:
        """Utility retained of every adapted model, per world, against the world's θ and `finetune` anchor.

        Computed by the driver from the stored held-out losses once every utility job is done (so a resumed run
        recomputes it, idempotently): (L(θ) − L(θ′)) / (L(θ) − L(θ′_finetune)) (bench/tracks.py). A world where
        fine-tuning did not lower the held-out loss has no meaningful ratio and gets none (logged)."""
        from bench.tracks import utility_retained
        if self.suite.retained_anchor is None:
            return
        loss = {(r["task"], r["model"], r["seed"], r["role"], r["defense"]): r["value"]
                for r in self.store.utility_rows(run_id) if r["dataset"] == "heldout" and r["metric"] == "loss"}
        for (task, model, seed, role, defense), value in sorted(loss.items()):
            if role != "adapted":
                continue
            base, ft = loss.get((task, model, seed, "pretrained", "-")), loss.get((task, model, seed, "adapted",
                                                                                   "finetune"))
            if base is None or ft is None:
                continue
            retained = utility_retained(base, ft, value)
            if retained is None:
                self.log(f"{task} / {model} seed {seed}: finetune did not lower the held-out loss ({base:.3f} → "
                         f"{ft:.3f}), so utility retained is undefined in this world")
                continue
            self.store.write_row(run_id, UtilityRow(
                retained_key(task, model, seed, defense, base, ft, value), task=task, model=model, defense=defense,
                seed=seed, role="adapted", dataset="retained", n_tokens=0,
                values={"utility_retained": retained, "gain_nats": base - value, "finetune_gain_nats": base - ft}))

    def apply(self, run_id: int, job, result: JobResult) -> None:
        """The driver's side of a finished job: write its rows (the driver is the database's only writer)."""
        for row in result.rows:
            self.store.write_row(run_id, row)
        self._new += result.new
        self._skipped += result.skipped

    def run_job(self, job) -> JobResult:
        """Run one job of the plan (in this process or a Ray worker) and return its rows."""
        return run_job(self.worlds, job.params, done_evals=self.done_evals)
