"""The job graph of a suite: what the runner does, as content-addressed jobs with explicit dependencies.

data → tokenizer → pretrain θ (per world) and the attacker's reference → shadows → adapt θ' per defense →
signals (each model scores the world's targets and held-out texts once) → utility rows and attack evaluations.

A job's key is the content key of what it produces: the artifact's cache key
(bench/artifacts.py) for models, the evaluation key the store holds for an
evaluation (bench/runner.py ``Runner.eval_key``), the utility key for a utility
row. Jobs only name their place in the suite (task, model, seed, defense, game,
attack indices); the runner's job functions (``Runner.run_job``) do the work, so
every executor runs the same code. Building the plan builds the task data (every
later key hashes it); the data artifacts are cached, so planning again is cheap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.artifacts import adapted_key, pretrained_key, pretrains, reference_key, tokenizer_key
from bench.device import score_bf16
from bench.hashing import content_hash, text_hash
from bench.lm import HFLanguageModel, SignalCache

#: job kinds whose work runs a model: on a CUDA suite they ask the executor for a GPU
GPU_KINDS = frozenset({"pretrain", "reference", "shadow", "adapt", "signals", "utility", "evaluate"})
#: the cache directory each artifact kind lives in (ArtifactCache.path(kind, key))
ARTIFACT_KINDS = {"tokenizer": "tokenizer", "pretrain": "pretrained", "reference": "reference",
                  "shadow": "adapted", "adapt": "adapted"}


@dataclass
class Job:
    """One unit of work: ``kind`` names the runner's job function, ``params`` its place in the suite."""

    key: str
    kind: str
    label: str
    deps: tuple[str, ...]
    params: dict
    gpu: bool = False
    done: bool = False  # already in the cache or the database when the plan was made

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
    keys = [text_hash(t) for t in texts]
    return len(signals.lookup(fp, keys)) == len(keys)


