"""Artifact cache: content-addressed directories written atomically.

An artifact is a directory under ``<root>/<kind>/<key>``. It is built in a
temporary sibling and renamed into place, with a manifest holding checksums of
its files, so a killed run never leaves a half-written artifact that a later
run would trust.

Concurrent builders (several runs, or Ray workers sharing the directory) are
safe: a builder holds an exclusive ``flock`` on ``<kind>/.<key>.lock`` while it
builds, so a second one waits and then finds the finished artifact instead of
building it again; a valid artifact is never replaced. A lock dies with its
process, so a killed builder never blocks the next run; its temporary directory
(``.<key>.*``) is never trusted and is swept by the next build of that key.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
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

    @contextmanager
    def _lock(self, kind: str, key: str):
        """Exclusive per-artifact lock (POSIX ``flock``; no-op where it is missing)."""
        lock_path = self.root / kind / f".{key}.lock"
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            import fcntl
        except ImportError:  # pragma: no cover - non-POSIX
            yield
            return
        with lock_path.open("a") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    def get_or_build(self, kind: str, key: str, build: Callable[[Path], None], *, verify: bool = True) -> Path:
        """Return the artifact dir, building it with ``build(tmp_dir)`` if missing or corrupt."""
        target = self.path(kind, key)
        if self.is_valid(kind, key, verify=verify):
            return target
        with self._lock(kind, key):
            if self.is_valid(kind, key, verify=verify):  # another process built it while we waited
                return target
            target.parent.mkdir(parents=True, exist_ok=True)
            for stale in target.parent.glob(f".{key}.*"):  # a killed builder's leftovers (we hold the lock)
                if stale.is_dir():
                    shutil.rmtree(stale, ignore_errors=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=target.parent))
            try:
                build(tmp)
                files = {
                    p.relative_to(tmp).as_posix(): {"size": p.stat().st_size, "sha256": _file_sha(p)}
                    for p in sorted(tmp.rglob("*"))
                    if p.is_file()
                }
                # the manifest is written last and atomically: a directory without one is never trusted
                manifest_tmp = tmp / f".{MANIFEST}.tmp"
                manifest_tmp.write_text(json.dumps({"kind": kind, "key": key, "files": files}, indent=1))
                os.replace(manifest_tmp, tmp / MANIFEST)
                if target.exists():  # corrupt or partial leftover (never a valid one: checked under the lock)
                    shutil.rmtree(target, ignore_errors=True)
                try:
                    os.replace(tmp, target)
                except OSError:
                    # a builder without the lock (another cache version) finished first: keep theirs if valid
                    shutil.rmtree(tmp, ignore_errors=True)
                    if not self.is_valid(kind, key, verify=verify):
                        raise
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        return target

    def verify_all(self) -> dict[str, list[str]]:
        """Check every artifact against its manifest: {"valid": [...], "invalid": [...]} as ``kind/key``.
        Temporary and lock files (names starting with a dot) are not artifacts and are skipped."""
        out: dict[str, list[str]] = {"valid": [], "invalid": []}
        for kind_dir in sorted(p for p in self.root.iterdir() if p.is_dir() and p.name != "signals"):
            for art in sorted(p for p in kind_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
                ok = self.is_valid(kind_dir.name, art.name)
                out["valid" if ok else "invalid"].append(f"{kind_dir.name}/{art.name}")
        return out
