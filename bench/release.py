"""Released models that are not one merged checkpoint.

Most defenses release θ' as a plain Hugging Face checkpoint. Some cannot: an aggregate of several
models (the NAF family of Segal et al. 2025 combines constituent models token by token) or an adapter that
does not merge into the weights (prefix tuning). Such a defense returns a :class:`Release` from
``adapt``; the cache stores it as a directory with ``release.json`` naming its kind, and the runner
loads it through the loader registered for that kind, as a :class:`~bench.lm.LanguageModel`, so every
attack and every utility measure applies to it unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import torch

from bench.errors import PluginError
from bench.lm import LanguageModel

RELEASE_FILE = "release.json"

#: builds an HFLanguageModel with the runner's settings (signal cache, batch size, context) from a module
#: and its tokenizer; ``suffix`` keeps fingerprints of constituents of one release distinct
MakeLM = Callable[..., LanguageModel]
Loader = Callable[..., LanguageModel]
_LOADERS: dict[str, Loader] = {}


class Release:
    """What ``Defense.adapt`` returns when θ' is not a single module to merge and save."""

    kind: ClassVar[str] = ""

    def save(self, directory: Path) -> dict[str, Any]:  # pragma: no cover - interface
        """Write the release's files under ``directory``; return JSON-able metadata for its loader."""
        raise NotImplementedError


def register_release(kind: str) -> Callable[[Loader], Loader]:
    """Register ``loader(directory, meta, *, device, fingerprint, make_lm) -> LanguageModel`` for ``kind``."""
    def deco(fn: Loader) -> Loader:
        if kind in _LOADERS and _LOADERS[kind] is not fn:
            raise PluginError(f"release kind '{kind}' is registered twice: give one of them another name")
        _LOADERS[kind] = fn
        return fn
    return deco


def save_release(release: Release, directory: Path) -> None:
    if not release.kind:
        raise PluginError(f"{type(release).__name__} has no `kind`: set the class attribute and register a loader")
    meta = release.save(Path(directory))
    (Path(directory) / RELEASE_FILE).write_text(json.dumps({"kind": release.kind, "meta": meta}, default=str))


def is_release(directory: Path | str) -> bool:
    return (Path(str(directory)) / RELEASE_FILE).is_file()


def load_release(directory: Path, *, device: torch.device, fingerprint: str, make_lm: MakeLM) -> LanguageModel:
    spec = json.loads((Path(directory) / RELEASE_FILE).read_text())
    kind = spec.get("kind")
    if kind not in _LOADERS:
        raise PluginError(f"released model at {directory} has kind {kind!r} but no loader is registered for it "
                          f"(known: {sorted(_LOADERS) or 'none'}): import the defense module that defines it")
    return _LOADERS[kind](Path(directory), spec.get("meta") or {}, device=device, fingerprint=fingerprint,
                          make_lm=make_lm)
