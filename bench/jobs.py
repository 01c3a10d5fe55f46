"""The runner's job functions, one per kind of job in the plan (bench/plan.py), each with its typed parameters.

A job names its place in the suite (task ``ti``, model ``mi``, seed, defense ``di``, ...) and carries the content
key the plan computed for what it produces; the function rebuilds what it needs through :class:`bench.world.Worlds`
(from the cache, in any process) and returns rows (bench/schema.py) that the driver, the database's single writer,
stores under those keys. Every executor (in process, Ray) calls :func:`run_job`, so the rows are the same
whichever runs them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from bench.attack import MetricContext, evaluate_attack
from bench.audit import claim_row, kl_row, one_run_row, roc_epsilon_row, secret_claim_row
from bench.blind import applies_to as blind_applies, blind_baseline
from bench.device import release_memory
from bench.errors import PluginError
from bench.game import b_only_game
from bench.keys import ood_utility_key
from bench.lm import HFLanguageModel
from bench.plugin import plugin_code
from bench.metrics import flag_underpowered_null, membership_metrics
from bench.schema import EvaluationRow, GuaranteeRow, UtilityRow
from bench.units import canary_unit_metrics
from bench.utility import generation_metrics, heldout_metrics
from bench.world import Worlds


# -- typed job parameters: one class per kind -----------------------------------------------------------------
@dataclass(frozen=True)
class DataJob:
    kind: ClassVar[str] = "data"
    ti: int


@dataclass(frozen=True)
class TokenizerJob:
    kind: ClassVar[str] = "tokenizer"
    ti: int
    mi: int


@dataclass(frozen=True)
class ReferenceJob:
    """The attacker's reference model of a (task, model)."""

    kind: ClassVar[str] = "reference"
    ti: int
    mi: int


@dataclass(frozen=True)
class WorldJob:
    """A job in one world (task, model, seed)."""

    ti: int
    mi: int
    seed: int


@dataclass(frozen=True)
class PretrainJob(WorldJob):
    """θ of a world; with ``di``, θ pretrained through that defense's pretraining hooks."""

    kind: ClassVar[str] = "pretrain"
    di: int | None = None


@dataclass(frozen=True)
class ShadowJob(WorldJob):
    """The attacker's shadow ``i`` of defense ``di``, started from θ (``which="base"``) or its reference."""

    kind: ClassVar[str] = "shadow"
    di: int = 0
    which: str = "base"
    i: int = 0


@dataclass(frozen=True)
class AdaptJob(WorldJob):
    kind: ClassVar[str] = "adapt"
    di: int = 0


@dataclass(frozen=True)
class SignalsJob(WorldJob):
    """One model of a world scores the world's warm-up texts once (targets, samples, held-out)."""

    kind: ClassVar[str] = "signals"
    role: str = "pretrained"
    di: int | None = None


@dataclass(frozen=True)
class UtilityJob(WorldJob):
    """Utility rows of one model of a world, stored under ``key`` (its held-out utility key)."""

    kind: ClassVar[str] = "utility"
    role: str = "pretrained"
    di: int | None = None
    key: str = ""


@dataclass(frozen=True)
class EvaluateJob(WorldJob):
    """One (defense, game, attack) cell of a world, stored under ``key`` (its evaluation key)."""

    kind: ClassVar[str] = "evaluate"
    di: int = 0
    game: str = ""
    ai: int = 0
    key: str = ""


JobSpec = DataJob | TokenizerJob | ReferenceJob | PretrainJob | ShadowJob | AdaptJob | SignalsJob | UtilityJob | \
    EvaluateJob


@dataclass
class JobResult:
    """What a job hands back to the driver: rows to write and evaluation counts."""

    rows: list = field(default_factory=list)
    new: int = 0
    skipped: int = 0


# -- the job functions ----------------------------------------------------------------------------------------
def run_job(worlds: Worlds, p: JobSpec, *, done_evals: set[str] | frozenset[str] = frozenset()) -> JobResult:
    """Run one job (in this process or a Ray worker) and return its rows."""
    fn = _FUNCTIONS.get(type(p))
    if fn is None:  # pragma: no cover - a plan bug
        raise PluginError(f"plan has a job of unknown type {type(p).__name__}: fix bench/plan.py")
    result = fn(worlds, p, done_evals)
    if isinstance(p, (ReferenceJob, PretrainJob, ShadowJob, AdaptJob)) and worlds.device.type == "cuda":
        # a training job's model, optimizer and activations are garbage once saved: free the GPU for the next job
        release_memory(worlds.device)
    return result or JobResult()


