"""The artifact cache holds data, never code: a pickle planted in a signal shard is refused, not executed; and
sandboxed plugin code sees the shared cache read-only, through an overlay that nothing leaves."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from bench.lm import SignalCache
from bench.signals import TokenSignals, load_signals, save_signals

ROOT = Path(__file__).resolve().parents[1]


class _Planted:
    """Unpickling this object creates a marker file: proof that a pickle ran."""

    marker: Path

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _signals(n: int) -> TokenSignals:
    return TokenSignals(np.arange(n, dtype=np.int32), -np.ones(n, np.float32), np.zeros(n, np.float32),
                        np.ones(n, np.float32), np.zeros(n, np.int8))


def test_shards_round_trip_without_pickle(tmp_path):
    path = tmp_path / "s.npz"
    save_signals(path, ["a" * 16, "b" * 16], [_signals(3), _signals(5)])
    with np.load(path, allow_pickle=False) as data:   # every array is plain data
        assert data["keys"].dtype.kind == "U"
    got = load_signals(path)
    assert set(got) == {"a" * 16, "b" * 16} and got["b" * 16].n_tokens == 5


def test_a_planted_pickle_shard_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    _Planted.marker = marker
    fp = "f" * 16
    shard_dir = tmp_path / "signals" / fp
    shard_dir.mkdir(parents=True)
    evil = shard_dir / "evil.npz"
    n = 2
    np.savez(evil, keys=np.array([_Planted(), "k" * 16], dtype=object), offsets=np.array([0, 1, 2]),
             token_ids=np.zeros(n, np.int32), logprobs=np.zeros(n, np.float32), mu=np.zeros(n, np.float32),
             sigma2=np.zeros(n, np.float32), top1=np.zeros(n, np.int8))
    assert not marker.exists()
    cache = SignalCache(tmp_path / "signals")
    assert cache.lookup(fp, ["k" * 16]) == {}        # nothing trusted from the shard
    assert not marker.exists()                        # the pickle never ran
    assert not evil.exists()                          # the refused shard is gone; its texts are recomputed


def test_no_module_loads_pickles():
    needle = "allow_pickle=" + "True"   # spelled apart so this file does not match itself
    out = subprocess.run(["git", "grep", "-n", needle, "--", "*.py"], cwd=ROOT, capture_output=True,
                         text=True)
    assert out.stdout.strip() == "", out.stdout


# ------------------------------------------------------------------ the overlay a sandboxed child writes

def tree_digest(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (links not followed): a file's SHA-256, a link's target, or "dir"."""
    import hashlib
    import os
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _build(files: dict[str, str]):
    def build(tmp: Path) -> None:
        for rel, text in files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_text(text)
    return build


def _shared(tmp_path: Path):
    from bench.cache import ArtifactCache
    shared = ArtifactCache(tmp_path / "shared")
    shared.get_or_build("data", "d1", _build({"corpus.json": "[1, 2]"}))
    shared.get_or_build("tokenizer", "t1", _build({"tokenizer.json": "{}"}))
    SignalCache(shared.root / "signals").add("f" * 16, {"a" * 16: _signals(3)})
    return shared


def test_overlay_reads_the_shared_cache_and_writes_only_the_overlay(tmp_path):
    from bench.cache import ArtifactCache, OverlayCache
    shared = _shared(tmp_path)
    before = tree_digest(shared.root)
    ov = OverlayCache(shared.root, tmp_path / "box" / "cache-overlay")
    # a shared artifact is found where it is, and not built again
    assert ov.is_valid("data", "d1") and ov.path("data", "d1") == shared.path("data", "d1")
    assert ov.get_or_build("data", "d1", lambda tmp: pytest.fail("rebuilt a shared artifact")) == shared.path("data",
                                                                                                              "d1")
    # a new one is built in the overlay, found there, and locked there
    built = ov.get_or_build("reference", "r1", _build({"config.json": "{}"}))
    assert built == ov.root / "reference" / "r1" and ov.is_valid("reference", "r1")
    assert ov.path("reference", "r1") == built and not shared.is_valid("reference", "r1")
    assert ov.path("adapted", "missing") == ov.root / "adapted" / "missing"
    # where both hold a key, the overlay's copy comes first
    ArtifactCache(ov.root).get_or_build("tokenizer", "t1", _build({"tokenizer.json": "{\"own\": 1}"}))
    assert ov.path("tokenizer", "t1") == ov.root / "tokenizer" / "t1" == ov.find("tokenizer", "t1")
    assert tree_digest(shared.root) == before


