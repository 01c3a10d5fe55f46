"""Data split names: ``task`` or ``task:<variant>`` plus ``k=v`` parameters, resolved to configured tasks.

A *split* is a task with the parameters that select one data set: a registered task name (``mini_pile``), or
``task:<variant>`` for a task that declares a ``variant_param`` (``pile_subset:wiki`` sets ``subset=wiki``,
``canaries:rare`` sets ``prefix_type=rare``). Further parameters come as ``k=v``; values are read as YAML
(numbers, ``true``/``false``, ``[a, b]``), except for string parameters, which keep the text. Used by the data
command line (:mod:`tasks.cli`) and the distance report (:mod:`tasks.distance`).
"""

from __future__ import annotations

import difflib
from typing import Any, List, Optional

import yaml

from bench.errors import ConfigError, RegistryError


def offline_splits() -> list[str]:
    """Every split that builds offline with its defaults (tasks that declare ``offline``, one per variant of their
    ``variant_param``): the default of `data build --all`."""
    from bench.registry import TASKS

    out: list[str] = []
    for name in ORDER + [n for n in TASKS.names() if n not in ORDER]:
        cls = TASKS.get(name)
        if not cls.offline:
            continue
        if cls.variant_param is None:
            out.append(name)
        else:
            param = next(p for p in cls.params if p.name == cls.variant_param)
            out.extend(f"{name}:{c}" for c in param.choices)
    return out


#: the order `privbench data list` shows the built-in splits in (any other task follows, by name)
ORDER = ["mini_pile", "pile_subset", "canaries", "random_word_canaries", "names2ids"]


def _suggest(name: str) -> str:
    from bench.registry import TASKS

    known = list(dict.fromkeys(offline_splits() + TASKS.names()))
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    if not close:  # "wiki" -> "pile_subset:wiki", "rare" -> "canaries:rare"
        close = [k for k in known if ":" in k and k.split(":", 1)[1] == name][:1]
    return f"did you mean '{close[0]}'?" if close else "see `privbench data list`"


def parse_name(name: str) -> tuple[str, dict[str, Any]]:
    """``"pile_subset:wiki"`` -> ``("pile_subset", {"subset": "wiki"})``; RegistryError/ConfigError if unknown."""
    from bench.registry import TASKS

    base, colon, variant = str(name).partition(":")
    if base not in TASKS.names():
        raise RegistryError(f"unknown data split '{name}': {_suggest(name)}")
    if colon and not variant.strip():
        raise ConfigError(f"data split '{name}' names no variant after the colon: write '{base}' or "
                          f"'{base}:<variant>' (`privbench data list` shows them)")
    if not variant:
        return base, {}
    variant_param = TASKS.get(base).variant_param
    if variant_param is None:
        raise ConfigError(f"task '{base}' has no variants: use '{base}' and give parameters with --params k=v")
    param = next(p for p in TASKS.get(base).params if p.name == variant_param)
    if param.choices and variant not in param.choices:
        close = difflib.get_close_matches(variant, [str(c) for c in param.choices], n=1, cutoff=0.5)
        hint = f"did you mean '{base}:{close[0]}'?" if close else \
            f"use one of {', '.join(f'{base}:{c}' for c in param.choices)}"
        raise ConfigError(f"unknown {param.name} '{variant}' in data split '{name}': {hint}")
    return base, {param.name: variant}


def parse_params(items: Optional[List[str]], task_name: str) -> dict[str, Any]:
    """``["k=v", ...]`` -> a dict, each value typed by the task's parameter declaration."""
    from bench.registry import TASKS

    specs = {p.name: p for p in TASKS.get(task_name).params}
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = str(item).partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"cannot read parameter '{item}': write it as name=value, "
                              f"e.g. max_chars_per_source=300000")
        spec = specs.get(key)
        if spec is not None and spec.type is str:
            value: Any = raw
        else:
            try:
                value = yaml.safe_load(raw) if raw.strip() else None
            except yaml.YAMLError:
                value = raw
            if spec is not None and spec.type is list and isinstance(value, str):
                value = [v.strip() for v in value.split(",") if v.strip()]
        out[key] = value
    return out


def make_task(name: str, params: Optional[dict[str, Any]] = None):
    """The configured task of a split name plus parameters (validated by the task)."""
    from bench.registry import TASKS

    base, fixed = parse_name(name)
    params = dict(params or {})
    for key, value in fixed.items():
        if key in params and params[key] != value:
            raise ConfigError(f"data split '{name}' sets {key}={value} but the parameters say {key}={params[key]}: "
                              f"give it once")
    return TASKS.create(base, {**params, **fixed})


def split_label(name: str, params: Optional[dict[str, Any]] = None) -> str:
    """Display name: the split name, plus ``[k=v,...]`` for extra parameters."""
    base, fixed = parse_name(name)
    extra = {k: v for k, v in (params or {}).items() if k not in fixed}
    if not extra:
        return name
    def show(v: Any) -> str:
        return "+".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)

    return f"{name}[{','.join(f'{k}={show(v)}' for k, v in extra.items())}]"


