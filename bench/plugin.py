"""Base class shared by attacks, defenses and tasks: name, version, typed parameters, description."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, ClassVar

from bench.errors import PrivbenchError, PluginError
from bench.hashing import content_hash
from bench.params import Param, validate_params


class Plugin:
    """A registered, parameterised component. Subclasses declare ``params`` and get validation for free."""

    kind: ClassVar[str] = "plugin"
    name: ClassVar[str] = ""
    version: ClassVar[str] = "0.1.0"
    description: ClassVar[str] = ""
    params: ClassVar[tuple[Param, ...]] = ()

    def __init__(self, **params: Any) -> None:
        self.config: dict[str, Any] = validate_params(f"{self.kind} '{self.name}'", self.params, params)
        for key, value in self.config.items():
            setattr(self, key, value)

    @property
    def key(self) -> str:
        """Content key of this configured plugin: name, version and every parameter value."""
        return content_hash({"kind": self.kind, "name": self.name, "version": self.version, "params": self.config})

    @classmethod
    def info(cls) -> dict[str, Any]:
        return {
            "kind": cls.kind, "name": cls.name, "version": cls.version, "description": cls.description,
            "params": [p.to_dict() for p in cls.params],
        }

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config.items())
        return f"{type(self).__name__}({args})"


@contextlib.contextmanager
def plugin_code(plugin: Plugin | type, call: str) -> Iterator[None]:
    """Run a plugin's own code (``call`` names the method): whatever it raises becomes one :class:`PluginError`
    naming the plugin and the call, so a crashing defense, task or attack hook fails its run with a one-line
    message instead of a traceback. privbench's own errors (a refused parameter, a capability) and a CUDA
    out-of-memory error (the callers' batch back-off) pass through unchanged."""
    try:
        yield
    except PrivbenchError:
        raise
    except Exception as exc:
        from bench.device import is_oom  # torch is loaded wherever plugin code runs
        if is_oom(exc):
            raise
        detail = str(exc).splitlines()[0] if str(exc) else ""
        raise PluginError(f"{plugin.kind} '{plugin.name}' raised {type(exc).__name__} in {call}"
                          f"{': ' + detail if detail else ''}: fix the plugin or its parameters "
                          f"(`privbench list {plugin.kind}s` shows them)") from exc