def test_a_corrupt_shared_artifact_is_rebuilt_in_the_overlay_not_repaired(tmp_path):
    from bench.cache import OverlayCache
    shared = _shared(tmp_path)
    (shared.path("tokenizer", "t1") / "tokenizer.json").write_text("{\"corrupt\": 1}")  # same size would not do
    before = tree_digest(shared.root)
    ov = OverlayCache(shared.root, tmp_path / "overlay")
    assert not ov.is_valid("tokenizer", "t1")
    path = ov.get_or_build("tokenizer", "t1", _build({"tokenizer.json": "{}"}))
    assert path == ov.root / "tokenizer" / "t1" and ov.is_valid("tokenizer", "t1")
    assert tree_digest(shared.root) == before   # the shared copy is neither deleted nor repaired


def test_overlay_signal_cache_reads_both_and_writes_the_overlay(tmp_path):
    from bench.cache import OverlayCache
    shared = _shared(tmp_path)
    fp = "f" * 16
    bad = shared.root / "signals" / fp / "broken.npz"
    bad.write_bytes(b"not a shard")
    before = tree_digest(shared.root)
    ov = OverlayCache(shared.root, tmp_path / "overlay")
    sig = SignalCache.for_cache(ov)
    assert sig.root == ov.root / "signals" and sig.read_only == (shared.root / "signals",)
    assert set(sig.lookup(fp, ["a" * 16, "b" * 16])) == {"a" * 16}   # the shared shard is read
    sig.add(fp, {"b" * 16: _signals(4)})
    assert len(list((ov.root / "signals" / fp).glob("*.npz"))) == 1
    fresh = SignalCache.for_cache(OverlayCache(shared.root, tmp_path / "overlay"))
    assert set(fresh.lookup(fp, ["a" * 16, "b" * 16])) == {"a" * 16, "b" * 16}
    assert tree_digest(shared.root) == before    # the broken shared shard is skipped, not deleted
    assert set(SignalCache(shared.root / "signals").lookup(fp, ["b" * 16])) == set()


def test_a_planted_pickle_in_a_read_only_root_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    _Planted.marker = marker
    fp = "e" * 16
    shard_dir = tmp_path / "shared" / "signals" / fp
    shard_dir.mkdir(parents=True)
    np.savez(shard_dir / "evil.npz", keys=np.array([_Planted()], dtype=object), offsets=np.array([0, 1]),
             token_ids=np.zeros(1, np.int32), logprobs=np.zeros(1, np.float32), mu=np.zeros(1, np.float32),
             sigma2=np.zeros(1, np.float32), top1=np.zeros(1, np.int8))
    cache = SignalCache(tmp_path / "overlay" / "signals", [tmp_path / "shared" / "signals"])
    assert cache.lookup(fp, ["k" * 16]) == {} and not marker.exists()
    assert (shard_dir / "evil.npz").exists()   # not this cache's to delete


def test_overlay_mirrors_the_datasets_cache_as_links(tmp_path):
    from bench.cache import OverlayCache
    shared = tmp_path / "shared"
    (shared / "hf_datasets" / "json" / "cfg").mkdir(parents=True)
    (shared / "hf_datasets" / "json" / "cfg" / "train.arrow").write_bytes(b"arrow")
    (shared / "hf_datasets" / "json" / "cfg_builder.lock").write_text("")
    ov = OverlayCache(shared, tmp_path / "overlay")
    mirrored = ov.root / "hf_datasets" / "json" / "cfg" / "train.arrow"
    assert mirrored.is_symlink() and mirrored.read_bytes() == b"arrow"
    assert not (ov.root / "hf_datasets" / "json" / "cfg_builder.lock").exists()  # libraries make their own locks


def test_discarding_an_overlay_follows_no_link(tmp_path):
    import os
    from bench.cache import OverlayCache, discard_overlay, overlay_summary
    shared = _shared(tmp_path)
    before = tree_digest(shared.root)
    ov = OverlayCache(shared.root, tmp_path / "overlay")
    ov.get_or_build("adapted", "a1", _build({"model.bin": "weights"}))
    SignalCache.for_cache(ov).add("f" * 16, {"c" * 16: _signals(2)})
    (ov.root / "data").mkdir()
    os.symlink(shared.root / "data" / "d1", ov.root / "data" / "d1")          # a link to a shared artifact
    os.symlink(shared.root / "tokenizer" / "t1" / "tokenizer.json", ov.root / "stolen.json")
    locked = ov.root / "adapted" / "a1" / "locked"
    locked.mkdir()
    (locked / "f").write_text("x")
    locked.chmod(0)
    assert overlay_summary(ov.root) == {"artifacts": 1, "signal_shards": 1}   # links are not counted
    discard_overlay(ov.root)
    assert not ov.root.exists()
    assert tree_digest(shared.root) == before
