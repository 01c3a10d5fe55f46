"""Suites as data: a YAML file naming tasks, models, defenses, attacks, games, seeds and world sizes.

Everything is validated when the suite loads, before any training starts, so a
typo costs a second, not an hour.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.errors import ConfigError, PrivbenchError
from bench.game import WORLD_PARAMS, GameSpec, keyed_world, resolve_games
from bench.hashing import content_hash
from bench.modeling import ModelSpec, resolve_spec
from bench.params import validate_params
from bench.registry import ATTACKS, DEFENSES, TASKS

#: δ at which every evaluation's ε lower bound is computed, and the bound's confidence level
AUDIT_DEFAULTS: dict[str, Any] = {"delta": 1e-5, "confidence": 0.95}
#: fewest audit canaries the audit game accepts (its guess grid takes at least one of 20)
MIN_AUDIT_CANARIES = 20
SUITE_DIR = Path(__file__).resolve().parent / "suites"
TOP_KEYS = {"name", "description", "seeds", "tasks", "models", "defenses", "attacks", "games", "world",
            "reference", "shadows", "metrics", "utility", "device", "track", "audit"}


@dataclass
class PluginEntry:
    label: str          # unique name in this suite (defaults to the plugin name)
    name: str
    params: dict[str, Any]
    instance: Any
    #: matched-utility tuning of a defense (bench/matching.py), or None
    match: dict[str, Any] | None = None


@dataclass
class Suite:
    name: str
    description: str
    path: str | None
    raw: dict[str, Any]
    seeds: list[int]
    tasks: list[PluginEntry]
    models: list[ModelSpec]
    defenses: list[PluginEntry]
    attacks: list[PluginEntry]
    games: list[GameSpec]
    world: dict[str, Any]
    reference: bool
    metrics: dict[str, Any] = field(default_factory=dict)
    utility: dict[str, Any] = field(default_factory=dict)
    device: str = "auto"
    shadows: dict[str, Any] = field(default_factory=dict)
    #: the task whose held-out partition measures out-of-domain utility (``utility: {ood: ...}``), if any
    utility_ood: PluginEntry | None = None
    #: the frozen track the suite runs on (bench/tracks.py): {"name", "hash", "headline_game"}, or None
    track: dict[str, Any] | None = None
    #: δ and confidence of the ε lower bounds (bench/audit.py): {"delta", "confidence"}
    audit: dict[str, Any] = field(default_factory=lambda: dict(AUDIT_DEFAULTS))

    @property
    def retained_anchor(self) -> PluginEntry | None:
        """The ``finetune`` entry utility retained is measured against, when the suite computes it."""
        if self.utility.get("retained") is False:
            return None
        return next((d for d in self.defenses if d.label == "finetune" and d.name == "finetune"), None)

    @property
    def config(self) -> dict[str, Any]:
        """The fully resolved configuration (defaults filled in): what the run key hashes."""
        return {
            "name": self.name, "seeds": self.seeds,
            "tasks": [{"label": e.label, "name": e.name, "params": e.instance.config} for e in self.tasks],
            "models": [m.to_dict() for m in self.models],
            "defenses": [{"label": e.label, "name": e.name, "version": e.instance.version,
                          "params": e.instance.config, **({"match": e.match} if e.match else {})}
                         for e in self.defenses],
            "attacks": [{"label": e.label, "name": e.name, "version": e.instance.version,
                         "params": e.instance.config} for e in self.attacks],
            "games": [g.name for g in self.games], "world": keyed_world(self.world), "reference": self.reference,
            "metrics": self.metrics, "utility": self.utility, "device": self.device, "shadows": self.shadows,
            **({"track": self.track} if self.track else {}),
            # only when not the defaults, so that the run keys of suites written before the audit stay the same
            **({"audit": self.audit} if self.audit != AUDIT_DEFAULTS else {}),
        }

    @property
    def config_hash(self) -> str:
        return content_hash(self.config)


def find_suite(ref: str) -> Path:
    """A path to a YAML file, or the name of a bundled suite (``smoke``, ``quick``); a bare name is the bundled
    suite even where a folder of that name exists here."""
    if not str(ref).strip():
        raise ConfigError(f"the suite is empty text: give a bundled suite ({', '.join(bundled_suites())}) or a "
                          f"path to a .yaml file")
    p = Path(ref)
    bundled = SUITE_DIR / f"{ref}.yaml"
    if p.suffix not in (".yaml", ".yml") and p.is_dir() and "/" not in str(ref) and bundled.is_file():
        return bundled
    if p.suffix in (".yaml", ".yml") or p.exists():
        if p.is_dir():
            raise ConfigError(f"suite path '{ref}' is a directory: give the suite's .yaml file inside it")
        if not p.is_file():
            raise ConfigError(f"suite file '{ref}' not found: check the path, or use a bundled suite "
                              f"({', '.join(bundled_suites())})")
        return p
    if bundled.is_file():
        return bundled
    close = difflib.get_close_matches(ref, bundled_suites(), n=1)
    raise ConfigError(f"unknown suite '{ref}': " + (f"did you mean '{close[0]}'? " if close else "") +
                      f"bundled suites: {', '.join(bundled_suites())}; or give a path to a .yaml file")


def bundled_suites() -> list[str]:
    return sorted(p.stem for p in SUITE_DIR.glob("*.yaml"))


class UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (plain YAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"a mapping key must be a name or a number, not a {type(key).__name__}: write the key "
                                f"as plain text", key_node.start_mark)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key '{key}' appears twice in one mapping: keep one", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_suite(ref: str) -> Suite:
    path = find_suite(ref)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"suite file '{path}' is not UTF-8 text: save it as UTF-8 YAML") from None
    try:
        raw = yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or getattr(exc, "reason", None) or str(exc).splitlines()[0]
        raise ConfigError(f"suite file '{path}' is not valid YAML{where}: {problem} (save it as UTF-8 YAML)"
                          ) from None
    if raw is None:
        raise ConfigError(f"suite file '{path}' is empty: see the bundled suites in {SUITE_DIR} for the format")
    return parse_suite(raw, path=str(path))


def _entries(raw: Any, key: str, registry, suite: str, *, sweep: bool = False) -> list[PluginEntry]:
    if raw is None:
        raise ConfigError(f"suite '{suite}': '{key}' is missing: list at least one {registry.kind}")
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"suite '{suite}': '{key}' must be a non-empty list of names or {{name, params}} mappings")
    allowed = {"name", "params", "label"} | ({"sweep"} if sweep else set()) | ({"match"} if key == "defenses" else set())
    out, seen = [], set()
    for item in raw:
        if isinstance(item, str):
            item = {"name": item}
        if not isinstance(item, dict) or "name" not in item:
            raise ConfigError(f"suite '{suite}': every entry of '{key}' needs a 'name' (got {item!r})")
        extra = set(item) - allowed
        if extra:
            raise ConfigError(f"suite '{suite}': entry '{item['name']}' of '{key}' has unknown keys {sorted(extra)}: "
                              f"use {', '.join(sorted(allowed))}")
        params = {} if item.get("params") is None else item["params"]
        if not isinstance(params, dict) or not all(isinstance(k, str) for k in params):
            raise ConfigError(f"suite '{suite}': params of '{item['name']}' must be a mapping of name: value "
                              f"(got {params!r})")
        match = None
        if "match" in item:  # matched utility (bench/matching.py)
            from bench.matching import parse_match
            match = parse_match(item["match"], str(item["name"]), params, registry.create, suite)
        for attr in ("name", "label"):
            if attr in item and not isinstance(item[attr], str):
                raise ConfigError(f"suite '{suite}': the {attr} of an entry of '{key}' is {item[attr]!r}: give a "
                                  f"plain string (quote it if it looks like a number)")
        base_label = str(item.get("label") or item["name"])
        for point in sweep_points(item.get("sweep"), params, registry, str(item["name"]), suite):
            instance = registry.create(str(item["name"]), {**params, **point})
            # the label shows the swept values as validated (e.g. k=0.1), so every point is its own leaderboard entry
            label = base_label + (sweep_suffix({k: instance.config[k] for k in point}) if point else "")
            if label in seen:
                raise ConfigError(f"suite '{suite}': '{label}' appears twice in '{key}': give one a distinct 'label'")
            seen.add(label)
            out.append(PluginEntry(label, str(item["name"]), {**params, **point}, instance, match))
    return out


MAX_SEED = 2 ** 31


def check_device(device: str, suite: str) -> None:
    """Refuse a device string torch does not parse (``gpu``), naming the ones it does; availability is checked when
    a run starts (bench/device.py), so a suite can be planned on a machine without the device."""
    import torch
    if device == "auto":
        return
    try:
        torch.device(device)
    except (RuntimeError, ValueError):
        raise ConfigError(f"suite '{suite}': device '{device}' is not a device: use auto, cpu, cuda or cuda:N"
                          ) from None


def _check_local_checkpoint(spec: ModelSpec, where: str) -> None:
    """An ``hf_id`` written as a path (absolute, ``./``, ``../``, ``~``) must be a directory holding a checkpoint:
    otherwise the run would reach transformers, which reads it as a malformed hub id, only after training θ."""
    from pathlib import Path
    hf_id = str(spec.hf_id)
    as_path = Path(hf_id).expanduser()
    if not (hf_id.startswith(("/", "./", "../", "~")) or as_path.is_dir()):
        return  # a hub id such as EleutherAI/pythia-70m
    if not as_path.is_dir():
        what = "is a file" if as_path.exists() else "does not exist"
        raise ConfigError(f"{where}: hf_id {hf_id} {what}: give the directory of a checkpoint in Hugging Face "
                          f"format (config.json and weights), or a hub id such as EleutherAI/pythia-70m")
    wanted = spec.gguf_file or "config.json"
    if not (as_path / wanted).is_file():
        raise ConfigError(f"{where}: hf_id {hf_id} holds no {wanted}: give the directory of a checkpoint in Hugging "
                          f"Face format" + (f" that holds {wanted}" if spec.gguf_file else " (config.json and weights)"))


def check_model(spec: ModelSpec, suite: str) -> ModelSpec:
    """A model spec that can be built: finite numbers, a known source, heads that divide the hidden size."""
    import math
    where = f"suite '{suite}': model '{spec.name}'"
    if spec.source not in ("scratch", "hf"):
        raise ConfigError(f"{where}: source '{spec.source}' is unknown: use scratch (trained here) or hf (with hf_id)")
    if spec.source == "hf" and not spec.hf_id:
        raise ConfigError(f"{where}: source hf needs hf_id (a hub id or a local directory in Hugging Face format)")
    if spec.source == "hf":
        _check_local_checkpoint(spec, where)
    for key, value in spec.to_dict().items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{where}: parameter '{key}' is {value!r}: give a finite number")
    if spec.source == "scratch" and spec.hidden_size % spec.num_heads:
        raise ConfigError(f"{where}: hidden_size {spec.hidden_size} is not a multiple of num_heads {spec.num_heads}: "
                          f"pick sizes whose heads divide the hidden size (e.g. 128 and 4)")
    if spec.context_length < 2:
        raise ConfigError(f"{where}: context_length {spec.context_length} holds no next-token prediction: use at "
                          f"least 2 (e.g. 128)")
    return spec


def check_training_lengths(defenses: list[PluginEntry], models: list[ModelSpec], suite: str) -> None:
    """No defense trains on records longer than a model reads: every score is truncated at the model's
    context_length, so tokens trained on past it would be memorised where no attack and no utility measure looks
    (and positions past it are ones the model was never built for)."""
    for d in defenses:
        chunks = [d.instance.config.get("chunk_length")]
        if d.match and d.match.get("param") == "chunk_length":  # matched utility tries every grid value
            chunks += list(d.match.get("grid") or [])
        chunk = max((c for c in chunks if isinstance(c, (int, float))), default=None)
        for mo in models:
            if chunk is not None and chunk > mo.context_length:
                chunk = int(chunk)
                raise ConfigError(
                    f"suite '{suite}': defense '{d.label}' trains on records of up to {chunk} tokens (chunk_length) "
                    f"but model '{mo.name}' is scored on its first {mo.context_length} (context_length), so what it "
                    f"learns past token {mo.context_length} is never measured: set chunk_length to at most "
                    f"{mo.context_length}, or give the model context_length: {chunk} (models: [{{name: {mo.name}, "
                    f"params: {{context_length: {chunk}}}}}])")


def sweep_suffix(point: dict[str, Any]) -> str:
    """``(k=0.1)`` or ``(k=0.1, seed=2)``: how a swept entry's label names its parameter values."""
    return "(" + ", ".join(f"{k}={v}" for k, v in point.items()) + ")"


