"""Artifact store: the artifact cache's content shared through an fsspec URL, for nodes that share no disk.

A Ray cluster's nodes each keep a private cache directory (bench/cache.py). What one node builds, another finds
here, under the same content-hash keys and with the same manifests:

* an artifact (tokenizer, θ, the attacker's reference, shadows, θ', task data) is one tar archive
  ``<url>/<kind>/<key>.tar`` holding the artifact directory with its manifest. It is uploaded under a unique
  temporary name and then moved into place, so a reader sees a whole archive or none (one object on an
  S3-compatible store; a rename on a local or mounted directory). A downloaded archive is extracted into the
  cache's private temporary directory and trusted only when every file matches the manifest it carries.
* a signal or generation shard is one object ``<url>/signals/<fingerprint>/<name>``, uploaded the same way; a
  shard that fails to load is recomputed, as a local one is (bench/lm.py).

Any filesystem fsspec knows works: ``file:///mnt/bucket`` (a directory standing in for a bucket, or a mounted
share), ``s3://bucket/prefix`` (with ``s3fs``; MinIO and other S3-compatible servers through its
``endpoint_url``), ``gs://``, ``az://``. Keys are content hashes, so an object is never overwritten with other
content: a second upload of a key is skipped.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import tempfile
import uuid
from pathlib import Path

from bench.cache import MANIFEST, artifact_is_valid
from bench.errors import ConfigError

__all__ = ["ArtifactStore", "open_store"]


class ArtifactStore:
    """Content-addressed artifact archives and signal shards under one fsspec URL."""

    def __init__(self, url: str, *, check: bool = True) -> None:
        try:
            import fsspec
        except ImportError:  # pragma: no cover - fsspec comes with datasets
            raise ConfigError("an artifact store needs fsspec: pip install fsspec") from None
        self.url = url.rstrip("/")
        try:
            self.fs, self.base = fsspec.core.url_to_fs(self.url)
        except (ImportError, ValueError) as exc:
            raise ConfigError(f"artifact store '{url}' cannot be opened ({exc}): install the filesystem's fsspec "
                              f"package (s3fs for s3://, gcsfs for gs://) or give a file:// URL") from None
        self.base = self.base.rstrip("/")
        if check:
            self.check_writable()

    def __repr__(self) -> str:
        return f"ArtifactStore({self.url!r})"

    def __getstate__(self) -> dict:  # Ray ships the store to workers as its URL; each opens its own connection
        return {"url": self.url}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["url"], check=False)

    # -- paths ---------------------------------------------------------------------------------------------------
    def _artifact(self, kind: str, key: str) -> str:
        return f"{self.base}/{kind}/{key}.tar"

    def _shard_dir(self, fp: str) -> str:
        return f"{self.base}/signals/{fp}"

    def _put(self, local: Path, final: str) -> None:
        """Upload ``local`` to ``final`` through a unique temporary name, so no reader sees a partial object."""
        parent = final.rsplit("/", 1)[0]
        self.fs.makedirs(parent, exist_ok=True)
        tmp = f"{parent}/.{final.rsplit('/', 1)[1]}.{uuid.uuid4().hex}.tmp"
        try:
            self.fs.put_file(str(local), tmp)
            self.fs.mv(tmp, final)
        except BaseException:
            try:
                self.fs.rm(tmp)
            except Exception:
                pass
            raise

    def check_writable(self) -> None:
        """Write and delete a probe object; a store that refuses gets a one-line error with the fix."""
        probe = f"{self.base}/.privbench-probe-{uuid.uuid4().hex}"
        try:
            self.fs.makedirs(self.base, exist_ok=True)
            with self.fs.open(probe, "wb") as fh:
                fh.write(b"privbench")
            self.fs.rm(probe)
        except Exception as exc:
            raise ConfigError(f"artifact store '{self.url}' refuses writes ({type(exc).__name__}: {exc}): give a "
                              f"URL this machine and every Ray node can write (check its permissions or "
                              f"credentials), or drop --artifact-store") from None

    # -- artifacts -----------------------------------------------------------------------------------------------
    def has(self, kind: str, key: str) -> bool:
        return self.fs.exists(self._artifact(kind, key))

    def upload(self, kind: str, key: str, directory: Path) -> bool:
        """Archive the valid artifact ``directory`` as ``kind/key``; False when the store already had it."""
        final = self._artifact(kind, key)
        if self.fs.exists(final):
            return False
        with tempfile.TemporaryDirectory(prefix="privbench-upload-") as tmp:
            archive = Path(tmp) / f"{key}.tar"
            with tarfile.open(archive, "w") as tar:
                for path in sorted(p for p in directory.rglob("*") if p.is_file()):
                    tar.add(path, arcname=path.relative_to(directory).as_posix(), recursive=False)
            self._put(archive, final)
        return True

    def download(self, kind: str, key: str, dest: Path) -> bool:
        """Extract ``kind/key`` into the empty directory ``dest``; True only when every file matches its manifest.

        A missing, truncated or tampered archive leaves ``dest`` empty and returns False: the caller builds the
        artifact itself. Only regular files the archive's manifest lists are extracted (tarfile's ``data``
        filter: no links, no absolute paths, nothing outside ``dest``)."""
        try:
            data = self.fs.cat_file(self._artifact(kind, key))
        except FileNotFoundError:
            return False
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
                manifest = json.loads(tar.extractfile(MANIFEST).read())
                listed = set(manifest["files"]) | {MANIFEST}
                if manifest.get("kind") != kind or manifest.get("key") != key:
                    raise ValueError("manifest names another artifact")
                members = [m for m in tar.getmembers() if m.isfile() and m.name in listed]
                tar.extractall(dest, members=members, filter="data")
            if artifact_is_valid(dest):
                return True
        except Exception:
            pass
        for path in sorted(dest.rglob("*"), reverse=True):  # never leave a partial artifact behind
            path.unlink() if path.is_file() or path.is_symlink() else path.rmdir()
        return False

    # -- signal and generation shards ----------------------------------------------------------------------------
    def shard_names(self, fp: str) -> list[str]:
        """Names of the shards the store holds for model fingerprint ``fp`` (temporary uploads left out)."""
        try:
            paths = self.fs.ls(self._shard_dir(fp), detail=False)
        except FileNotFoundError:
            return []
        names = [str(p).rstrip("/").rsplit("/", 1)[-1] for p in paths]
        return sorted(n for n in names if not n.startswith("."))

    def upload_shard(self, fp: str, path: Path) -> None:
        final = f"{self._shard_dir(fp)}/{path.name}"
        if not self.fs.exists(final):
            self._put(path, final)

    def download_shard(self, fp: str, name: str, directory: Path) -> Path | None:
        """Copy shard ``name`` into ``directory`` (write-then-rename); its path, or None when it vanished."""
        if "/" in name or name.startswith("."):
            return None
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
        os.close(fd)
        try:
            self.fs.get_file(f"{self._shard_dir(fp)}/{name}", tmp)
            os.replace(tmp, directory / name)
        except FileNotFoundError:
            Path(tmp).unlink(missing_ok=True)
            return None
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return directory / name


def open_store(url: str | None) -> ArtifactStore | None:
    """The store at ``url`` (checked writable), or None for no URL; empty text is refused, as ``--cache ''`` is,
    rather than read as "no store" (a run would then build everything on this node alone)."""
    if url is not None and not url.strip():
        from bench.errors import ConfigError
        raise ConfigError("--artifact-store is empty text: give an fsspec URL (file:///dir, s3://bucket/prefix), or "
                          "leave the option out for no shared store")
    return ArtifactStore(url) if url else None
