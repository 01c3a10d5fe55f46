"""The checks of `privbench validate`, for a plugin package's own tests (in the spirit of scikit-learn's
``parametrize_with_checks``)::

    from bench.conformance import parametrize_with_checks
    from my_package.defenses import MyDefense

    @parametrize_with_checks([MyDefense])
    def test_privbench_contract(plugin, check):
        check(plugin)

Each check raises ``AssertionError`` with the problem and its fix. The registration checks are static and fast;
``run=True`` adds the tiny-world run (the smoke suite's task and model shrunk to seconds), in process.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.validate import Check, registration_checks, tiny_world_check

__all__ = ["plugin_checks", "parametrize_with_checks"]


def _kind(cls: type) -> str:
    from bench.attack import Attack
    from bench.defense import Defense
    if issubclass(cls, Defense):
        return "defense"
    if issubclass(cls, Attack):
        return "attack"
    raise AssertionError(f"{cls.__name__} is neither an Attack nor a Defense: derive it from bench.attack.Attack or "
                         f"bench.defense.Defense")


def _raise(check: Check) -> None:
    if not check.ok:
        raise AssertionError(check.line())


def plugin_checks(cls: type, *, run: bool = False, cache: str | Path | None = None
                  ) -> list[tuple[str, Callable[[type], None]]]:
    """(name, check) pairs for one plugin class; ``check(cls)`` raises AssertionError on a problem."""
    kind = _kind(cls)
    name = getattr(cls, "name", "") or cls.__name__.lower()
    static = registration_checks(kind, name, cls)
    out: list[tuple[str, Callable[[type], None]]] = [
        (c.name, (lambda _cls, c=c: _raise(c))) for c in static]
    if run:
        def tiny(_cls: type) -> None:
            from bench.registry import DEFENSES, ATTACKS
            registry = DEFENSES if kind == "defense" else ATTACKS
            registry.register(name, origin=f"module {cls.__module__}")(cls)
            with tempfile.TemporaryDirectory() as work:
                _raise(tiny_world_check(kind, name, cls, cache=cache, workdir=Path(work)))
        out.append(("tiny world", tiny))
    return out


def parametrize_with_checks(classes: Sequence[type], *, run: bool = False, cache: str | Path | None = None):
    """A ``pytest.mark.parametrize("plugin, check", ...)`` over every check of every class, with readable ids."""
    import pytest
    cases, ids = [], []
    for cls in classes:
        for label, check in plugin_checks(cls, run=run, cache=cache):
            cases.append((cls, check))
            ids.append(f"{cls.__name__}-{label.replace(' ', '_')}")
    return pytest.mark.parametrize("plugin, check", cases, ids=ids)