def _data(w: Worlds, p: DataJob, _done) -> None:
    w.data(p.ti)


def _tokenizer(w: Worlds, p: TokenizerJob, _done) -> None:
    w.tokenizer(p.ti, p.mi)


def _reference(w: Worlds, p: ReferenceJob, _done) -> None:
    w.reference_base(p.ti, p.mi)


def _pretrain(w: Worlds, p: PretrainJob, _done) -> None:
    w.theta(p.ti, p.mi, p.seed, p.di)


def _shadow(w: Worlds, p: ShadowJob, _done) -> None:
    w.shadow_model(p.ti, p.mi, p.seed, p.di, p.which, p.i)


def _adapt(w: Worlds, p: AdaptJob, _done) -> None:
    w.log(f"defense '{w.suite.defenses[p.di].label}': adapting θ → θ' (seed {p.seed})")
    w.adapted(p.ti, p.mi, p.seed, p.di)
    # its rows (guarantee, matched utility) come with its utility job, whose stored row marks it done


def _refuse_diverged(w: Worlds, p: WorldJob, signals: list) -> None:
    """A defense's release (or its own θ) whose ``signals`` hold NaN or infinite log-probabilities fails the run
    naming the defense: else every attack on it would fail with NaN scores, or its utility row could not be
    stored, as if privbench were broken."""
    if p.di is None or p.role not in ("adapted", "pretrained"):
        return
    bad = sum(not np.isfinite(s.logprobs).all() for s in signals)
    if bad:
        raise PluginError(f"defense '{w.suite.defenses[p.di].label}' released a model whose log-probabilities are "
                          f"NaN or infinite on {bad} of {len(signals)} texts: fix the defense (a diverged training "
                          f"run: lower its learning rate, or check its arithmetic)")


def _signals(w: Worlds, p: SignalsJob, _done) -> None:
    _refuse_diverged(w, p, w.model_lm(p.ti, p.mi, p.seed, p.role, p.di).token_signals(w.warm(p.ti, p.seed)))


def _where(w: Worlds, p: WorldJob) -> dict:
    return dict(task=w.suite.tasks[p.ti].label, model=w.suite.models[p.mi].name, seed=p.seed)


def _utility(w: Worlds, p: UtilityJob, _done) -> JobResult:
    """Utility rows of one model; for θ' also its guarantee and matched-utility rows. The held-out row is written
    last: its presence is what marks the job done, so a run killed in between redoes the job."""
    lm = w.model_lm(p.ti, p.mi, p.seed, p.role, p.di)
    heldout = w.heldout(p.ti)
    _refuse_diverged(w, p, lm.token_signals(heldout))  # scored once: the rows below read these cached signals
    rows: list = []
    train = measured = None
    defense = w.suite.defenses[p.di].label if p.di is not None else "-"
    if p.role == "adapted":
        _, key, meta = w.adapted(p.ti, p.mi, p.seed, p.di)
        train = meta.get("report", {})
        measured = meta.get("adapt_seconds")
        if w.suite.defenses[p.di].match:
            rows.append(UtilityRow(**w.matched(p.ti, p.mi, p.seed, p.di)[1]))
        if meta.get("guarantee"):
            g = meta["guarantee"]
            rows.append(GuaranteeRow(**_where(w, p), defense=defense, name=str(g.get("name", "guarantee")),
                                     value=g.get("value"), details=g))
    elif p.role == "reference":
        key = w.reference_base(p.ti, p.mi)[1]
    else:
        key = w.theta(p.ti, p.mi, p.seed, p.di)[1]
    rows += utility_rows(w, lm, heldout, key=key, held_key=p.key, role=p.role, defense=defense,
                         train=train, adapt_seconds=measured, **_where(w, p))
    return JobResult(rows)


