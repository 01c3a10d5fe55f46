"""Runs a suite: worlds → θ, reference, θ' per defense → every game × attack → scores, metrics, utility.

The runner is the single writer of the database. Its structure is a job graph
(bench/plan.py): each job is one of the runner's job functions below, named by
the content key of what it produces; an executor (bench/executors.py: in-process
or Ray) runs the jobs and hands their rows back to the runner, which writes them.
Every evaluation is keyed by content, so a rerun skips what is stored and a
killed run resumes where it stopped; model artifacts and per-token signals come
from the cache.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from bench.artifacts import ensure_adapted, ensure_pretrained, ensure_reference, ensure_tokenizer, pretrains
from bench.attack import MetricContext, evaluate_attack
from bench.blind import applies_to as blind_applies, blind_baseline
from bench.cache import ArtifactCache
from bench.device import (configure_determinism, release_memory, score_bf16, select_device, set_threads,
                          tune_allocator)
from bench.errors import ConfigError, DataError, PluginError, PrivbenchError
from bench.game import AdaptationData, Challenger, ShadowSet
from bench.lm import FINETUNE_REFERENCE, SHADOW_MODELS
from bench.hashing import code_version, content_hash
from bench.lm import HFLanguageModel, SignalCache
from bench.metrics import flag_underpowered_null, membership_metrics
from bench.modeling import ModelSpec, load_model
from bench.release import is_release, load_release
from bench.store import Store
from bench.matching import candidate_params, pick
from bench.registry import DEFENSES
from bench.suite import PluginEntry, Suite
from bench.utility import generation_metrics, heldout_metrics


@dataclass
class RunResult:
    run_id: int
    status: str
    new_evaluations: int
    skipped_evaluations: int
    seconds: float


def hardware_info() -> dict:
    info = {"platform": platform.platform(), "python": sys.version.split()[0], "torch": torch.__version__,
            "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(), "cuda": torch.cuda.is_available()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def _log(msg: str) -> None:
    print(f"[privbench] {msg}", file=sys.stderr, flush=True)


@dataclass
class JobResult:
    """What a job hands back to the driver: rows to write (table, fields) and evaluation counts."""

    writes: list[tuple[str, dict]] = field(default_factory=list)
    new: int = 0
    skipped: int = 0


class LocalExecutor:
    """In process, in plan order: what the runner always did."""

    name = "local"

    def execute(self, runner, plan, apply: Callable[[object, object], None]) -> None:
        todo = [j for j in plan.jobs.values() if not j.done]
        for i, job in enumerate(todo, 1):
            runner.log(f"job {i}/{len(todo)} {job.kind}: {job.label}")
            apply(job, runner.run_job(job))


#: language models kept loaded at once per process; older ones are dropped and their memory released
LM_MEMO_SIZE = 4


class Runner:
    def __init__(self, suite: Suite, store: Store | None, cache: ArtifactCache, *, command: str | None = None,
                 quiet: bool = False, executor=None, draw_secret: str | None = None) -> None:
        self.suite = suite
        #: salts every world's draw (bench.game.Challenger); None = the public, reproducible draw
        self.draw_secret = draw_secret
        self.store = store
        self.cache = cache
        self.signals = SignalCache.for_cache(cache)
        self.command = command
        self.quiet = quiet
        self.code_version = code_version()
        self.executor = executor  # None: in-process (bench.executors.LocalExecutor)
        self.done_evals: set[str] = set()
        self._memo: dict = {}
        self._lms: OrderedDict[str, HFLanguageModel] = OrderedDict()

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
            self.store.write_utility(run_id, content_hash("retained", task, model, seed, defense, base, ft, value),
                                     task=task, model=model, defense=defense, seed=seed, role="adapted",
                                     dataset="retained", values={"utility_retained": retained,
                                                                 "gain_nats": base - value,
                                                                 "finetune_gain_nats": base - ft},
                                     n_tokens=0)

    def apply(self, run_id: int, job, result: JobResult) -> None:
        """The driver's side of a finished job: write its rows (the driver is the database's only writer)."""
        for table, fields in result.writes:
            if table == "evaluation":
                self.store.write_evaluation(run_id, **fields)
            elif table == "utility":
                self.store.write_utility(run_id, **fields)
            elif table == "guarantee":
                self.store.write_guarantee(run_id, **fields)
            else:  # pragma: no cover - a job function bug
                raise PluginError(f"job {job.label} returned rows for unknown table {table!r}: fix the job function")
        self._new += result.new
        self._skipped += result.skipped

    # -- state a job function needs, rebuilt from the cache in any process, memoized -------------------
    def _once(self, key, make):
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def _data(self, ti: int):
        t = self.suite.tasks[ti]
        return self._once(("data", ti), lambda: t.instance.build(self.cache))

    def _tokenizer(self, ti: int, mi: int):
        spec = self.suite.models[mi]
        if spec.source != "scratch":
            return None
        return self._once(("tok", ti, mi), lambda: ensure_tokenizer(self.cache, spec, self._data(ti)))

    def _reference_base(self, ti: int, mi: int):
        """(path, key) of the attacker's reference model, or None when the suite has none."""
        s, spec = self.suite, self.suite.models[mi]
        if not (s.reference and spec.source == "scratch"):
            return None

        def make():
            data = self._data(ti)
            # with shadows, the reference model trains on its own slice of the population, disjoint from
            # the shadows' slices and from RMIA's sample Z; without them, on all of it
            ref_texts = self._population_split(data)["reference"] if self._needs_shadows() else None
            return ensure_reference(self.cache, spec, data, self._tokenizer(ti, mi), self.device,
                                    progress=not self.quiet, texts=ref_texts)
        return self._once(("ref", ti, mi), make)

    def _challenger(self, ti: int, seed: int) -> Challenger:
        return self._once(("ch", ti, seed), lambda: Challenger(self._data(ti), self.suite.world, seed,
                                                               secret=self.draw_secret))

    def _base(self, ti: int, mi: int, seed: int):
        spec = self.suite.models[mi]
        return self._once(("base", ti, mi, seed), lambda: ensure_pretrained(
            self.cache, spec, self._data(ti), self._tokenizer(ti, mi), self._challenger(ti, seed).pretraining_inserts(),
            seed, self.device, progress=not self.quiet))

    def _theta(self, ti: int, mi: int, seed: int, di: int | None = None):
        """(path, key) of θ for defense ``di``: the world's shared θ, or, for a defense acting at pretraining
        (dedup, goldfish), θ pretrained through its hooks (bench/artifacts.ensure_pretrained)."""
        if di is None or not pretrains(self.suite.defenses[di].instance):
            return self._base(ti, mi, seed)
        spec, d = self.suite.models[mi], self.suite.defenses[di]
        return self._once(("base", ti, mi, seed, d.label), lambda: ensure_pretrained(
            self.cache, spec, self._data(ti), self._tokenizer(ti, mi), self._challenger(ti, seed).pretraining_inserts(),
            seed, self.device, progress=not self.quiet, defense=d.instance))

    def _defense(self, ti: int, mi: int, seed: int, di: int) -> PluginEntry:
        """The defense entry of this world: as configured, or with its ``match`` parameter tuned (bench/matching.py)."""
        d = self.suite.defenses[di]
        if not d.match:
            return d
        return self._once(("defense", ti, mi, seed, di), lambda: self._matched(ti, mi, seed, di))[0]

    def _matched(self, ti: int, mi: int, seed: int, di: int) -> tuple[PluginEntry, dict]:
        """Adapt once per grid value (each cached), keep the value whose validation loss is closest to the target.

        Validation records come after the ``n_heldout`` records utility is reported on: never targets, never
        the reported utility's own data. Returns the tuned entry and its ``match`` utility row."""
        d, spec, m = self.suite.defenses[di], self.suite.models[mi], self.suite.defenses[di].match
        data = self._data(ti)
        n_u = self.suite.utility["n_heldout"]
        val = list(data.heldout[n_u: n_u + m["n_validation"]])
        if len(val) < m["n_validation"]:
            raise DataError(f"defense '{d.label}': matched utility needs {m['n_validation']} validation records after "
                            f"the {n_u} utility records, but the task's held-out partition has {len(data.heldout)}: "
                            f"lower match.n_validation or utility.n_heldout")
        target = m["target_loss"]
        if m["target_defense"] is not None:  # the validation loss another defense reaches in this world
            di_t = next(i for i, x in enumerate(self.suite.defenses) if x.label == m["target_defense"])
            path_t, key_t, _ = self._adapted(ti, mi, seed, di_t)
            target = heldout_metrics(self._lm_from(path_t, key_t, spec, self.device), val)[0]["loss"]
        tried = []
        for params in candidate_params(m, d.params):
            inst = DEFENSES.create(d.name, params)
            self.log(f"defense '{d.label}': matching utility, {m['param']} = {params[m['param']]}")
            path, key, _ = ensure_adapted(self.cache, spec, self._theta(ti, mi, seed, di), inst,
                                          self._challenger(ti, seed).adaptation_data(), seed, self.device,
                                          progress=not self.quiet)
            tried.append((params, inst, heldout_metrics(self._lm_from(path, key, spec, self.device), val)[0]["loss"]))
        best, loss = pick([(i, t[2]) for i, t in enumerate(tried)], target)
        params, inst, _ = tried[best]
        row = dict(utility_key=content_hash(inst.key, self._theta(ti, mi, seed, di)[1], "match", m, seed),
                   task=self.suite.tasks[ti].label, model=spec.name, defense=d.label, seed=seed, role="adapted",
                   dataset="match", n_tokens=0,
                   values={"validation_loss": float(loss), "target_loss": float(target),
                           f"chosen_{m['param']}": float(params[m["param"]])})
        return PluginEntry(d.label, d.name, params, inst, None), row

    def _adapted(self, ti: int, mi: int, seed: int, di: int):
        spec, d = self.suite.models[mi], self._defense(ti, mi, seed, di)
        return self._once(("adapted", ti, mi, seed, di), lambda: ensure_adapted(
            self.cache, spec, self._theta(ti, mi, seed, di), d.instance, self._challenger(ti, seed).adaptation_data(),
            seed, self.device, progress=not self.quiet))

    def _heldout(self, ti: int) -> list[str]:
        return list(self._data(ti).heldout[: self.suite.utility["n_heldout"]])

    def _warm(self, ti: int, seed: int) -> list[str]:
        """Texts every model of a world is scored on once, before any attack: targets and held-out data."""
        ch = self._challenger(ti, seed)
        return ch.target_texts() + ch.sample_texts() + self._heldout(ti)  # unit games: the samples attacks see

    def _lm_from(self, path, key: str, spec: ModelSpec, device) -> HFLanguageModel:
        """A loaded model, kept among the last few used; dropping one releases its (GPU) memory."""
        if key in self._lms:
            self._lms.move_to_end(key)
            return self._lms[key]
        lm = self._lm(path, key, spec, device)
        self._lms[key] = lm
        while len(self._lms) > LM_MEMO_SIZE:
            self._lms.popitem(last=False)
            release_memory(device)
        return lm

    # -------------------------------------------------------------------------------------------
    def _lm(self, path, key: str, spec: ModelSpec, device) -> HFLanguageModel:
        if is_release(path):  # an aggregate or adapter release (bench/release.py): loaded by its kind's loader
            def make_lm(model, tok, suffix: str = "") -> HFLanguageModel:
                return HFLanguageModel(model, tok, fingerprint=content_hash(key, suffix) if suffix else key,
                                       max_length=spec.context_length, batch_size=spec.score_batch_size,
                                       device=device, autocast_bf16=score_bf16(device), cache=self.signals,
                                       progress=not self.quiet)
            return load_release(path, device=device, fingerprint=key, make_lm=make_lm)
        hf = spec.source == "hf" and str(path) == str(spec.hf_id)  # the released checkpoint itself
        model, tok = load_model(path, revision=spec.revision if hf else None, device=device,
                                gguf_file=spec.gguf_file if hf else None)
        return HFLanguageModel(model, tok, fingerprint=key, max_length=spec.context_length,
                               batch_size=spec.score_batch_size, device=device, autocast_bf16=score_bf16(device),
                               cache=self.signals, progress=not self.quiet)

    def _population_split(self, data) -> dict:
        """Attacker-owned data, split once: Z (RMIA's population sample), one slice per shadow, the rest for the
        attacker's reference model. Deterministic, so every run and attack sees the same split."""
        sh = self.suite.shadows
        pop = list(data.population)
        n_z, k, m = sh["n_population"], sh["n"], sh["records"]
        if len(pop) < n_z + k * m + 50:
            raise ConfigError(f"task population has {len(pop)} records; shadows need {n_z} + {k} × {m} plus some for "
                              f"the reference model: lower `shadows` sizes in the suite or use more data")
        return {"z": tuple(pop[:n_z]), "shadow": [tuple(pop[n_z + i * m: n_z + (i + 1) * m]) for i in range(k)],
                "reference": tuple(pop[n_z + k * m:])}

    def _needs_shadows(self) -> bool:
        return any(SHADOW_MODELS in a.instance.requires for a in self.suite.attacks)

    def _shadow_base(self, ti: int, mi: int, seed: int, which: str, di: int | None = None):
        return self._theta(ti, mi, seed, di) if which == "base" else self._reference_base(ti, mi)

    def shadow_data(self, data, texts: tuple[str, ...], defense) -> AdaptationData:
        """What the attacker hands its shadow of ``defense``: its population slice ``texts``, with the data-owner facts
        the recipe reads, built from the attacker's own data as the data owner builds them for D.

        A recipe that validates (early stopping) gets the slice's last fifth as held-back validation records and
        trains on the rest; on user tasks every text has its owner (``TaskData.population_owners``; each record its
        own owner where a task names none); on secret tasks the secrets each text carries and their (p_j, r_j).
        ``AdaptationData.texts`` is what the shadow trained on: the members the attacker knows.
        """
        train, validation = tuple(texts), None
        if defense.uses_validation:
            n_val = max(1, len(texts) // 5)
            train, validation = tuple(texts[:-n_val]), tuple(texts[-n_val:])
        users = secrets = secret_targets = None
        if data.unit == "user":
            owner = dict(zip(data.population, data.population_owners or ()))
            users = tuple(content_hash("shadow-owner", owner.get(t, f"record:{i}"), length=12)
                          for i, t in enumerate(train))
        elif data.unit == "secret":
            from bench.units import secrets_of
            per_text, secret_targets = secrets_of(data, train)
            secrets = tuple(per_text)
        return AdaptationData(train, users=users, secrets=secrets, secret_targets=secret_targets,
                              validation=validation)

    def _shadow_model(self, ti: int, mi: int, seed: int, di: int, which: str, i: int):
        """Shadow i: the defense's public recipe applied by the attacker to its own population slice i."""
        spec, d = self.suite.models[mi], self._defense(ti, mi, seed, di)
        data = self._data(ti)
        texts = self._population_split(data)["shadow"][i]
        return self._once(("shadow", ti, mi, seed, di, which, i), lambda: ensure_adapted(
            self.cache, spec, self._shadow_base(ti, mi, seed, which, di), d.instance,
            self.shadow_data(data, texts, d.instance), 10_000 + i, self.device, progress=not self.quiet))

    def _shadows(self, ti: int, mi: int, seed: int, di: int, which: str, label: str) -> ShadowSet:
        """Shadow models: the defense's public recipe applied by the attacker to its own population slices."""
        spec, d = self.suite.models[mi], self._defense(ti, mi, seed, di)
        data = self._data(ti)
        split = self._population_split(data)
        models, members = [], []
        for i, texts in enumerate(split["shadow"]):
            path, key, _ = self._shadow_model(ti, mi, seed, di, which, i)
            models.append(self._lm_from(path, key, spec, self.device))
            members.append(self.shadow_data(data, texts, d.instance).texts)
        return ShadowSet(tuple(models), tuple(members), split["z"], label)

    def _shadow_sets(self, ti: int, mi: int, seed: int, di: int) -> dict[str, ShadowSet] | None:
        if not (self._needs_shadows() and self._reference_base(ti, mi) is not None):
            return None
        split = self._population_split(self._data(ti))
        reference = self._model_lm_memo(ti, mi, seed, "reference")
        return {"pretrain": ShadowSet((reference,), (split["reference"],), split["z"], "attacker reference"),
                "base": self._shadows(ti, mi, seed, di, "base", "released θ"),
                "reference": self._shadows(ti, mi, seed, di, "reference", "attacker reference")}

    def _model_lm_memo(self, ti, mi, seed, role, di=None) -> HFLanguageModel:
        spec = self.suite.models[mi]
        if role == "pretrained":
            path, key = self._theta(ti, mi, seed, di)
        elif role == "reference":
            path, key = self._reference_base(ti, mi)
        else:
            path, key, _ = self._adapted(ti, mi, seed, di)
        return self._lm_from(path, key, spec, self.device)

    def _attacker_trainers(self, spec, base: tuple, ref_base: tuple | None, device) -> dict | None:
        """Factories of fresh trainers for attacks that fine-tune a copy of the attacker's calibration model
        (Self-prompt), one per start model; None when no attack of the suite asks for one."""
        if not any(FINETUNE_REFERENCE in a.instance.requires for a in self.suite.attacks):
            return None
        from functools import partial

        from bench.attacker_models import make_trainer
        out = {"base": partial(make_trainer, self.cache, spec, base, "released θ", device, self.signals)}
        if ref_base is not None:
            out["reference"] = partial(make_trainer, self.cache, spec, ref_base, "attacker reference", device,
                                       self.signals)
        return out

    def _check_world(self, task_label: str, data) -> None:
        """Refuse, before any training, games or models a task's membership structure cannot honour."""
        s = self.suite
        ch = Challenger(data, s.world, s.seeds[0], secret=self.draw_secret)
        undefined = [g.name for g in s.games if g.name not in ch.games_defined()]
        if undefined:
            raise ConfigError(f"task '{task_label}' draws targets that are already in the pretraining data "
                              f"(relation overlap), so games {undefined} are undefined: use games "
                              f"{sorted(ch.games_defined())}")
        for spec in s.models:
            if ch.known_a and spec.source == "scratch":
                raise ConfigError(f"task '{task_label}' gives pretraining membership from a released model's split; "
                                  f"model '{spec.name}' is trained from scratch on other data: use the released "
                                  f"model (e.g. a Pythia spec with hf_id)")

    # -- job functions: one per job kind of the plan; they return rows, the driver writes them --------------
    def run_job(self, job) -> JobResult:
        """Run one job of the plan (in this process or a Ray worker) and return its rows."""
        p = job.params
        kind = job.kind
        if kind == "data":
            self._data(p["ti"])
        elif kind == "tokenizer":
            self._tokenizer(p["ti"], p["mi"])
        elif kind == "reference":
            self._reference_base(p["ti"], p["mi"])
        elif kind == "pretrain":
            self._theta(p["ti"], p["mi"], p["seed"], p.get("di"))
        elif kind == "shadow":
            self._shadow_model(p["ti"], p["mi"], p["seed"], p["di"], p["which"], p["i"])
        elif kind == "adapt":
            result = self._adapt_job(p)
            self._after_training()
            return result
        elif kind == "signals":
            self._model_lm_memo(p["ti"], p["mi"], p["seed"], p["role"], p.get("di")).token_signals(
                self._warm(p["ti"], p["seed"]))
        elif kind == "utility":
            return self._utility_job(p)
        elif kind == "evaluate":
            return self._evaluate_job(p)
        else:  # pragma: no cover - a plan bug
            raise PluginError(f"plan has a job of unknown kind {kind!r}: fix bench/plan.py")
        if kind in ("reference", "pretrain", "shadow"):
            self._after_training()
        return JobResult()

    def _after_training(self) -> None:
        """A training job's model, optimizer and activations are garbage once saved: give their GPU memory back
        before the next job (on CPU there is nothing to return)."""
        if self.device.type == "cuda":
            release_memory(self.device)

    def _common(self, p) -> dict:
        return dict(task=self.suite.tasks[p["ti"]].label, model=self.suite.models[p["mi"]].name, seed=p["seed"])

    def _adapt_job(self, p) -> JobResult:
        d = self.suite.defenses[p["di"]]
        self.log(f"defense '{d.label}': adapting θ → θ' (seed {p['seed']})")
        self._adapted(p["ti"], p["mi"], p["seed"], p["di"])
        return JobResult()  # its rows (guarantee, matched utility) come with its utility job, which the store tracks

    def _utility_job(self, p) -> JobResult:
        """Utility rows of one model; for θ' also its guarantee and matched-utility rows. The held-out row is
        written last: its presence is what marks the job done, so a run killed in between redoes the job."""
        role, di = p["role"], p.get("di")
        lm = self._model_lm_memo(p["ti"], p["mi"], p["seed"], role, di)
        writes: list[tuple[str, dict]] = []
        if role == "pretrained":
            key, train = self._theta(p["ti"], p["mi"], p["seed"], di)[1], None
            defense = self.suite.defenses[di].label if di is not None else "-"
        elif role == "reference":
            key, defense, train = lm.fingerprint, "-", None
        else:
            _, key, meta = self._adapted(p["ti"], p["mi"], p["seed"], di)
            defense, train = self.suite.defenses[di].label, meta.get("report", {})
            if self.suite.defenses[di].match:
                writes.append(("utility", self._once(("defense", p["ti"], p["mi"], p["seed"], di),
                                                     lambda: self._matched(p["ti"], p["mi"], p["seed"], di))[1]))
            if meta.get("guarantee"):
                g = meta["guarantee"]
                writes.append(("guarantee", dict(**self._common(p), defense=defense,
                                                 name=str(g.get("name", "guarantee")), value=g.get("value"),
                                                 details=g)))
        rows = self._utility(None, lm, self._heldout(p["ti"]), role=role, defense=defense, key=key, **self._common(p),
                             train=train)
        return JobResult(writes + [("utility", row) for row in rows])

    def _evaluate_job(self, p) -> JobResult:
        ti, mi, seed, di = p["ti"], p["mi"], p["seed"], p["di"]
        s = self.suite
        ch = self._challenger(ti, seed)
        game = next(g for g in s.games if g.name == p["game"])
        reference = (self._model_lm_memo(ti, mi, seed, "reference")
                     if self._reference_base(ti, mi) is not None else None)
        row = self._evaluate(None, ch, ch.instance(game), s.attacks[p["ai"]], self._defense(ti, mi, seed, di),
                             self._model_lm_memo(ti, mi, seed, "pretrained", di),
                             self._model_lm_memo(ti, mi, seed, "adapted", di), reference, self._data(ti),
                             self._shadow_sets(ti, mi, seed, di), **self._common(p),
                             trainers=self._attacker_trainers(s.models[mi], self._theta(ti, mi, seed, di),
                                                              self._reference_base(ti, mi), self.device))
        if row is None:
            return JobResult(skipped=1)
        return JobResult([("evaluation", row)], new=1)

    def eval_key(self, world_key: str, theta_fp: str, theta_p_fp: str, reference_fp: str | None, d, game: str,
                 a) -> str:
        """An evaluation's content key: world, every model's fingerprint, defense, game, attack, metric settings."""
        return content_hash(world_key, theta_fp, theta_p_fp, reference_fp, d.label, d.instance.key, game, a.label,
                            a.instance.key, self.suite.metrics)

    def _evaluate(self, run_id, ch, inst, a, d, theta, theta_p, reference, data, shadows, *, task, model,
                  seed, trainers: dict | None = None) -> dict | None:
        """Score one (game, defense, attack) cell; return its evaluation row (None when already stored)."""
        s = self.suite
        eval_key = self.eval_key(ch.world_key, theta.fingerprint, theta_p.fingerprint,
                                 reference.fingerprint if reference else None, d, inst.spec.name, a)
        if eval_key in self.done_evals:
            return None
        t0 = time.perf_counter()
        try:  # the view is built inline: no runner frame keeps a reference to it while the attack runs
            out = evaluate_attack(a.instance, ch.view(
                inst, requires=a.instance.requires, pretrained=theta, adapted=theta_p, reference=reference,
                population=data.population, attack_name=a.label, shadows=shadows, trainers=trainers))
        except PluginError as exc:
            raise PluginError(f"{exc} [game {inst.spec.name}, defense {d.label}]") from exc
        scores = out.scores
        rows = membership_metrics(inst.labels, scores, fprs=tuple(s.metrics["fprs"]), n_boot=s.metrics["n_boot"],
                                  alpha=s.metrics["alpha"], seed=seed)
        if inst.spec.null_split:
            rows = flag_underpowered_null(rows)
        if blind_applies(data):  # a known split: is a high AUC leakage, or members and non-members that differ?
            rows += self._once(("blind", ch.world_key, inst.spec.name), lambda: blind_baseline(
                [t.text for t in inst.targets], inst.labels, seed=seed, n_boot=s.metrics["n_boot"],
                alpha=s.metrics["alpha"]))
        if ch.unit != "record":  # unit games: canary units vs ordinary units (source 002, Figure 6)
            from bench.units import canary_unit_metrics
            rows += canary_unit_metrics(inst.labels, scores, (ch.is_canary_unit(u) for u in inst.record_ids))
        # rows of the attack's own (exposure, extraction rates): declared by the attack, not switched on here
        rows += a.instance.metrics(inst.labels, out, MetricContext(
            alpha=s.metrics["alpha"], public_format=data.public_format,
            never_inserted=np.array([ch.never_inserted(u) for u in inst.record_ids], dtype=bool)))
        return dict(eval_key=eval_key, task=task, model=model, defense=d.label, defense_params=d.instance.config,
                    seed=seed, game=inst.spec.name, attack=a.label, attack_params=a.instance.config,
                    world_key=ch.world_key, target_ids=[t.id for t in inst.targets], labels=inst.labels.tolist(),
                    scores=scores.tolist(), metrics=rows, duration_s=time.perf_counter() - t0)

    def _utility(self, run_id, lm: HFLanguageModel, heldout: list[str], *, role, defense, key, task, model, seed,
                 train: dict | None = None) -> list[dict]:
        """Utility rows of one model (bench/utility.py): out-of-domain losses when the suite names such data, then
        held-out loss, perplexity, next-token accuracy and ROUGE of greedy continuations (last: see _utility_job)."""
        u = self.suite.utility
        common = dict(task=task, model=model, defense=defense, seed=seed, role=role)
        rows = []
        ood = self._ood_heldout()
        if ood:
            label, texts = ood
            values, n_tok = heldout_metrics(lm, texts)
            rows.append(dict(utility_key=content_hash(key, "ood", label, len(texts)), dataset=f"ood:{label}",
                             values=values, n_tokens=n_tok, **common))
        values, n_tok = heldout_metrics(lm, heldout)
        if u.get("n_generate", 0) > 0:
            values.update(generation_metrics(lm, heldout, n=u["n_generate"], prompt_tokens=u["prompt_tokens"],
                                             max_new_tokens=u["max_new_tokens"],
                                             cache_dir=self.cache.root / "generations",
                                             read_only_dirs=[r / "generations" for r in
                                                             getattr(self.cache, "read_only_roots", ())]))
        if train and "train" in train:
            values["train_seconds"] = float(train["train"].get("seconds", 0.0))
        rows.append(dict(utility_key=content_hash(key, "heldout", len(heldout)), dataset="heldout", values=values,
                         n_tokens=n_tok, **common))
        return rows

    def _ood_heldout(self) -> tuple[str, list[str]] | None:
        """(label, texts) of the suite's out-of-domain utility data (``utility: {ood: ...}``), or None."""
        entry = self.suite.utility_ood
        if entry is None:
            return None
        return self._once(("ood",), lambda: (entry.label, list(
            entry.instance.build(self.cache).heldout[: self.suite.utility["n_heldout"]])))