def build_plan(runner, run_id: int | None = None) -> Plan:
    """Expand ``runner.suite`` into its job graph, marking what the cache and the database already hold.

    Walks the suite in the order the runner always has (task → model → seed → defense → game → attack), so
    the in-process executor, which runs jobs in plan order, behaves as the runner did.
    """
    s, cache = runner.suite, runner.cache
    gpu = runner.device.type == "cuda"
    plan = Plan()
    utility_done: set[tuple] = set()
    if run_id is not None and runner.store is not None:
        utility_done = {(u["task"], u["model"], u["defense"], u["seed"], u["role"])
                        for u in runner.store.utility_rows(run_id)}

    def job(key, kind, label, deps, done=False, **params) -> str:
        if not done and kind in ARTIFACT_KINDS:
            done = cache.is_valid(ARTIFACT_KINDS[kind], key, verify=False)
        return plan.add(Job(key, kind, label, tuple(d for d in deps if d), params, gpu and kind in GPU_KINDS, done))

    for ti, t in enumerate(s.tasks):
        runner.log(f"task '{t.label}': building data")
        data = runner._data(ti)
        runner._check_world(t.label, data)
        k_data = job(content_hash("data", t.name, t.instance.key, data.fingerprint), "data", t.label, (),
                     done=True, ti=ti)
        heldout = runner._heldout(ti)

        def utility_key(model_key: str) -> str:
            # the key the store holds (Runner._utility); the reference's is the same in every world of a model,
            # so its utility row is one job, stored once, under the first seed, as the runner always did
            return content_hash(model_key, "heldout", len(heldout))
        for mi, spec in enumerate(s.models):
            def fp(key: str) -> str:
                # scratch tokenizers always have a BOS token; released models may not (then the stored key differs
                # from this prediction, the job runs, computes the real key and skips if it is stored)
                return HFLanguageModel.fingerprint_for(key, max_length=spec.context_length, add_bos=True,
                                                       autocast_bf16=score_bf16(runner.device))
            k_tok = None
            if spec.source == "scratch":
                k_tok = job(tokenizer_key(spec, data), "tokenizer", f"{spec.name} tokenizer", (k_data,),
                            ti=ti, mi=mi)
            k_ref = ref_key = None
            if s.reference and spec.source == "scratch":
                ref_texts = runner._population_split(data)["reference"] if runner._needs_shadows() else data.population
                ref_key = reference_key(spec, k_tok, ref_texts)
                k_ref = job(ref_key, "reference", f"{spec.name} attacker reference", (k_tok,), ti=ti, mi=mi)
            for seed in s.seeds:
                ch = runner._challenger(ti, seed)
                warm = runner._warm(ti, seed)
                common = dict(ti=ti, mi=mi, seed=seed)
                w = f"{spec.name} seed {seed}"
                base_key = pretrained_key(spec, data, k_tok, ch.pretraining_inserts(), seed)
                k_base = job(base_key, "pretrain", f"θ {w}", (k_tok,), done=spec.source == "hf", **common)
                sig_base = job(content_hash("signals", fp(base_key), [text_hash(x) for x in warm]), "signals",
                               f"signals θ {w}", (k_base,), done=_signals_done(runner.signals, fp(base_key), warm),
                               role="pretrained", **common)
                sig_ref = None
                if k_ref:
                    sig_ref = job(content_hash("signals", fp(ref_key), [text_hash(x) for x in warm]), "signals",
                                  f"signals reference {w}", (k_ref,),
                                  done=_signals_done(runner.signals, fp(ref_key), warm), role="reference", **common)
                job(utility_key(base_key), "utility", f"utility θ {w}", (sig_base,),
                    done=(t.label, spec.name, "-", seed, "pretrained") in utility_done, role="pretrained", **common)
                if k_ref:
                    job(utility_key(fp(ref_key)), "utility", f"utility reference {w}", (sig_ref,),
                        done=(t.label, spec.name, "-", seed, "reference") in utility_done, role="reference",
                        **common)
                # θ per pretraining-stage defense (dedup, goldfish): its own pretrain, signals and utility jobs
                thetas: dict[int, tuple[str, str, str]] = {}
                for di, d in enumerate(s.defenses):
                    if not pretrains(d.instance):
                        thetas[di] = (base_key, k_base, sig_base)
                        continue
                    dkey = pretrained_key(spec, data, k_tok, ch.pretraining_inserts(), seed, d.instance)
                    k_dbase = job(dkey, "pretrain", f"θ ({d.label}) {w}", (k_tok,), di=di, **common)
                    sig_dbase = job(content_hash("signals", fp(dkey), [text_hash(x) for x in warm]), "signals",
                                    f"signals θ ({d.label}) {w}", (k_dbase,),
                                    done=_signals_done(runner.signals, fp(dkey), warm), role="pretrained", di=di,
                                    **common)
                    job(utility_key(dkey), "utility", f"utility θ ({d.label}) {w}", (sig_dbase,),
                        done=(t.label, spec.name, d.label, seed, "pretrained") in utility_done, role="pretrained",
                        di=di, **common)
                    thetas[di] = (dkey, k_dbase, sig_dbase)
                shadow_deps: dict[int, list[str]] = {}
                if runner._needs_shadows() and k_ref:
                    split = runner._population_split(data)
                    for di in range(len(s.defenses)):
                        d = runner._defense(ti, mi, seed, di)
                        for which, bkey, bjob in (("base", *thetas[di][:2]), ("reference", ref_key, k_ref)):
                            for i, texts in enumerate(split["shadow"]):
                                shadow_deps.setdefault(di, []).append(job(
                                    adapted_key(spec, bkey, d.instance, runner.shadow_data(data, texts, d.instance),
                                                10_000 + i),
                                    "shadow", f"shadow {i} of {which} ({d.label}, {w})", (bjob,), di=di,
                                    which=which, i=i, **common))
                adaptation = ch.adaptation_data()
                for di in range(len(s.defenses)):
                    d = runner._defense(ti, mi, seed, di)  # a matched defense is tuned here, in the driver
                    d_base_key, d_k_base, d_sig_base = thetas[di]
                    ad_key = adapted_key(spec, d_base_key, d.instance, adaptation, seed)
                    k_ad = job(ad_key, "adapt", f"θ' {d.label} {w}", (d_k_base,), di=di, **common)
                    sig_ad = job(content_hash("signals", fp(ad_key), [text_hash(x) for x in warm]), "signals",
                                 f"signals θ' {d.label} {w}", (k_ad,),
                                 done=_signals_done(runner.signals, fp(ad_key), warm), role="adapted", di=di,
                                 **common)
                    job(utility_key(ad_key), "utility", f"utility θ' {d.label} {w}",
                        (sig_ad, k_ad), done=(t.label, spec.name, d.label, seed, "adapted") in utility_done,
                        role="adapted", di=di, **common)
                    for game in s.games:
                        for ai, a in enumerate(s.attacks):
                            key = runner.eval_key(ch.world_key, fp(d_base_key), fp(ad_key),
                                                  fp(ref_key) if ref_key else None, d, game.name, a)
                            job(key, "evaluate", f"{game.name} × {a.label} × {d.label} {w}",
                                (d_sig_base, sig_ad, sig_ref, *shadow_deps.get(di, ())),
                                done=key in runner.done_evals, di=di, game=game.name, ai=ai, **common)
    return plan