def utility_rows(w: Worlds, lm: HFLanguageModel, heldout: list[str], *, key: str, held_key: str, role: str,
                 defense: str, task: str, model: str, seed: int, train: dict | None = None,
                 adapt_seconds: float | None = None) -> list[UtilityRow]:
    """Utility rows of one model (bench/utility.py): out-of-domain losses when the suite names such data, then
    held-out loss, perplexity, next-token accuracy and ROUGE of greedy continuations (last: see ``_utility``)."""
    u = w.suite.utility
    common = dict(task=task, model=model, defense=defense, seed=seed, role=role)
    rows = []
    ood = w.ood_heldout()
    if ood:
        label, texts = ood
        values, n_tok = heldout_metrics(lm, texts)
        rows.append(UtilityRow(utility_key=ood_utility_key(key, label, len(texts)), dataset=f"ood:{label}",
                               values=values, n_tokens=n_tok, **common))
    values, n_tok = heldout_metrics(lm, heldout)
    if u.get("n_generate", 0) > 0:
        values.update(generation_metrics(lm, heldout, n=u["n_generate"], prompt_tokens=u["prompt_tokens"],
                                         max_new_tokens=u["max_new_tokens"],
                                         cache_dir=w.cache.root / "generations",
                                         read_only_dirs=[r / "generations" for r in
                                                         getattr(w.cache, "read_only_roots", ())]))
    if train and "train" in train:  # the defense's own word (its report), next to what privbench measured
        values["train_seconds"] = float(train["train"].get("seconds", 0.0))
    if adapt_seconds is not None:
        values["adapt_seconds"] = float(adapt_seconds)
    rows.append(UtilityRow(utility_key=held_key, dataset="heldout", values=values, n_tokens=n_tok, **common))
    return rows


def audit_group_size(ch, units, data, guarantee: dict | None) -> int:
    """How many of the claim's privacy units one audit canary's coin changes, the group a DP claim must cover.

    A record-level claim: the canary's copies (``adapt_target_repeats``), times its unit's records when the
    canaries are users or secrets. A unit-level claim (dp_adapt ``unit``) of the game's unit covers a canary and
    its copies as one unit; one of identical texts covers the copies of a record canary as one, and each distinct
    text of a user or secret as another. Times 2 where a c = 0 canary is trained as its neighbour
    (``secrets_replaced``: a swap is one removal and one addition)."""
    claim_unit = (guarantee or {}).get("unit", "record")
    size = int(ch.config["adapt_target_repeats"])
    if claim_unit == "text":
        size = 1 if ch.unit == "record" else max((ch.unit_size(u) for u in units), default=1)
    elif claim_unit != "record" and claim_unit == ch.unit:
        size = 1
    elif ch.unit != "record":
        size *= max((ch.unit_size(u) for u in units), default=1)
    if (data.public_format or {}).get("negatives") == "replaced":
        size *= 2
    return size


def neighbour_game(spec, data) -> bool:
    """Whether a game's negatives are its positives' neighbours: the task trains b = 0 secrets with their content
    replaced (``public_format["negatives"] == "replaced"``) and the game tells b apart alone (:func:`b_only_game`),
    so a secret-level KL guarantee bounds every test of the game."""
    return (data.public_format or {}).get("negatives") == "replaced" and b_only_game(spec)


