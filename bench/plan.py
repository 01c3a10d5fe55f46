"""The job graph of a suite: what the runner does, as content-addressed jobs with explicit dependencies.

data → tokenizer → pretrain θ (per world) and the attacker's reference → shadows → adapt θ' per defense →
signals (each model scores the world's targets and held-out texts once) → utility rows and attack evaluations.

A job's key is the content key of what it produces (bench/keys.py): the artifact's
cache key (bench/artifacts.py) for models, the evaluation key the store holds for an
evaluation, the utility key for a utility row. Jobs name their place in the suite
(task, model, seed, defense, game, attack indices) with typed parameters
(bench/jobs.py), whose job functions do the work, so every executor runs the same
code. Building the plan builds the task data (every
later key hashes it); the data artifacts are cached, so planning again is cheap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bench.artifacts import adapted_key, pretrained_key, pretrains, reference_key, tokenizer_key
from bench.hashing import text_hash
from bench.jobs import (AdaptJob, DataJob, EvaluateJob, JobSpec, PretrainJob, ReferenceJob, ShadowJob, SignalsJob,
                        TokenizerJob, UtilityJob)
from bench.keys import data_key, eval_key, shadow_seed, signals_key, utility_key
from bench.lm import SignalCache
from bench.world import shadow_data

#: job kinds whose work runs a model: on a CUDA suite they ask the executor for a GPU
GPU_KINDS = frozenset({"pretrain", "reference", "shadow", "adapt", "signals", "utility", "evaluate"})
#: the cache directory each artifact kind lives in (ArtifactCache.path(kind, key))
ARTIFACT_KINDS = {"tokenizer": "tokenizer", "pretrain": "pretrained", "reference": "reference",
                  "shadow": "adapted", "adapt": "adapted"}


@dataclass
class Job:
    """One unit of work: ``params`` (bench/jobs.py) names its job function and its place in the suite."""

    key: str
    label: str
    deps: tuple[str, ...]
    params: JobSpec
    gpu: bool = False
    done: bool = False  # already in the cache or the database when the plan was made

    @property
    def kind(self) -> str:
        return self.params.kind

    def __repr__(self) -> str:  # short, for logs
        return f"Job({self.kind} {self.label} {self.key[:12]})"


@dataclass
class Plan:
    """Jobs in a topological order (every job after its dependencies)."""

    jobs: dict[str, Job] = field(default_factory=dict)

    def add(self, job: Job) -> str:
        """Add ``job``; a job already planned under the same key (same content) is reused, not repeated."""
        missing = [d for d in job.deps if d not in self.jobs]
        if missing:
            raise ValueError(f"job {job.label} depends on unplanned jobs {missing}")
        if job.key not in self.jobs:
            self.jobs[job.key] = job
        return job.key

    def ready(self, finished: set[str], started: set[str]) -> list[Job]:
        """Jobs not started whose dependencies have all finished, in plan order."""
        return [j for k, j in self.jobs.items()
                if k not in started and k not in finished and all(d in finished for d in j.deps)]

    def counts(self) -> dict[str, tuple[int, int]]:
        """Per kind: (jobs, jobs already done)."""
        out: dict[str, list[int]] = {}
        for j in self.jobs.values():
            c = out.setdefault(j.kind, [0, 0])
            c[0] += 1
            c[1] += int(j.done)
        return {k: (v[0], v[1]) for k, v in out.items()}

    def describe(self, verbose: bool = True) -> str:
        """The graph as text: one line per job (status, kind, key, label, dependencies), then totals."""
        lines = []
        index = {k: i for i, k in enumerate(self.jobs)}
        if verbose:
            for i, (k, j) in enumerate(self.jobs.items()):
                deps = ",".join(str(index[d]) for d in j.deps) or "-"
                lines.append(f"{i:4d} [{'done' if j.done else 'todo'}] {j.kind:<9} {k[:16]}  {j.label}"
                             f"{'  (gpu)' if j.gpu else ''}  <- {deps}")
        total = len(self.jobs)
        done = sum(j.done for j in self.jobs.values())
        per = ", ".join(f"{k} {n} ({d} done)" for k, (n, d) in self.counts().items())
        lines.append(f"{total} jobs, {done} done, {total - done} to run: {per}")
        return "\n".join(lines)


def _signals_done(signals: SignalCache, fp: str, texts: list[str]) -> bool:
    """Every text's signals are cached and finite: a release cached with NaN log-probabilities (a diverged defense)
    goes back through its signals job, which names the defense, instead of reaching the attacks as NaN scores."""
    keys = [text_hash(t) for t in texts]
    found = signals.lookup(fp, keys)
    return len(found) == len(keys) and all(np.isfinite(s.logprobs).all() for s in found.values())


def build_plan(runner, run_id: int | None = None) -> Plan:
    """Expand ``runner.suite`` into its job graph, marking what the cache and the database already hold.

    Walks the suite in the order the runner always has (task → model → seed → defense → game → attack), so
    the in-process executor, which runs jobs in plan order, behaves as the runner did. Every key is computed here,
    once (bench/keys.py); utility and evaluation jobs carry theirs and store their rows under it.
    """
    s, cache, w = runner.suite, runner.cache, runner.worlds
    gpu = w.device.type == "cuda"
    plan = Plan()
    utility_done: set[tuple] = set()
    if run_id is not None and runner.store is not None:
        utility_done = {(u["task"], u["model"], u["defense"], u["seed"], u["role"])
                        for u in runner.store.utility_rows(run_id)}

    def job(key, params, label, deps, done=False) -> str:
        if not done and params.kind in ARTIFACT_KINDS:
            done = cache.is_valid(ARTIFACT_KINDS[params.kind], key, verify=False)
        return plan.add(Job(key, label, tuple(d for d in deps if d), params, gpu and params.kind in GPU_KINDS, done))

    for ti, t in enumerate(s.tasks):
        runner.log(f"task '{t.label}': building data")
        data = w.data(ti)
        w.check(t.label, data)
    w.ood_heldout()  # the out-of-domain utility data too: a broken file fails here, before anything trains
    for ti, t in enumerate(s.tasks):
        data = w.data(ti)
        k_data = job(data_key(t.name, t.instance.key, data.fingerprint), DataJob(ti), t.label, (), done=True)
        n_heldout = len(w.heldout(ti))
        for mi, spec in enumerate(s.models):
            def fp(key: str) -> str:
                return w.fingerprint(key, spec)

            def signals(key: str, dep: str, label: str, warm: list[str], **where) -> str:
                return job(signals_key(fp(key), warm), SignalsJob(**where), label, (dep,),
                           done=_signals_done(w.signals, fp(key), warm))

            def utility(key: str, deps: tuple, label: str, done_as: tuple, **where) -> str:
                # a model's utility row; the reference's is the same in every world of a model, so its row is one
                # job (keys are unique), stored once, under the first seed
                k = utility_key(key, n_heldout)
                return job(k, UtilityJob(key=k, **where), label, deps, done=done_as in utility_done)

            k_tok = None
            if spec.source == "scratch":
                k_tok = job(tokenizer_key(spec, data), TokenizerJob(ti, mi), f"{spec.name} tokenizer", (k_data,))
            k_ref = ref_key = None
            if s.reference and spec.source == "scratch":
                ref_texts = w.population_split(data)["reference"] if w.needs_shadows() else data.population
                ref_key = reference_key(spec, k_tok, ref_texts)
                k_ref = job(ref_key, ReferenceJob(ti, mi), f"{spec.name} attacker reference", (k_tok,))
            for seed in s.seeds:
                ch = w.challenger(ti, seed)
                warm = w.warm(ti, seed)
                at = dict(ti=ti, mi=mi, seed=seed)
                wl = f"{spec.name} seed {seed}"
                base_key = pretrained_key(spec, data, k_tok, ch.pretraining_inserts(), seed)
                # a released checkpoint needs no job, unless it is a GGUF file that θ's job dequantises into the cache
                k_base = job(base_key, PretrainJob(**at), f"θ {wl}", (k_tok,),
                             done=spec.source == "hf" and not spec.gguf_file)
                sig_base = signals(base_key, k_base, f"signals θ {wl}", warm, role="pretrained", **at)
                sig_ref = None
                if k_ref:
                    sig_ref = signals(ref_key, k_ref, f"signals reference {wl}", warm, role="reference", **at)
                utility(base_key, (sig_base,), f"utility θ {wl}", (t.label, spec.name, "-", seed, "pretrained"),
                        role="pretrained", **at)
                if k_ref:
                    utility(ref_key, (sig_ref,), f"utility reference {wl}",
                            (t.label, spec.name, "-", seed, "reference"), role="reference", **at)
                # θ per pretraining-stage defense (dedup, goldfish): its own pretrain, signals and utility jobs
                thetas: dict[int, tuple[str, str, str]] = {}
                for di, d in enumerate(s.defenses):
                    if not pretrains(d.instance):
                        thetas[di] = (base_key, k_base, sig_base)
                        continue
                    dkey = pretrained_key(spec, data, k_tok, ch.pretraining_inserts(), seed, d.instance)
                    k_dbase = job(dkey, PretrainJob(di=di, **at), f"θ ({d.label}) {wl}", (k_tok,))
                    sig_dbase = signals(dkey, k_dbase, f"signals θ ({d.label}) {wl}", warm, role="pretrained", di=di,
                                        **at)
                    utility(dkey, (sig_dbase,), f"utility θ ({d.label}) {wl}",
                            (t.label, spec.name, d.label, seed, "pretrained"), role="pretrained", di=di, **at)
                    thetas[di] = (dkey, k_dbase, sig_dbase)
                shadow_deps: dict[int, list[str]] = {}
                if w.needs_shadows() and k_ref:
                    split = w.population_split(data)
                    for di in range(len(s.defenses)):
                        d = w.defense(ti, mi, seed, di)
                        for which, bkey, bjob in (("base", *thetas[di][:2]), ("reference", ref_key, k_ref)):
                            for i, texts in enumerate(split["shadow"]):
                                shadow_deps.setdefault(di, []).append(job(
                                    adapted_key(spec, bkey, d.instance, shadow_data(data, texts, d.instance),
                                                shadow_seed(i)),
                                    ShadowJob(di=di, which=which, i=i, **at),
                                    f"shadow {i} of {which} ({d.label}, {wl})", (bjob,)))
                adaptation = ch.adaptation_data()
                for di in range(len(s.defenses)):
                    d = w.defense(ti, mi, seed, di)  # a matched defense is tuned here, in the driver
                    d_base_key, d_k_base, d_sig_base = thetas[di]
                    ad_key = adapted_key(spec, d_base_key, d.instance, adaptation, seed)
                    k_ad = job(ad_key, AdaptJob(di=di, **at), f"θ' {d.label} {wl}", (d_k_base,))
                    # a θ′ that is θ byte for byte is scored as θ (Worlds.model_lm), so it waits for θ's signals
                    scored_as = w.scoring_key("adapted", ad_key, d_base_key)
                    sig_ad = job(signals_key(fp(ad_key), warm), SignalsJob(role="adapted", di=di, **at),
                                 f"signals θ' {d.label} {wl}", (k_ad, d_sig_base),
                                 done=_signals_done(w.signals, fp(scored_as), warm))
                    utility(ad_key, (sig_ad, k_ad), f"utility θ' {d.label} {wl}",
                            (t.label, spec.name, d.label, seed, "adapted"), role="adapted", di=di, **at)
                    for game in s.games:
                        for ai, a in enumerate(s.attacks):
                            key = eval_key(ch.world_key, fp(d_base_key), fp(ad_key), fp(ref_key) if ref_key else None,
                                           d.label, d.instance.key, game.name, a.label, a.instance.key, s.metrics)
                            job(key, EvaluateJob(di=di, game=game.name, ai=ai, key=key, **at),
                                f"{game.name} × {a.label} × {d.label} {wl}",
                                (d_sig_base, sig_ad, sig_ref, *shadow_deps.get(di, ())),
                                done=key in runner.done_evals)
    return plan
