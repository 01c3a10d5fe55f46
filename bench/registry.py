"""Plugin registries: decorators for built-ins, entry points for plugins installed from elsewhere.

Built-in plugins register with ``@register_attack("loss")`` and friends when
their module is imported. Third-party packages declare entry points in the
groups ``privbench.attacks``, ``privbench.defenses`` and ``privbench.tasks``;
each entry point names a plugin class (or a module that registers some).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar

from bench.errors import RegistryError

T = TypeVar("T")

BUILTIN_MODULES = {
    "attack": ["attacks.loss", "attacks.zlib", "attacks.lowercase", "attacks.min_k", "attacks.min_k_pp",
               "attacks.reference", "attacks.recall", "attacks.rmia", "attacks.self_prompt",
               "attacks.exposure", "attacks.extraction", "attacks.user_inference", "attacks.secret_loss"],
    "defense": ["defenses.finetune", "defenses.lora", "defenses.dp", "defenses.mitigations", "defenses.dedup",
                "defenses.goldfish", "defenses.guard", "defenses.hush", "defenses.naf", "defenses.none"],
    "task": ["tasks.mini_pile", "tasks.pile_subsets", "tasks.canaries", "tasks.names2ids", "tasks.users",
             "tasks.secrets", "tasks.hub", "tasks.user_files", "tasks.audit_canaries"],
}
ENTRY_POINT_GROUPS = {"attack": "privbench.attacks", "defense": "privbench.defenses", "task": "privbench.tasks"}


#: whether registries load installed entry points (a submission's runner loads none: bench/plugin_worker.py)
_ENTRY_POINTS = [True]


def builtins_only() -> None:
    """Load no installed plugin in this process, before any registry is first read: the runner of a submission
    must not import third-party code, the submitted plugin included (it runs in workers of its own)."""
    _ENTRY_POINTS[0] = False


class Registry(Generic[T]):
    """Name → plugin class, for one kind of plugin."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._classes: dict[str, type] = {}
        self._origin: dict[str, str] = {}
        self._loaded = False
        self.load_errors: list[str] = []

    def register(self, name: str, *, origin: str = "builtin") -> Callable[[type], type]:
        def decorator(cls: type) -> type:
            if not name or not isinstance(name, str):
                raise RegistryError(f"{self.kind} plugin {cls!r} has no name: pass one to @register_{self.kind}")
            existing = self._classes.get(name)
            if existing is not None and existing is not cls and _qualname(existing) != _qualname(cls):
                raise RegistryError(
                    f"{self.kind} '{name}' is registered twice ({_qualname(existing)} and {_qualname(cls)}): rename one")
            clash = reserved_param_names(cls) & {p.name for p in getattr(cls, "params", ())}
            if clash:
                raise RegistryError(f"{self.kind} '{name}': parameter(s) {sorted(clash)} would shadow the plugin API "
                                    f"({_qualname(cls)}): rename them (e.g. '{sorted(clash)[0]}_value')")
            cls.name = name
            cls.kind = self.kind
            self._classes[name] = cls
            if origin != "builtin":  # an entry point names its distribution, even if a decorator registered it first
                self._origin[name] = origin
            elif cls.__module__ not in BUILTIN_MODULES.get(self.kind, ()):  # a decorated plugin outside privbench
                self._origin.setdefault(name, f"module {cls.__module__}")
            else:
                self._origin.setdefault(name, origin)
            return cls
        return decorator

    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for module in BUILTIN_MODULES.get(self.kind, []):
            importlib.import_module(module)
        if not _ENTRY_POINTS[0]:
            return
        for ep in entry_points(group=ENTRY_POINT_GROUPS[self.kind]):
            try:
                obj = ep.load()
            except Exception as exc:  # a broken third-party plugin must not break `privbench list`
                self.load_errors.append(f"entry point '{ep.name}' ({ep.value}): {type(exc).__name__}: {exc}")
                continue
            if inspect.isclass(obj):
                dist = getattr(ep, "dist", None)
                origin = f"entry point {dist.name if dist else ep.value}"
                try:
                    self.register(getattr(obj, "name", "") or ep.name, origin=origin)(obj)
                except RegistryError as exc:  # e.g. a third-party plugin named like a built-in: keep ours
                    self.load_errors.append(f"entry point '{ep.name}' ({ep.value}): {exc}")

    def names(self) -> list[str]:
        self._ensure_loaded()
        return sorted(self._classes)

    def get(self, name: str) -> type:
        self._ensure_loaded()
        try:
            return self._classes[name]
        except KeyError:
            failed = [e for e in self.load_errors if e.startswith(f"entry point '{name}' ")]
            if failed:
                raise RegistryError(f"{self.kind} '{name}' is installed but failed to load: {failed[0]}: "
                                    f"fix or reinstall the plugin") from None
            close = difflib.get_close_matches(name, list(self._classes), n=1, cutoff=0.5)
            hint = f"did you mean '{close[0]}'?" if close else f"known: {', '.join(sorted(self._classes))}"
            raise RegistryError(f"unknown {self.kind} '{name}': {hint} (see `privbench list {self.kind}s`)") from None

    def create(self, name: str, params: dict[str, Any] | None = None) -> Any:
        return self.get(name)(**(params or {}))

    def origin(self, name: str) -> str:
        self._ensure_loaded()
        return self._origin.get(name, "builtin")


def reserved_param_names(cls: type) -> set[str]:
    """Names a plugin parameter may not take: every attribute of privbench's contract classes the plugin derives
    from (``name``, ``score``, ``reference``, ``adapt``, ``config``, ...), since parameters become attributes."""
    return {a for b in cls.__mro__ if b.__module__.startswith("bench.") for a in vars(b)
            if not a.startswith("__")} | {"config", "key"}


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


#: subcommands of `privbench` that plugin packages provide, as "module:attribute" of a typer app; the core adds them
#: without importing the package itself (the entry point group ``privbench.cli`` adds more)
CLI_EXTENSIONS = {"data": "tasks.cli:data_app"}


def cli_extensions() -> dict[str, Any]:
    """Name -> typer app of every command-line extension: the built-in ones, then installed entry points."""
    out: dict[str, Any] = {}
    for name, ref in CLI_EXTENSIONS.items():
        module, _, attr = ref.partition(":")
        out[name] = getattr(importlib.import_module(module), attr)
    for ep in entry_points(group="privbench.cli"):
        if ep.name not in out:
            out[ep.name] = ep.load()
    return out


ATTACKS: Registry = Registry("attack")
DEFENSES: Registry = Registry("defense")
TASKS: Registry = Registry("task")
REGISTRIES = {"attacks": ATTACKS, "defenses": DEFENSES, "tasks": TASKS}


def register_attack(name: str) -> Callable[[type], type]:
    return ATTACKS.register(name)


def register_defense(name: str) -> Callable[[type], type]:
    return DEFENSES.register(name)


def register_task(name: str) -> Callable[[type], type]:
    return TASKS.register(name)
