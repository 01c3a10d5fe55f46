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

Sandboxed plugin code (`privbench submit`, `privbench validate`) gets an
:class:`OverlayCache` instead: the shared cache read-only, everything new in a
private overlay that is discarded when the child ends.
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

from bench.errors import ConfigError

MANIFEST = "manifest.json"


def default_cache_dir() -> Path:
    return Path(os.environ.get("PRIVBENCH_CACHE") or Path.home() / ".cache" / "privbench")


def check_cache_root(root: str | Path | None) -> Path:
    """The cache directory ``root`` names (default :func:`default_cache_dir`), refused, before anything is created,
    when it is empty text, an existing file, or cannot be created or written where it would be."""
    if root is not None and not str(root).strip():
        raise ConfigError("the artifact cache directory is empty text: give --cache DIR (or leave it out for "
                          "$PRIVBENCH_CACHE or ~/.cache/privbench)")
    path = Path(root) if root is not None else default_cache_dir()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"the artifact cache {path} is a file, not a directory: give a directory (--cache DIR)")
    if path.exists():
        return path  # an existing cache may be read-only on purpose (a sandbox's shared cache); writes say so
    # a cache still to be made needs a writable nearest existing directory: refused here, a run stops before it
    # creates its database rather than after
    existing = path.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"cannot use {path} as the artifact cache: {existing} is a file, not a directory; give a "
                          f"directory you can write (--cache DIR or $PRIVBENCH_CACHE)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot use {path} as the artifact cache: {existing} is not writable; give a directory "
                          f"you can write (--cache DIR or $PRIVBENCH_CACHE)")
    return path


