"""privbench as a library: ``privbench.evaluate`` runs a suite from Python, and the plugin API in one namespace.

    import privbench
    results = privbench.evaluate("smoke", db=None)      # or a path / a suite mapping / a Suite
    results.metrics.head()

Plugin authors import the contract from here::

    from privbench import Attack, Defense, Task, Param, Adapted, Scores, register_attack, register_defense

The packages of the repository are importable under this namespace too (``privbench.bench.game``,
``privbench.attacks.min_k``, ...): the names resolve to the very same modules as ``bench.game`` or
``attacks.min_k`` (one module object, one registry), through :class:`_Alias`. The top-level names ``bench``,
``tasks``, ``attacks``, ``defenses`` and ``leaderboard`` still work in this release; privbench's own modules use
them internally, so they do not warn.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_PACKAGES = ("bench", "tasks", "attacks", "defenses", "leaderboard")


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``privbench.<pkg>[.mod]`` is the already-importable ``<pkg>[.mod]``: the same module object, not a copy."""

    def find_spec(self, fullname, path=None, target=None):
        head, _, rest = fullname.partition(".")
        if head != "privbench" or rest.split(".")[0] not in _PACKAGES:
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=True)

    def create_module(self, spec):
        module = importlib.import_module(spec.name.partition(".")[2])
        sys.modules[spec.name] = module
        return module

    def exec_module(self, module) -> None:  # the real module ran when it was imported under its own name
        return None


if not any(isinstance(f, _Alias) for f in sys.meta_path):
    sys.meta_path.insert(0, _Alias())

from bench import __version__  # noqa: E402
from bench.attack import Attack, AttackOutput, MetricContext, Scores  # noqa: E402
from bench.defense import Adapted, Defense, Filtered, TrainContext  # noqa: E402
from bench.game import AdaptationData, AttackerView, Target  # noqa: E402
from bench.params import Param  # noqa: E402
from bench.registry import ATTACKS, DEFENSES, TASKS, register_attack, register_defense, register_task  # noqa: E402
from bench.task import TargetRecord, Task, TaskData  # noqa: E402

__all__ = ["evaluate", "Results", "Attack", "AttackOutput", "MetricContext", "Scores", "Defense", "Adapted",
           "Filtered", "TrainContext", "Task", "TaskData", "TargetRecord", "AdaptationData", "AttackerView",
           "Target", "Param", "register_attack", "register_defense", "register_task", "ATTACKS", "DEFENSES",
           "TASKS", "__version__"]


@dataclass
class Results:
    """What :func:`evaluate` returns: the run's id and status, and its rows as pandas DataFrames."""

    run_id: int
    status: str
    db: str
    metrics: Any      # pandas.DataFrame: one row per (task, model, defense, seed, game, attack, metric)
    utility: Any      # pandas.DataFrame: one row per (task, model, defense, seed, role, dataset, metric)
    guarantees: Any   # pandas.DataFrame: one row per (task, model, defense, seed, guarantee)
    seconds: float


def evaluate(suite: Any, db: str | None = None, *, cache: str | Path | None = None, quiet: bool = True,
             executor: str = "local", secret_draw: bool = False) -> Results:
    """Run a suite (a bundled name such as ``"smoke"``, a YAML path, a suite mapping or a parsed ``Suite``) and
    return its results, as ``privbench run`` would store them.

    ``db=None`` keeps the results in a temporary SQLite file (the rows are in the returned frames); give a path or
    a SQLAlchemy URL to keep them. ``cache`` is the artifact cache (default ``$PRIVBENCH_CACHE`` or
    ``~/.cache/privbench``), so a second call reuses every model and signal."""
    import secrets as _secrets
    import tempfile

    import pandas as pd

    from bench.cache import ArtifactCache
    from bench.executors import make_executor
    from bench.runner import Runner
    from bench.store import Store
    from bench.suite import Suite, load_suite, parse_suite

    if isinstance(suite, Suite):
        s = suite
    elif isinstance(suite, dict):
        s = parse_suite(suite)
    else:
        s = load_suite(str(suite))
    url = db if db is not None else f"sqlite:///{tempfile.mkdtemp(prefix='privbench-')}/results.db"
    store = Store(url, create=True)
    try:
        result = Runner(s, store, ArtifactCache(cache), quiet=quiet, executor=make_executor(executor),
                        draw_secret=_secrets.token_hex(16) if secret_draw else None,
                        command=f"privbench.evaluate({s.name!r})").run()
        return Results(result.run_id, result.status, store.display_url,
                       pd.DataFrame(store.metric_rows(result.run_id)), pd.DataFrame(store.utility_rows(result.run_id)),
                       pd.DataFrame(store.guarantee_rows(result.run_id)), result.seconds)
    finally:
        store.close()