def sweep_points(raw: Any, params: dict[str, Any], registry, name: str, suite: str) -> list[dict[str, Any]]:
    """The grid of a ``sweep: {param: [values...]}`` mapping, in the order written (cartesian product).

    ``[{}]`` when there is no sweep. Parameter names are checked here; values are validated by the plugin like any
    parameter when each point is instantiated.
    """
    if raw is None:
        return [{}]
    where = f"suite '{suite}': sweep of '{name}'"
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{where} must be a mapping of parameter: [values] (e.g. sweep: {{k: [0.1, 0.2]}})")
    known = {p.name for p in registry.get(name).params}
    axes = []
    for param, values in raw.items():
        if param not in known:
            close = difflib.get_close_matches(str(param), sorted(known), n=1)
            raise ConfigError(f"{where}: unknown parameter '{param}': " +
                              (f"did you mean '{close[0]}'?" if close else
                               f"known parameters: {', '.join(sorted(known)) or 'none'}"))
        if param in params:
            raise ConfigError(f"{where}: '{param}' is both in params and swept: keep it in one of them")
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}: '{param}' must list at least one value (e.g. {param}: [0.1, 0.2])")
        if len({repr(v) for v in values}) != len(values):
            raise ConfigError(f"{where}: '{param}' repeats a value: list each value once")
        axes.append([(param, v) for v in values])
    import itertools
    return [dict(combo) for combo in itertools.product(*axes)]


