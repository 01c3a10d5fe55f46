"""Artifact cache: content-addressed directories written atomically.

An artifact is a directory under ``<root>/<kind>/<key>``. It is built in a
temporary sibling and renamed into place, with a manifest holding checksums of
its files, so a killed run never leaves a half-written artifact that a later
run would trust.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

MANIFEST = "manifest.json"


def default_cache_dir() -> Path:
    return Path(os.environ.get("PRIVBENCH_CACHE", Path.home() / ".cache" / "privbench"))


def _file_sha(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class ArtifactCache:
    """Content-addressed store of artifact directories."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root is not None else default_cache_dir()
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, kind: str, key: str) -> Path:
        return self.root / kind / key

    def is_valid(self, kind: str, key: str, *, verify: bool = True) -> bool:
        """True when the artifact exists and its files match the manifest's checksums."""
        target = self.path(kind, key)
        manifest = target / MANIFEST
        if not manifest.is_file():
            return False
        try:
            entries = json.loads(manifest.read_text())["files"]
        except (json.JSONDecodeError, KeyError, OSError):
            return False
        for rel, meta in entries.items():
            f = target / rel
            if not f.is_file() or f.stat().st_size != meta["size"]:
                return False
            if verify and _file_sha(f) != meta["sha256"]:
                return False
        return True

    def get_or_build(self, kind: str, key: str, build: Callable[[Path], None], *, verify: bool = True) -> Path:
        """Return the artifact dir, building it with ``build(tmp_dir)`` if missing or corrupt."""
        target = self.path(kind, key)
        if self.is_valid(kind, key, verify=verify):
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=target.parent))
        try:
            build(tmp)
            files = {
                p.relative_to(tmp).as_posix(): {"size": p.stat().st_size, "sha256": _file_sha(p)}
                for p in sorted(tmp.rglob("*"))
                if p.is_file()
            }
            (tmp / MANIFEST).write_text(json.dumps({"kind": kind, "key": key, "files": files}, indent=1))
            if target.exists():  # corrupt or partial leftover: replace it
                shutil.rmtree(target, ignore_errors=True)
            try:
                os.replace(tmp, target)
            except OSError:
                # another process finished the same artifact first: keep theirs if it is valid
                shutil.rmtree(tmp, ignore_errors=True)
                if not self.is_valid(kind, key, verify=verify):
                    raise
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return target
