"""The artifact cache holds data, never code: a pickle planted in a signal shard is refused, not executed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

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