def parse_suite(raw: Any, path: str | None = None) -> Suite:
    where = path or "<suite>"
    if not isinstance(raw, dict):
        raise ConfigError(f"suite '{where}' must be a YAML mapping with keys like name, seeds, tasks, models, ...")
    if "track" in raw:  # a frozen track (bench/tracks.py): its settings, its anchors, the suite's defenses
        from bench.tracks import suite_from_track
        full, track = suite_from_track(raw, str(raw.get("name") or where))
        suite = parse_suite(full, path=path)
        suite.raw = raw
        suite.track = {"name": track.name, "hash": track.hash, "headline_game": track.headline_game}
        return suite
    unknown = set(raw) - TOP_KEYS
    if unknown:
        key = sorted(str(k) for k in unknown)[0]
        close = difflib.get_close_matches(key, sorted(TOP_KEYS), n=1)
        raise ConfigError(f"suite '{where}': unknown key '{key}': " +
                          (f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(sorted(TOP_KEYS))}"))
    name = raw.get("name") or (Path(path).stem if path else "suite")
    if not isinstance(name, str):
        raise ConfigError(f"suite name {name!r} is not a string: give one plain name (e.g. name: my-suite; quote "
                          f"it if it looks like a number)")
    seeds = raw.get("seeds", [0])
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        seeds = [seeds]
    if (not isinstance(seeds, list) or not seeds or
            not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < MAX_SEED for s in seeds)):
        raise ConfigError(f"suite '{name}': seeds must be a non-empty list of non-negative integers below 2**31 "
                          f"(got {seeds!r})")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"suite '{name}': seeds {seeds} repeat a value: list each seed once")
    models_raw = raw.get("models")
    if not isinstance(models_raw, list) or not models_raw:
        raise ConfigError(f"suite '{name}': 'models' must be a non-empty list (e.g. [nano])")
    models = []
    for m in models_raw:
        if isinstance(m, str):
            m = {"name": m}
        if not isinstance(m, dict) or "name" not in m:
            raise ConfigError(f"suite '{name}': every model needs a 'name' (got {m!r})")
        extra = set(m) - {"name", "params"}
        if extra:
            raise ConfigError(f"suite '{name}': model '{m['name']}' has unknown keys {sorted(map(str, extra))}: "
                              f"use name and params")
        mparams = {} if m.get("params") is None else m["params"]
        if not isinstance(mparams, dict) or not all(isinstance(k, str) for k in mparams):
            raise ConfigError(f"suite '{name}': params of model '{m['name']}' must be a mapping of name: value "
                              f"(got {mparams!r}), e.g. {{pretrain_tokens: 30000}}")
        models.append(check_model(resolve_spec(str(m["name"]), mparams), name))
    names = [mo.name for mo in models]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"suite '{name}': model '{twice[0]}' appears twice in 'models': results are stored by model "
                          f"name, so list each model once (run another configuration in a suite of its own)")
    try:
        tasks = _entries(raw.get("tasks"), "tasks", TASKS, name)
        defenses = _entries(raw.get("defenses"), "defenses", DEFENSES, name)
        attacks = _entries(raw.get("attacks"), "attacks", ATTACKS, name, sweep=True)
    except ConfigError:
        raise
    except PrivbenchError as exc:
        raise ConfigError(f"suite '{name}': {exc}") from None
    check_training_lengths(defenses, models, str(name))
    labels = {d.label: d for d in defenses}
    for d in defenses:
        target = (d.match or {}).get("target_defense")
        if target is not None and (target not in labels or labels[target].match or target == d.label):
            raise ConfigError(f"suite '{name}': defense '{d.label}' matches the utility of '{target}', which is not an "
                              f"unmatched defense of this suite: name one of "
                              f"{', '.join(x.label for x in defenses if not x.match)}")
    games = resolve_games(raw.get("games", "all"))
    world = validate_params(f"suite '{name}' world", WORLD_PARAMS, raw.get("world"))
    for game, pool in (("audit", "n_audit"), ("audit/pretrain", "n_audit_pretrain")):
        if any(g.name == game for g in games) and world[pool] < MIN_AUDIT_CANARIES:
            raise ConfigError(f"suite '{name}': the {game} game needs an audit pool, but world {pool} is "
                              f"{world[pool]}: set world {pool} to at least {MIN_AUDIT_CANARIES} (e.g. 200)")
    known_a = all(t.instance.known_pretraining_membership for t in tasks)
    for spec in models:
        if spec.source == "hf" and not known_a:
            bad = [g.name for g in games if g.name not in ("adapt", "joint/fresh", "null")]
            if bad:
                raise ConfigError(f"suite '{name}': model '{spec.name}' is a released checkpoint whose pretraining "
                                  f"privbench does not control, so games {bad} are undefined: use games "
                                  f"[adapt, joint/fresh, null] or a task with a known pretraining split (mimir, "
                                  f"pile_split)")
        if spec.source == "hf" and world["background_in_pretraining"] != "none" and not known_a:
            raise ConfigError(f"suite '{name}': world background_in_pretraining is "
                              f"{world['background_in_pretraining']}, but model '{spec.name}' is a released "
                              f"checkpoint that privbench does not pretrain, so no background record can be put "
                              f"in its pretraining data: drop the setting, use a scratch model (e.g. nano), or a "
                              f"task with the model's known pretraining split (mimir, pile_split), whose members "
                              f"then give that share of the background")
    ref = raw.get("reference", True)
    if not isinstance(ref, bool):
        raise ConfigError(f"suite '{name}': 'reference' must be true or false")
    metrics = raw.get("metrics") or {}
    if not isinstance(metrics, dict):
        raise ConfigError(f"suite '{name}': 'metrics' must be a mapping")
    from bench.params import Param
    metrics = validate_params(f"suite '{name}' metrics", (
        Param("n_boot", int, 1000, "bootstrap resamples for the AUC CI", low=10),
        Param("alpha", float, 0.05, "1 - confidence level", low=0.0, high=0.5, low_inclusive=False),
        Param("fprs", list, [0.001, 0.01, 0.05], "FPR targets for TPR@FPR", item_type=float),
    ), metrics)
    bad_fpr = [f for f in metrics["fprs"] if not 0.0 < f < 1.0]
    if bad_fpr:
        raise ConfigError(f"suite '{name}' metrics: fprs {bad_fpr} lie outside (0, 1): give false-positive rates "
                          f"such as [0.001, 0.01, 0.05]")
    raw_utility = dict(raw.get("utility") or {}) if isinstance(raw.get("utility") or {}, dict) else raw.get("utility")
    if not isinstance(raw_utility, dict):
        raise ConfigError(f"suite '{name}': 'utility' must be a mapping (e.g. {{n_heldout: 200}})")
    ood_raw = raw_utility.pop("ood", None)
    utility = validate_params(f"suite '{name}' utility", (
        Param("n_heldout", int, 200, "held-out records for loss / perplexity", low=1),
        Param("n_generate", int, 24, "held-out records continued greedily for ROUGE-1/ROUGE-L (0 = off)", low=0),
        Param("prompt_tokens", int, 32, "tokens of a held-out record given as the generation prompt", low=1),
        Param("max_new_tokens", int, 32, "tokens generated and compared with the record's true continuation",
              low=1),
        Param("retained", bool, None, "utility retained against the `finetune` anchor: null = when the suite has "
              "one, true = required (an error without it), false = off", nullable=True),
    ), raw_utility)
    if utility["retained"] and not any(d.label == "finetune" and d.name == "finetune" for d in defenses):
        raise ConfigError(f"suite '{name}': utility retained needs a `finetune` anchor in the same worlds: add "
                          f"`finetune` to defenses, or name a track (e.g. `track: quick`), which adds it")
    utility_ood = None
    if ood_raw is not None:  # out-of-domain held-out data: another task's held-out partition
        utility_ood = _entries([ood_raw], "utility.ood", TASKS, str(name))[0]
        utility["ood"] = {"label": utility_ood.label, "name": utility_ood.name, "params": utility_ood.instance.config}
    shadows = validate_params(f"suite '{name}' shadows", (
        Param("n", int, 2, "shadow models per (defense, base); RMIA averages them (and with alpha: null tunes α on "
              "a pair)", low=1),
        Param("records", int, 180, "population records each shadow is adapted on (≈ the size of D̃)", low=4),
        Param("n_population", int, 300, "held-out population records: RMIA's population sample Z", low=4),
    ), raw.get("shadows") or {})
    audit = validate_params(f"suite '{name}' audit", (
        Param("delta", float, AUDIT_DEFAULTS["delta"], "δ of the ε lower bounds (compare with a DP claim's δ: the "
              "audit δ must be >= the claimed δ)", low=0.0, high=1.0, high_inclusive=False),
        Param("confidence", float, AUDIT_DEFAULTS["confidence"], "confidence level of the ε lower bounds",
              low=0.0, high=1.0, low_inclusive=False, high_inclusive=False),
    ), raw.get("audit") or {})
    device = raw.get("device", "auto")
    if not isinstance(device, str):
        raise ConfigError(f"suite '{name}': 'device' must be a string like auto, cpu or cuda")
    check_device(device, name)
    return Suite(name=str(name), description=str(raw.get("description", "")), path=path, raw=raw, seeds=seeds,
                 tasks=tasks, models=models, defenses=defenses, attacks=attacks, games=games, world=world,
                 reference=ref, metrics=metrics, utility=utility, device=device, shadows=shadows,
                 utility_ood=utility_ood, audit=audit)
