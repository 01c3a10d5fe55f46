"""Content hashing: every cache key is a hash of content, never of a name alone."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from bench import __version__

#: Bump when a change to privbench alters what a cached artifact contains.
CACHE_SCHEMA = "1"


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no whitespace, so equal configs hash equally."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_default)


def _default(obj: Any) -> Any:
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    raise TypeError(f"cannot hash object of type {type(obj).__name__}")


def content_hash(*parts: Any, length: int = 16) -> str:
    """SHA-256 of the canonical JSON of ``parts``, truncated to ``length`` hex chars."""
    h = hashlib.sha256()
    for part in parts:
        h.update(canonical_json(part).encode())
        h.update(b"\x1e")
    return h.hexdigest()[:length]


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


def code_version() -> str:
    """privbench version plus a hash of its own source, so edited code never reuses stale results."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for pkg in ("bench", "tasks", "attacks", "defenses"):
        for path in sorted((root / pkg).rglob("*.py")):
            h.update(path.relative_to(root).as_posix().encode())
            h.update(path.read_bytes())
    return f"{__version__}+{h.hexdigest()[:10]}"


def module_hash(*modules: str) -> str:
    """Hash of the source files of the given modules (or of a plugin class's module).

    Artifacts are keyed on the code that produced them, so an edited training loop
    or defense never reuses a stale model, while unrelated edits keep the cache.
    """
    import importlib
    import inspect
    h = hashlib.sha256()
    for name in sorted(modules):
        mod = importlib.import_module(name)
        try:
            h.update(Path(inspect.getfile(mod)).read_bytes())
        except (TypeError, OSError):  # built-in or frozen: its name stands for its version
            h.update(name.encode())
    return h.hexdigest()[:12]
