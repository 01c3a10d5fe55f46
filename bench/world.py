"""The worlds of a suite, built lazily: data → tokenizer → θ (and the attacker's reference) → shadows → θ′ → loaded
models. One :class:`Worlds` per process: the driver plans with it, and every job function (bench/jobs.py), in
process or on a Ray worker, rebuilds what it needs from the content-addressed cache through it, memoized.

A world is (task ``ti``, model ``mi``, seed); defenses are indexed by ``di`` in the suite's order.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from functools import partial

import torch

from bench.artifacts import ensure_adapted, ensure_pretrained, ensure_reference, ensure_tokenizer, pretrains
from bench.cache import ArtifactCache, same_content
from bench.device import release_memory, score_bf16, select_device
from bench.errors import CapabilityError, ConfigError, DataError
from bench.game import AdaptationData, Challenger, ShadowSet, capability_problem
from bench.hashing import content_hash
from bench.keys import match_key, scoring_fingerprint, shadow_seed
from bench.lm import FINETUNE_REFERENCE, SHADOW_MODELS, HFLanguageModel, SignalCache
from bench.matching import brackets, candidate_params, pick
from bench.modeling import ModelSpec, load_model
from bench.plugin import plugin_code
from bench.registry import DEFENSES
from bench.release import is_release, load_release
from bench.suite import PluginEntry, Suite
from bench.task import built_task_data
from bench.units import secrets_of
from bench.utility import heldout_metrics

#: language models kept loaded at once per process; older ones are dropped and their memory released
LM_MEMO_SIZE = 4


def shadow_data(data, texts: tuple[str, ...], defense) -> AdaptationData:
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
        per_text, secret_targets = secrets_of(data, train)
        secrets = tuple(per_text)
    return AdaptationData(train, users=users, secrets=secrets, secret_targets=secret_targets, validation=validation)


class Worlds:
    """Lazy, memoized state of a suite's worlds; every artifact comes from (or goes to) the cache."""

    def __init__(self, suite: Suite, cache: ArtifactCache, *, draw_secret: str | None = None, quiet: bool = False,
                 log: Callable[[str], None] = lambda msg: None) -> None:
        self.suite = suite
        self.cache = cache
        self.signals = SignalCache.for_cache(cache)
        #: salts every world's draw (bench.game.Challenger); None = the public, reproducible draw
        self.draw_secret = draw_secret
        self.quiet = quiet
        self.log = log
        self._memo: dict = {}
        self._lms: OrderedDict[str, HFLanguageModel] = OrderedDict()

    @property
    def device(self) -> torch.device:
        return select_device(self.suite.device)

    def once(self, key, make):
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    # -- data and the challenger ------------------------------------------------------------------------------
    def data(self, ti: int):
        t = self.suite.tasks[ti]
        return self.once(("data", ti), lambda: built_task_data(t.instance, self.cache))

    def challenger(self, ti: int, seed: int) -> Challenger:
        return self.once(("ch", ti, seed), lambda: Challenger(self.data(ti), self.suite.world, seed,
                                                              secret=self.draw_secret))

    def heldout(self, ti: int) -> list[str]:
        return list(self.data(ti).heldout[: self.suite.utility["n_heldout"]])

    def warm(self, ti: int, seed: int) -> list[str]:
        """Texts every model of a world is scored on once, before any attack: targets and held-out data."""
        ch = self.challenger(ti, seed)
        return ch.target_texts() + ch.sample_texts() + self.heldout(ti)  # unit games: the samples attacks see

    def ood_heldout(self) -> tuple[str, list[str]] | None:
        """(label, texts) of the suite's out-of-domain utility data (``utility: {ood: ...}``), or None."""
        entry = self.suite.utility_ood
        if entry is None:
            return None
        return self.once(("ood",), lambda: (entry.label, list(
            built_task_data(entry.instance, self.cache).heldout[: self.suite.utility["n_heldout"]])))

    def check(self, task_label: str, data) -> None:
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
        self.check_attacks(task_label, data)

    def check_attacks(self, task_label: str, data) -> None:
        """Refuse, before any training, an attack the suite's worlds cannot serve: a model, shadows or population
        data it declares in ``requires`` that no game of the suite would give it (the rules ``Challenger.view``
        enforces when the attack runs), or a task whose targets it cannot score (:meth:`Attack.check_task`)."""
        s = self.suite
        shadows_wanted = self.needs_shadows()
        trainers_wanted = any(FINETUNE_REFERENCE in a.instance.requires for a in s.attacks)
        for a in s.attacks:
            with plugin_code(a.instance, "check_task"):
                a.instance.check_task(data.public_format, data.unit)
        for spec in s.models:
            reference = bool(s.reference) and spec.source == "scratch"
            shadow_sets = frozenset({"pretrain", "base", "reference"}) if shadows_wanted and reference else frozenset()
            trainer_starts = frozenset({"base", "reference"} if reference else {"base"}) if trainers_wanted \
                else frozenset()
            for g in s.games:
                for a in s.attacks:
                    problem = capability_problem(g, a.instance.requires, attack_name=a.label, task_name=task_label,
                                                 unit=data.unit, reference=reference,
                                                 population=bool(data.population), shadow_sets=shadow_sets,
                                                 trainer_starts=trainer_starts)
                    if problem:
                        raise CapabilityError(f"{problem} (model '{spec.name}'; refused before any training)")

    # -- models: (path, artifact key) ------------------------------------------------------------------------
    def tokenizer(self, ti: int, mi: int):
        spec = self.suite.models[mi]
        if spec.source != "scratch":
            return None
        return self.once(("tok", ti, mi), lambda: ensure_tokenizer(self.cache, spec, self.data(ti)))

    def reference_base(self, ti: int, mi: int):
        """(path, key) of the attacker's reference model, or None when the suite has none."""
        s, spec = self.suite, self.suite.models[mi]
        if not (s.reference and spec.source == "scratch"):
            return None

        def make():
            data = self.data(ti)
            # with shadows, the reference model trains on its own slice of the population, disjoint from
            # the shadows' slices and from RMIA's sample Z; without them, on all of it
            ref_texts = self.population_split(data)["reference"] if self.needs_shadows() else None
            return ensure_reference(self.cache, spec, data, self.tokenizer(ti, mi), self.device,
                                    progress=not self.quiet, texts=ref_texts)
        return self.once(("ref", ti, mi), make)

    def _base(self, ti: int, mi: int, seed: int):
        spec = self.suite.models[mi]
        return self.once(("base", ti, mi, seed), lambda: ensure_pretrained(
            self.cache, spec, self.data(ti), self.tokenizer(ti, mi), self.challenger(ti, seed).pretraining_inserts(),
            seed, self.device, progress=not self.quiet))

    def theta(self, ti: int, mi: int, seed: int, di: int | None = None):
        """(path, key) of θ for defense ``di``: the world's shared θ, or, for a defense acting at pretraining
        (dedup, goldfish), θ pretrained through its hooks (bench/artifacts.ensure_pretrained)."""
        if di is None or not pretrains(self.suite.defenses[di].instance):
            return self._base(ti, mi, seed)
        spec, d = self.suite.models[mi], self.suite.defenses[di]
        return self.once(("base", ti, mi, seed, d.label), lambda: ensure_pretrained(
            self.cache, spec, self.data(ti), self.tokenizer(ti, mi), self.challenger(ti, seed).pretraining_inserts(),
            seed, self.device, progress=not self.quiet, defense=d.instance))

    def defense(self, ti: int, mi: int, seed: int, di: int) -> PluginEntry:
        """The defense entry of this world: as configured, or with its ``match`` parameter tuned (bench/matching.py)."""
        d = self.suite.defenses[di]
        if not d.match:
            return d
        return self.matched(ti, mi, seed, di)[0]

    def matched(self, ti: int, mi: int, seed: int, di: int) -> tuple[PluginEntry, dict]:
        """Adapt once per grid value (each cached), keep the value whose validation loss is closest to the target.

        Validation records come after the ``n_heldout`` records utility is reported on: never targets, never
        the reported utility's own data. Returns the tuned entry and its ``match`` utility row; memoized."""
        return self.once(("defense", ti, mi, seed, di), lambda: self._match(ti, mi, seed, di))

    def _match(self, ti: int, mi: int, seed: int, di: int) -> tuple[PluginEntry, dict]:
        d, spec, m = self.suite.defenses[di], self.suite.models[mi], self.suite.defenses[di].match
        data = self.data(ti)
        n_u = self.suite.utility["n_heldout"]
        val = list(data.heldout[n_u: n_u + m["n_validation"]])
        if len(val) < m["n_validation"]:
            raise DataError(f"defense '{d.label}': matched utility needs {m['n_validation']} validation records after "
                            f"the {n_u} utility records, but the task's held-out partition has {len(data.heldout)}: "
                            f"lower match.n_validation or utility.n_heldout")
        target = m["target_loss"]
        if m["target_defense"] is not None:  # the validation loss another defense reaches in this world
            di_t = next(i for i, x in enumerate(self.suite.defenses) if x.label == m["target_defense"])
            path_t, key_t, _ = self.adapted(ti, mi, seed, di_t)
            target = heldout_metrics(self.lm(path_t, key_t, spec), val)[0]["loss"]
        tried = []
        for params in candidate_params(m, d.params):
            inst = DEFENSES.create(d.name, params)
            self.log(f"defense '{d.label}': matching utility, {m['param']} = {params[m['param']]}")
            path, key, _ = ensure_adapted(self.cache, spec, self.theta(ti, mi, seed, di), inst,
                                          self.challenger(ti, seed).adaptation_data(), seed, self.device,
                                          progress=not self.quiet)
            tried.append((params, inst, heldout_metrics(self.lm(path, key, spec), val)[0]["loss"]))
        best, loss = pick([(i, t[2]) for i, t in enumerate(tried)], target)
        params, inst, _ = tried[best]
        bracketed = brackets([t[2] for t in tried], target)
        if not bracketed:
            self.log(f"defense '{d.label}': no {m['param']} in the grid reaches the target validation loss "
                     f"{target:.3f} (closest {loss:.3f} at {params[m['param']]}): it is not at matched utility; "
                     f"widen match.grid")
        row = dict(utility_key=match_key(inst.key, self.theta(ti, mi, seed, di)[1], m, seed),
                   task=self.suite.tasks[ti].label, model=spec.name, defense=d.label, seed=seed, role="adapted",
                   dataset="match", n_tokens=0,
                   values={"validation_loss": float(loss), "target_loss": float(target),
                           f"chosen_{m['param']}": float(params[m["param"]]),
                           "target_bracketed": float(bracketed)})
        return PluginEntry(d.label, d.name, params, inst, None), row

    def adapted(self, ti: int, mi: int, seed: int, di: int):
        """(path, key, meta) of θ′ for defense ``di``."""
        spec, d = self.suite.models[mi], self.defense(ti, mi, seed, di)
        return self.once(("adapted", ti, mi, seed, di), lambda: ensure_adapted(
            self.cache, spec, self.theta(ti, mi, seed, di), d.instance, self.challenger(ti, seed).adaptation_data(),
            seed, self.device, progress=not self.quiet))

    # -- the attacker's shadows ------------------------------------------------------------------------------
    def population_split(self, data) -> dict:
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

    def needs_shadows(self) -> bool:
        return any(SHADOW_MODELS in a.instance.requires for a in self.suite.attacks)

    def shadow_start(self, ti: int, mi: int, seed: int, which: str, di: int | None = None):
        """(path, key) a shadow starts from: the released θ (``base``) or the attacker's reference."""
        return self.theta(ti, mi, seed, di) if which == "base" else self.reference_base(ti, mi)

    def shadow_model(self, ti: int, mi: int, seed: int, di: int, which: str, i: int):
        """Shadow i: the defense's public recipe applied by the attacker to its own population slice i."""
        spec, d = self.suite.models[mi], self.defense(ti, mi, seed, di)
        data = self.data(ti)
        texts = self.population_split(data)["shadow"][i]
        return self.once(("shadow", ti, mi, seed, di, which, i), lambda: ensure_adapted(
            self.cache, spec, self.shadow_start(ti, mi, seed, which, di), d.instance,
            shadow_data(data, texts, d.instance), shadow_seed(i), self.device, progress=not self.quiet))

    def _shadows(self, ti: int, mi: int, seed: int, di: int, which: str, label: str) -> ShadowSet:
        spec, d = self.suite.models[mi], self.defense(ti, mi, seed, di)
        data = self.data(ti)
        split = self.population_split(data)
        models, members = [], []
        for i, texts in enumerate(split["shadow"]):
            path, key, _ = self.shadow_model(ti, mi, seed, di, which, i)
            models.append(self.lm(path, key, spec))
            members.append(shadow_data(data, texts, d.instance).texts)
        return ShadowSet(tuple(models), tuple(members), split["z"], label)

    def shadow_sets(self, ti: int, mi: int, seed: int, di: int) -> dict[str, ShadowSet] | None:
        """The attacker's shadow sets of a world and defense (None when no attack of the suite uses shadows)."""
        if not (self.needs_shadows() and self.reference_base(ti, mi) is not None):
            return None
        split = self.population_split(self.data(ti))
        reference = self.model_lm(ti, mi, seed, "reference")
        return {"pretrain": ShadowSet((reference,), (split["reference"],), split["z"], "attacker reference"),
                "base": self._shadows(ti, mi, seed, di, "base", "released θ"),
                "reference": self._shadows(ti, mi, seed, di, "reference", "attacker reference")}

    def attacker_trainers(self, mi: int, base: tuple, ref_base: tuple | None) -> dict | None:
        """Factories of fresh trainers for attacks that fine-tune a copy of the attacker's calibration model
        (Self-prompt), one per start model; None when no attack of the suite asks for one."""
        if not any(FINETUNE_REFERENCE in a.instance.requires for a in self.suite.attacks):
            return None
        from bench.attacker_models import make_trainer
        spec = self.suite.models[mi]
        out = {"base": partial(make_trainer, self.cache, spec, base, "released θ", self.device, self.signals)}
        if ref_base is not None:
            out["reference"] = partial(make_trainer, self.cache, spec, ref_base, "attacker reference", self.device,
                                       self.signals)
        return out

    # -- loaded models ---------------------------------------------------------------------------------------
    def fingerprint(self, key: str, spec: ModelSpec) -> str:
        """The fingerprint the model with artifact ``key`` is scored under (bench/keys.py)."""
        return scoring_fingerprint(key, max_length=spec.context_length, bf16=score_bf16(self.device))

    def model_lm(self, ti: int, mi: int, seed: int, role: str, di: int | None = None) -> HFLanguageModel:
        """The loaded model of a world's role: ``pretrained`` (θ), ``reference`` or ``adapted`` (θ′ of ``di``)."""
        if role == "pretrained":
            path, key = self.theta(ti, mi, seed, di)
        elif role == "reference":
            path, key = self.reference_base(ti, mi)
        else:
            path, key, _ = self.adapted(ti, mi, seed, di)
            base_path, base_key = self.theta(ti, mi, seed, di)
            if same_content(base_path, path):  # θ′ is θ byte for byte (`none`): θ's handle, signals and generations
                path, key = base_path, base_key
        return self.lm(path, key, self.suite.models[mi])

    def scoring_key(self, kind: str, key: str, base_key: str) -> str:
        """The artifact key whose scoring fingerprint an adapted model's signals are cached under, without building
        anything: ``base_key`` when both artifacts are already in the cache with the same content, else ``key``
        (as :meth:`model_lm` decides once θ′ exists)."""
        for k, b in ((kind, key), ("pretrained", base_key)):
            if not self.cache.is_valid(k, b, verify=False):
                return key
        return base_key if same_content(self.cache.path("pretrained", base_key), self.cache.path(kind, key)) else key

    def lm(self, path, key: str, spec: ModelSpec) -> HFLanguageModel:
        """A loaded model, kept among the last few used; dropping one releases its (GPU) memory."""
        if key in self._lms:
            self._lms.move_to_end(key)
            return self._lms[key]
        lm = self._load(path, key, spec)
        self._lms[key] = lm
        while len(self._lms) > LM_MEMO_SIZE:
            self._lms.popitem(last=False)
            release_memory(self.device)
        return lm

    def _load(self, path, key: str, spec: ModelSpec) -> HFLanguageModel:
        device, fp = self.device, self.fingerprint(key, spec)
        settings = dict(max_length=spec.context_length, batch_size=spec.score_batch_size, device=device,
                        autocast_bf16=score_bf16(device), cache=self.signals, progress=not self.quiet)
        if is_release(path):  # an aggregate or adapter release (bench/release.py): loaded by its kind's loader
            def make_lm(model, tok, suffix: str = "") -> HFLanguageModel:
                if suffix:  # a constituent of the release, scored only through it
                    return HFLanguageModel(model, tok, fingerprint=content_hash(key, suffix), **settings)
                return HFLanguageModel(model, tok, fingerprint=fp, exact_fingerprint=True, **settings)
            return load_release(path, device=device, fingerprint=fp, make_lm=make_lm)
        hf = spec.source == "hf" and str(path) == str(spec.hf_id)  # the released checkpoint itself
        model, tok = load_model(path, revision=spec.revision if hf else None, device=device,
                                gguf_file=spec.gguf_file if hf else None)
        return HFLanguageModel(model, tok, fingerprint=fp, exact_fingerprint=True, **settings)
