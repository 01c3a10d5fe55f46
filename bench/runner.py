"""Runs a suite: worlds → θ, reference, θ' per defense → every game × attack → scores, metrics, utility.

The runner is the single writer of the database. Every evaluation is keyed by
content, so a rerun skips what is stored and a killed run resumes where it
stopped; model artifacts and per-token signals come from the cache.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch

from bench.artifacts import ensure_adapted, ensure_pretrained, ensure_reference, ensure_tokenizer
from bench.attack import run_attack
from bench.cache import ArtifactCache
from bench.device import select_device, set_threads, tune_allocator
from bench.errors import ConfigError, PluginError, PrivbenchError
from bench.game import AdaptationData, Challenger, ShadowSet
from bench.lm import FINETUNE_REFERENCE, SHADOW_MODELS
from bench.hashing import code_version, content_hash
from bench.lm import HFLanguageModel, SignalCache
from bench.metrics import exposure_metrics, membership_metrics
from bench.modeling import ModelSpec, load_model
from bench.release import is_release, load_release
from bench.store import Store
from bench.suite import Suite


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


class Runner:
    def __init__(self, suite: Suite, store: Store, cache: ArtifactCache, *, command: str | None = None,
                 quiet: bool = False) -> None:
        self.suite = suite
        self.store = store
        self.cache = cache
        self.signals = SignalCache(cache.root / "signals")
        self.command = command
        self.quiet = quiet
        self.code_version = code_version()

    def log(self, msg: str) -> None:
        if not self.quiet:
            _log(msg)

    @property
    def run_key(self) -> str:
        return content_hash(self.suite.config, self.code_version)

    def plugin_versions(self) -> dict[str, str]:
        s = self.suite
        out = {f"attack:{e.name}": e.instance.version for e in s.attacks}
        out.update({f"defense:{e.name}": e.instance.version for e in s.defenses})
        out.update({f"task:{e.name}": e.instance.version for e in s.tasks})
        return out

    def run(self) -> RunResult:
        set_threads()
        tune_allocator()
        t0 = time.perf_counter()
        s = self.suite
        run_id, previous = self.store.begin_run(
            run_key=self.run_key, suite=s.name, config=s.config, config_hash=s.config_hash,
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

    # -------------------------------------------------------------------------------------------
    def _lm(self, path, key: str, spec: ModelSpec, device) -> HFLanguageModel:
        if is_release(path):  # an aggregate or adapter release (bench/release.py): loaded by its kind's loader
            def make_lm(model, tok, suffix: str = "") -> HFLanguageModel:
                return HFLanguageModel(model, tok, fingerprint=content_hash(key, suffix) if suffix else key,
                                       max_length=spec.context_length, batch_size=spec.score_batch_size,
                                       device=device, cache=self.signals, progress=not self.quiet)
            return load_release(path, device=device, fingerprint=key, make_lm=make_lm)
        hf = spec.source == "hf" and str(path) == str(spec.hf_id)  # the released checkpoint itself
        model, tok = load_model(path, revision=spec.revision if hf else None, device=device,
                                gguf_file=spec.gguf_file if hf else None)
        return HFLanguageModel(model, tok, fingerprint=key, max_length=spec.context_length,
                               batch_size=spec.score_batch_size, device=device, cache=self.signals,
                               progress=not self.quiet)

    def _run(self, run_id: int) -> None:
        s = self.suite
        device = select_device(s.device)
        for task_entry in s.tasks:
            self.log(f"task '{task_entry.label}': building data")
            data = task_entry.instance.build(self.cache)
            self._check_world(task_entry.label, data)
            for spec in s.models:
                tok = ensure_tokenizer(self.cache, spec, data) if spec.source == "scratch" else None
                reference = None
                if s.reference and spec.source == "scratch":
                    self.log(f"model '{spec.name}': attacker reference model on population data")
                    # with shadows, the reference model trains on its own slice of the population, disjoint from
                    # the shadows' slices and from RMIA's sample Z; without them, on all of it
                    ref_texts = self._population_split(data)["reference"] if self._needs_shadows() else None
                    ref_path, ref_key = ensure_reference(self.cache, spec, data, tok, device,
                                                         progress=not self.quiet, texts=ref_texts)
                    reference = self._lm(ref_path, ref_key, spec, device)
                    ref_base = (ref_path, ref_key)  # where shadows of the attacker's own model start from
                for seed in s.seeds:
                    self._world(run_id, task_entry.label, data, spec, tok, reference, seed, device,
                                ref_base if reference is not None else None)

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

    def _shadows(self, spec, data, d, base: tuple, reference, device, label: str) -> ShadowSet:
        """Shadow models: the defense's public recipe applied by the attacker to its own population slices."""
        split = self._population_split(data)
        models, members = [], []
        for i, texts in enumerate(split["shadow"]):
            path, key, _ = ensure_adapted(self.cache, spec, base, d.instance, AdaptationData(texts), 10_000 + i,
                                          device, progress=not self.quiet)
            lm = self._lm(path, key, spec, device)
            models.append(lm)
            members.append(texts)
        return ShadowSet(tuple(models), tuple(members), split["z"], label)

    def _attacker_trainers(self, spec, base: tuple, ref_base: tuple | None, device) -> dict | None:
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
        ch = Challenger(data, s.world, s.seeds[0])
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

    def _world(self, run_id, task_label, data, spec, tok, reference, seed, device, ref_base=None) -> None:
        s = self.suite
        ch = Challenger(data, s.world, seed)
        heldout = list(data.heldout[: s.utility["n_heldout"]])
        self.log(f"world {ch.world_key} (task {task_label}, model {spec.name}, seed {seed}): pretraining θ")
        base_path, base_key = ensure_pretrained(self.cache, spec, data, tok, ch.pretraining_inserts(), seed, device,
                                                 progress=not self.quiet)
        theta = self._lm(base_path, base_key, spec, device)
        warm = ch.target_texts() + heldout
        theta.token_signals(warm)
        if reference is not None:
            reference.token_signals(warm)
        common = dict(task=task_label, model=spec.name, seed=seed)
        self._utility(run_id, theta, heldout, role="pretrained", defense="-", key=base_key, **common)
        if reference is not None:
            self._utility(run_id, reference, heldout, role="reference", defense="-", key=reference.fingerprint,
                          **common)
        adaptation = ch.adaptation_data()
        shadow_sets_by_defense: dict[str, dict[str, ShadowSet]] = {}
        if self._needs_shadows() and reference is not None:
            split = self._population_split(data)
            pretrain_shadows = ShadowSet((reference,), (split["reference"],), split["z"], "attacker reference")
            for d in s.defenses:
                self.log(f"defense '{d.label}': {s.shadows['n']} shadow models from θ and from the attacker's "
                         f"reference")
                shadow_sets_by_defense[d.label] = {
                    "pretrain": pretrain_shadows,
                    "base": self._shadows(spec, data, d, (base_path, base_key), reference, device, "released θ"),
                    "reference": self._shadows(spec, data, d, ref_base, reference, device, "attacker reference"),
                }
        # attacks that fine-tune a copy of the attacker's calibration model (Self-prompt) get a trainer per start model
        self._trainers = self._attacker_trainers(spec, (base_path, base_key), ref_base if reference is not None
                                                 else None, device)
        for d in s.defenses:
            self.log(f"defense '{d.label}': adapting θ → θ' on {len(adaptation.texts)} records")
            ad_path, ad_key, meta = ensure_adapted(self.cache, spec, (base_path, base_key), d.instance, adaptation,
                                                   seed, device, progress=not self.quiet)
            theta_p = self._lm(ad_path, ad_key, spec, device)
            theta_p.token_signals(warm)
            self._utility(run_id, theta_p, heldout, role="adapted", defense=d.label, key=ad_key, **common,
                          train=meta.get("report", {}))
            if meta.get("guarantee"):
                g = meta["guarantee"]
                self.store.write_guarantee(run_id, task=task_label, model=spec.name, defense=d.label, seed=seed,
                                           name=str(g.get("name", "guarantee")), value=g.get("value"), details=g)
            for game in s.games:
                inst = ch.instance(game)
                for a in s.attacks:
                    self._evaluate(run_id, ch, inst, a, d, theta, theta_p, reference, data,
                                   shadow_sets_by_defense.get(d.label), **common)

    def _evaluate(self, run_id, ch, inst, a, d, theta, theta_p, reference, data, shadows, *, task, model,
                  seed) -> None:
        s = self.suite
        eval_key = content_hash(ch.world_key, theta.fingerprint, theta_p.fingerprint,
                                reference.fingerprint if reference else None, d.label, d.instance.key,
                                inst.spec.name, a.label, a.instance.key, s.metrics)
        if self.store.has_evaluation(run_id, eval_key):
            self._skipped += 1
            return
        t0 = time.perf_counter()
        try:  # the view is built inline: no runner frame keeps a reference to it while the attack runs
            scores = run_attack(a.instance, ch.view(
                inst, requires=a.instance.requires, pretrained=theta, adapted=theta_p, reference=reference,
                population=data.population, attack_name=a.label, shadows=shadows,
                trainers=getattr(self, "_trainers", None)))
        except PluginError as exc:
            raise PluginError(f"{exc} [game {inst.spec.name}, defense {d.label}]") from exc
        rows = membership_metrics(inst.labels, scores, fprs=tuple(s.metrics["fprs"]), n_boot=s.metrics["n_boot"],
                                  alpha=s.metrics["alpha"], seed=seed)
        family = getattr(a.instance, "family", "mia")
        if family == "exposure":
            rows += exposure_metrics(inst.labels, scores)
        elif family == "extraction":
            from attacks.extraction import extraction_metrics
            rows += extraction_metrics(inst.labels, scores, a.instance.extraction_kind,
                                       id_digits=int((data.public_format or {}).get("id_digits", 10)),
                                       details=getattr(a.instance, "last_details", None), alpha=s.metrics["alpha"])
        self.store.write_evaluation(
            run_id, eval_key, task=task, model=model, defense=d.label, defense_params=d.instance.config, seed=seed,
            game=inst.spec.name, attack=a.label, attack_params=a.instance.config, world_key=ch.world_key,
            target_ids=[t.id for t in inst.targets], labels=inst.labels.tolist(), scores=scores.tolist(),
            metrics=rows, duration_s=time.perf_counter() - t0)
        self._new += 1

    def _utility(self, run_id, lm: HFLanguageModel, heldout: list[str], *, role, defense, key, task, model, seed,
                 train: dict | None = None) -> None:
        sig = lm.token_signals(heldout)
        n_tok = int(sum(x.n_tokens for x in sig))
        total = float(sum(-x.logprobs.astype(np.float64).sum() for x in sig))
        loss = total / max(n_tok, 1)
        hits = int(sum(int(x.top1.sum()) for x in sig))
        values = {"loss": loss, "perplexity": float(np.exp(min(loss, 50.0))),
                  "next_token_accuracy": hits / max(n_tok, 1)}
        if train and "train" in train:
            values["train_seconds"] = float(train["train"].get("seconds", 0.0))
        self.store.write_utility(run_id, content_hash(key, "heldout", len(heldout)), task=task, model=model,
                                 defense=defense, seed=seed, role=role, dataset="heldout", values=values,
                                 n_tokens=n_tok)
