"""What a researcher hands to `privbench validate` / `submit`: a plugin file or an installed entry-point name.

The parent process only *reads* the plugin (to hash its code); it never imports
it. Importing happens in the sandboxed child through :func:`load_plugin`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

from bench.errors import ConfigError, PluginError
from bench.registry import ENTRY_POINT_GROUPS, REGISTRIES

KIND_OF_GROUP = {group: kind for kind, group in ENTRY_POINT_GROUPS.items()}


@dataclass(frozen=True)
class PluginRef:
    """A plugin file path or an entry point (group, name), with the hash of its code."""

    ref: str
    path: str | None            # absolute path of a plugin file
    group: str | None           # entry-point group of an installed plugin
    entry_point: str | None     # entry-point name
    code_hash: str
    dist_version: str | None = None

    @property
    def label(self) -> str:
        return self.entry_point or Path(self.path or self.ref).stem

    def to_dict(self) -> dict:
        return {"ref": self.ref, "path": self.path, "group": self.group, "entry_point": self.entry_point,
                "code_hash": self.code_hash, "dist_version": self.dist_version}


def resolve_plugin(ref: str) -> PluginRef:
    """A ``.py`` file, or the name of an entry point in ``privbench.attacks|defenses|tasks``."""
    if not ref.strip():
        raise ConfigError("the plugin is empty text: give the plugin's .py file, or an installed entry-point name")
    p = Path(ref).expanduser()
    if ref.endswith(".py") or p.exists() or "/" in ref:
        if p.is_dir():
            raise ConfigError(f"plugin path '{ref}' is a directory: give the plugin's .py file, or install the "
                              f"package and give its entry-point name")
        if not p.is_file():
            raise ConfigError(f"plugin file '{ref}' not found: check the path, or give an installed entry-point name")
        if p.suffix != ".py":
            raise ConfigError(f"plugin file '{ref}' is not a .py file: give a Python module")
        data = p.read_bytes()
        return PluginRef(ref, str(p.resolve()), None, None, hashlib.sha256(data).hexdigest()[:16])
    found = [(g, ep) for g in ENTRY_POINT_GROUPS.values() for ep in entry_points(group=g) if ep.name == ref]
    if not found:
        raise ConfigError(f"'{ref}' is neither a plugin file nor an installed entry point in "
                          f"{', '.join(ENTRY_POINT_GROUPS.values())}: give a path to a .py file, or `pip install` "
                          f"the plugin's package")
    if len(found) > 1:
        raise ConfigError(f"entry point '{ref}' exists in several groups ({', '.join(g for g, _ in found)}): "
                          f"rename one of them")
    group, ep = found[0]
    if group == ENTRY_POINT_GROUPS["task"]:
        raise ConfigError(f"entry point '{ref}' is a task ({group}): validate and submit score an attack or a "
                          f"defense; name a task in a suite's tasks instead (`privbench data list` shows tasks)")
    dist = getattr(ep, "dist", None)
    h = hashlib.sha256(f"{group}:{ep.name}={ep.value}".encode())
    version = None
    if dist is not None:
        version = dist.version
        for f in sorted(dist.files or [], key=str):  # the installed code itself, read not imported
            if str(f).endswith(".py"):
                try:
                    h.update(str(f).encode())
                    h.update(Path(dist.locate_file(f)).read_bytes())
                except OSError:
                    continue
    return PluginRef(ref, None, group, ep.name, h.hexdigest()[:16], version)


def load_plugin(ref: PluginRef) -> tuple[str, str, type]:
    """Import the plugin (in the child) and return (kind, registered name, class).

    A plugin file registers itself with ``@register_defense`` / ``@register_attack``; exactly one new
    attack or defense must appear. An entry point is loaded by the registry like any installed plugin.
    """
    for reg in REGISTRIES.values():
        reg.names()  # built-ins and installed entry points first, so only the plugin's own names are new
    if ref.entry_point:
        kind = KIND_OF_GROUP[ref.group]
        reg = REGISTRIES[kind + "s"]
        errors = [e for e in reg.load_errors if e.startswith(f"entry point '{ref.entry_point}' ")]
        if errors:
            raise PluginError(f"the plugin failed to import: {errors[0]}: fix the error and reinstall it")
        ep = next(ep for ep in entry_points(group=ref.group) if ep.name == ref.entry_point)
        obj = ep.load()
        name = getattr(obj, "name", "") or ep.name
        return kind, name, reg.get(name)
    before = {k: set(r.names()) for k, r in REGISTRIES.items()}
    module_name = f"privbench_submitted_{ref.code_hash}"
    spec = importlib.util.spec_from_file_location(module_name, ref.path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise PluginError(f"the plugin file failed to import: {type(exc).__name__}: {exc}: fix it and run "
                          f"`privbench validate` again") from exc
    new = [(k, n) for k, r in REGISTRIES.items() for n in set(r.names()) - before[k]]
    new = [(k, n) for k, n in new if k in ("attacks", "defenses")]
    if not new:
        raise PluginError(f"'{ref.ref}' registers no attack or defense: decorate its class with "
                          f"@register_defense(\"name\") or @register_attack(\"name\") from bench.registry")
    if len(new) > 1:
        raise PluginError(f"'{ref.ref}' registers {len(new)} plugins ({', '.join(n for _, n in new)}): submit one "
                          f"plugin per file")
    kind, name = new[0]
    return kind[:-1], name, REGISTRIES[kind].get(name)