def _evaluate(w: Worlds, p: EvaluateJob, done_evals) -> JobResult:
    """Score one (game, defense, attack) cell of a world into its evaluation row (skipped when already stored)."""
    if p.key in done_evals:
        return JobResult(skipped=1)
    s = w.suite
    ch = w.challenger(p.ti, p.seed)
    inst = ch.instance(next(g for g in s.games if g.name == p.game))
    a, d, data = s.attacks[p.ai], w.defense(p.ti, p.mi, p.seed, p.di), w.data(p.ti)
    theta, theta_p = w.model_lm(p.ti, p.mi, p.seed, "pretrained", p.di), w.model_lm(p.ti, p.mi, p.seed, "adapted",
                                                                                     p.di)
    reference = w.model_lm(p.ti, p.mi, p.seed, "reference") if w.reference_base(p.ti, p.mi) is not None else None
    shadows = w.shadow_sets(p.ti, p.mi, p.seed, p.di)
    trainers = w.attacker_trainers(p.mi, w.theta(p.ti, p.mi, p.seed, p.di), w.reference_base(p.ti, p.mi))
    t0 = time.perf_counter()
    try:  # the view is built inline: no frame here keeps a reference to it while the attack runs
        out = evaluate_attack(a.instance, ch.view(
            inst, requires=a.instance.requires, pretrained=theta, adapted=theta_p, reference=reference,
            population=data.population, attack_name=a.label, shadows=shadows, trainers=trainers))
    except PluginError as exc:
        raise PluginError(f"{exc} [game {inst.spec.name}, defense {d.label}]") from exc
    scores = out.scores
    rows = membership_metrics(inst.labels, scores, fprs=tuple(s.metrics["fprs"]), n_boot=s.metrics["n_boot"],
                              alpha=s.metrics["alpha"], seed=p.seed)
    # the ε lower bound (bench/audit.py), flagged indicative: the targets share one model, not independent trials
    rows.append(roc_epsilon_row(inst.labels, scores, delta=s.audit["delta"], confidence=s.audit["confidence"]))
    if inst.spec.audit_pool:  # canaries in D (or S) with probability 1/2 each: the one-run bound is valid here
        rows.append(one_run_row(inst.labels, scores, delta=s.audit["delta"], confidence=s.audit["confidence"]))
    if inst.spec.audit_pool and inst.spec.target_model == "adapted":  # a DP ledger speaks of adaptation only
        guarantee = w.adapted(p.ti, p.mi, p.seed, p.di)[2].get("guarantee")
        verdict = claim_row(inst.labels, scores, guarantee, confidence=s.audit["confidence"],
                            repeats=audit_group_size(ch, inst.record_ids, data, guarantee))
        if verdict is not None:  # the defense claims a finite (ε, δ): is it refuted at the suite's confidence?
            rows.append(verdict)
    if neighbour_game(inst.spec, data):  # negatives trained on with their secret replaced: Hush's adjacency
        rows.append(kl_row(inst.labels, scores, confidence=s.audit["confidence"]))
        verdict = secret_claim_row(inst.labels, scores, inst.record_ids,
                                   w.adapted(p.ti, p.mi, p.seed, p.di)[2].get("guarantee"),
                                   confidence=s.audit["confidence"])
        if verdict is not None:  # the defense claims a secret-level KL bound: is it refuted?
            rows.append(verdict)
    if inst.spec.null_split:
        rows = flag_underpowered_null(rows)
    if blind_applies(data):  # a known split: is a high AUC leakage, or members and non-members that differ?
        rows += w.once(("blind", ch.world_key, inst.spec.name), lambda: blind_baseline(
            [t.text for t in inst.targets], inst.labels, seed=p.seed, n_boot=s.metrics["n_boot"],
            alpha=s.metrics["alpha"]))
    if ch.unit != "record":  # unit games: canary units vs ordinary units (Kandpal et al. 2024, Figure 6)
        rows += canary_unit_metrics(inst.labels, scores, (ch.is_canary_unit(u) for u in inst.record_ids))
    # rows of the attack's own (exposure, extraction rates): declared by the attack, not switched on here
    with plugin_code(a.instance, "metrics"):
        own = a.instance.metrics(inst.labels, out, MetricContext(
            alpha=s.metrics["alpha"], public_format=data.public_format,
            never_inserted=np.array([ch.never_inserted(u) for u in inst.record_ids], dtype=bool)))
    if not isinstance(own, list):
        raise PluginError(f"attack '{a.instance.name}': metrics returned {type(own).__name__}: return a list of "
                          f"metric rows (an empty list when the attack adds none)")
    rows += own
    row = EvaluationRow(eval_key=p.key, **_where(w, p), defense=d.label, defense_params=d.instance.config,
                        game=inst.spec.name, attack=a.label, attack_params=a.instance.config,
                        world_key=ch.world_key, target_ids=[t.id for t in inst.targets], labels=inst.labels.tolist(),
                        scores=scores.tolist(), metrics=rows, duration_s=time.perf_counter() - t0)
    return JobResult([row], new=1)


_FUNCTIONS = {DataJob: _data, TokenizerJob: _tokenizer, ReferenceJob: _reference, PretrainJob: _pretrain,
              ShadowJob: _shadow, AdaptJob: _adapt, SignalsJob: _signals, UtilityJob: _utility,
              EvaluateJob: _evaluate}