def _file_sha(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def artifact_is_valid(target: Path, *, verify: bool = True) -> bool:
    """True when the artifact directory ``target`` has a manifest and every file it lists, of the listed size
    and (with ``verify``) SHA-256."""
    manifest = target / MANIFEST
    if not manifest.is_file():
        return False
    try:
        entries = json.loads(manifest.read_text())["files"]
    except (json.JSONDecodeError, KeyError, TypeError, OSError):
        return False
    if not isinstance(entries, dict):
        return False
    for rel, meta in entries.items():
        f = target / rel
        try:
            if not f.is_file() or f.stat().st_size != meta["size"]:
                return False
            if verify and _file_sha(f) != meta["sha256"]:
                return False
        except (OSError, KeyError, TypeError):
            return False
    return True


def manifest_files(target: Path) -> dict[str, str] | None:
    """{file: SHA-256} of an artifact directory as its manifest lists them, or None where it has no readable one."""
    try:
        entries = json.loads((Path(target) / MANIFEST).read_text())["files"]
        return {str(rel): str(meta["sha256"]) for rel, meta in entries.items()}
    except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
        return None


def same_content(a: str | Path, b: str | Path, *, ignore: tuple[str, ...] = ("privbench.json",)) -> bool:
    """True when artifact directories ``a`` and ``b`` hold the same files with the same checksums (``ignore``d files
    aside: a training report describes how an artifact was made, not what it is). Read from the manifests the
    cache wrote, so it costs two small reads; a directory without a manifest (a hub checkpoint) is never the same.
    A θ′ that is byte for byte θ (the ``none`` anchor) is thereby recognised by content, not by a defense's word."""
    fa, fb = manifest_files(Path(a)), manifest_files(Path(b))
    if fa is None or fb is None:
        return False
    return {k: v for k, v in fa.items() if k not in ignore} == {k: v for k, v in fb.items() if k not in ignore}


class ArtifactCache:
    """Content-addressed store of artifact directories.

    With a ``store`` (:class:`bench.artifact_store.ArtifactStore`), the directory is this node's private copy of
    a store that nodes without a shared disk share: a missing artifact is downloaded from the store before it is
    built, and what this cache builds or already holds is uploaded there (once per key and process).
    """

    def __init__(self, root: str | Path | None = None, *, store=None) -> None:
        self.root = check_cache_root(root)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot use {self.root} as the artifact cache ({exc.strerror or exc}): give a "
                              f"directory you can write (--cache DIR or $PRIVBENCH_CACHE)") from None
        self.store = store
        self._published: set[tuple[str, str]] = set()

    def path(self, kind: str, key: str) -> Path:
        return self.root / kind / key

    def is_valid(self, kind: str, key: str, *, verify: bool = True) -> bool:
        """True when the artifact exists and its files match the manifest's checksums (or, with a store, when the
        store holds it: it is checked when downloaded)."""
        if self.find(kind, key, verify=verify) is not None:
            return True
        return self.store is not None and self.store.has(kind, key)

    def _publish(self, kind: str, key: str, path: Path) -> None:
        """Upload a valid local artifact to the store unless this process already did (or saw it there)."""
        if self.store is not None and (kind, key) not in self._published:
            self.store.upload(kind, key, path)
            self._published.add((kind, key))

    def find(self, kind: str, key: str, *, verify: bool = True) -> Path | None:
        """The directory of a valid ``kind/key`` artifact, or None."""
        target = self.path(kind, key)
        return target if artifact_is_valid(target, verify=verify) else None

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
        """Return the artifact dir, building it with ``build(tmp_dir)`` if missing or corrupt (with a store: taken
        from the store when it holds the artifact, else built and uploaded)."""
        hit = self.find(kind, key, verify=verify)
        if hit is not None:
            self._publish(kind, key, hit)
            return hit
        target = self.root / kind / key  # built here, under this cache's own root, whatever the lookups read
        with self._lock(kind, key):
            hit = self.find(kind, key, verify=verify)
            if hit is not None:  # another process built it while we waited
                self._publish(kind, key, hit)
                return hit
            target.parent.mkdir(parents=True, exist_ok=True)
            for stale in target.parent.glob(f".{key}.*"):  # a killed builder's leftovers (we hold the lock)
                if stale.is_dir():
                    shutil.rmtree(stale, ignore_errors=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=target.parent))
            fetched = False
            try:
                fetched = self.store is not None and self.store.download(kind, key, tmp)
                if fetched:  # checked against the manifest it carries, which stays as it is
                    self._published.add((kind, key))
                else:
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
                    if not artifact_is_valid(target, verify=verify):
                        raise
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        self._publish(kind, key, target)
        return target

    def verify_all(self) -> dict[str, list[str]]:
        """Check every artifact against its manifest: {"valid": [...], "invalid": [...]} as ``kind/key``.
        Temporary and lock files (names starting with a dot) are not artifacts and are skipped."""
        out: dict[str, list[str]] = {"valid": [], "invalid": []}
        for kind_dir in sorted(p for p in self.root.iterdir() if p.is_dir() and p.name != "signals"):
            for art in sorted(p for p in kind_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
                ok = artifact_is_valid(art)  # this directory's copy, whatever a store holds
                out["valid" if ok else "invalid"].append(f"{kind_dir.name}/{art.name}")
        return out

    @property
    def read_only_roots(self) -> tuple[Path, ...]:
        """Cache roots this cache reads but never writes (none: see :class:`OverlayCache`)."""
        return ()


#: the overlay's directory inside a submission's sandbox
OVERLAY_DIR = "cache-overlay"


class OverlayCache(ArtifactCache):
    """The artifact cache as sandboxed plugin code sees it: the shared cache read-only, a private overlay for
    everything new.

    Lookups (:meth:`find`, :meth:`path`, :meth:`is_valid`, :meth:`get_or_build`) try the overlay, then the
    shared cache ``base_root``; every build, lock file and other write (``root`` is the overlay, so signal
    shards, generations and the ``datasets`` cache land there too) goes to ``overlay_root``. Nothing here ever
    writes, repairs or deletes under ``base_root``: a corrupt shared artifact is rebuilt in the overlay.

    `privbench submit` and `privbench validate` give one to their sandboxed child with the overlay inside the
    sandbox, and discard the overlay afterwards: nothing a child built is promoted into the shared cache
    (docs/submitting.md says why).
    """

    #: directories of the shared cache that a library, not this class, reads and writes (``datasets`` needs a
    #: writable cache even to read, for its lock files): mirrored into the overlay as symlinks (see __init__)
    MIRRORED = ("hf_datasets",)

    def __init__(self, base_root: str | Path, overlay_root: str | Path) -> None:
        super().__init__(overlay_root)
        self.base = Path(base_root)  # never created or written here
        for name in self.MIRRORED:
            if (self.base / name).is_dir() and not (self.root / name).exists():
                mirror_tree(self.base / name, self.root / name)

    def find(self, kind: str, key: str, *, verify: bool = True) -> Path | None:
        for root in (self.root, self.base):
            target = root / kind / key
            if artifact_is_valid(target, verify=verify):
                return target
        return None

    def path(self, kind: str, key: str) -> Path:
        """Where ``kind/key`` is: the overlay's copy, else the shared cache's, else where a build would put it."""
        own = self.root / kind / key
        if (own / MANIFEST).is_file():
            return own
        shared = self.base / kind / key
        return shared if (shared / MANIFEST).is_file() else own

    @property
    def read_only_roots(self) -> tuple[Path, ...]:
        return (self.base,)


def mirror_tree(src: Path, dst: Path) -> None:
    """``src``'s directories recreated under ``dst``, each file a symlink to its original (lock files left out:
    a library opens them with O_NOFOLLOW and makes its own). A reader sees ``src``'s files; a writer adds new
    files to ``dst``, and a write through a link reaches the original, which the sandbox keeps read-only."""
    for dirpath, dirnames, filenames in os.walk(src):  # symlinked directories are linked, not descended
        rel = Path(dirpath).relative_to(src)
        (dst / rel).mkdir(parents=True, exist_ok=True)
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            if not name.endswith(".lock"):
                os.symlink(os.path.join(dirpath, name), dst / rel / name)


def _subdirs(path: Path) -> list[os.DirEntry]:
    """Real (not symlinked) subdirectories of ``path``, none if it is not a readable directory."""
    try:
        with os.scandir(path) as it:
            return [e for e in it if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def overlay_summary(overlay_root: str | Path) -> dict[str, int]:
    """What a sandboxed child left in its overlay: {"artifacts": n, "signal_shards": n}, for the log.

    Only counts; nothing in the overlay is opened, trusted or followed (symlinks included)."""
    root = Path(overlay_root)
    n_art = n_sig = 0
    for kind in _subdirs(root):
        if kind.name == "signals":
            for fp in _subdirs(Path(kind.path)):
                try:
                    with os.scandir(fp.path) as it:
                        n_sig += sum(1 for e in it if e.name.endswith(".npz") and not e.name.startswith("."))
                except OSError:
                    pass
        elif kind.name not in ("generations", "hf_datasets") and not kind.name.startswith("."):
            n_art += sum(1 for e in _subdirs(Path(kind.path)) if not e.name.startswith("."))
    return {"artifacts": n_art, "signal_shards": n_sig}


def discard_overlay(overlay_root: str | Path) -> None:
    """Delete a child's overlay, whatever the child did to it: symlinks are removed, never followed, and
    directories it made unwritable are opened (never through a link) so their contents can go."""
    root = Path(overlay_root)
    if root.is_symlink():
        root.unlink()
        return
    shutil.rmtree(root, ignore_errors=True)
    if not root.exists():
        return
    try:
        os.chmod(root, 0o700)
    except OSError:
        pass
    for dirpath, dirnames, _ in os.walk(root):  # os.walk does not descend into symlinked directories
        for d in [dirpath] + [os.path.join(dirpath, n) for n in dirnames]:
            if not os.path.islink(d):
                try:
                    os.chmod(d, 0o700)
                except OSError:
                    pass
    shutil.rmtree(root, ignore_errors=True)
