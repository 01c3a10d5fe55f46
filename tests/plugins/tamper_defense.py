"""Dishonest fixture: tries to poison the artifact cache that later trusted runs read, then adapts honestly.

While adapting it first, with ``PRIVBENCH_TEST_CTYPES=1``, writes into the shared cache (``PRIVBENCH_TEST_SHARED``)
through libc, past the audit hook; then (1) plants a new artifact of a kind trusted code builds (``reference``) in
the submission's cache overlay, with a manifest that matches its files; (2) rewrites a file of the θ that trusted
code built in this run and updates its manifest, so the artifact still verifies; (3) plants an artifact whose file
does not match its manifest; (4) plants a well-formed signal shard. What it did goes to ``tamper-report.json`` in
its working directory. A defense runs in a worker of its own (bench/plugin_worker.py), which may write only in
its own directory, so (1) ends the run as a sandbox violation.
"""

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from bench.defense import Defense
from bench.registry import register_defense

PLANTED_KEY = "0123456789abcdef0123"


def _manifest(art: Path, kind: str, key: str) -> None:
    files = {p.relative_to(art).as_posix(): {"size": p.stat().st_size,
                                             "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
             for p in sorted(art.rglob("*")) if p.is_file() and p.name != "manifest.json"}
    (art / "manifest.json").write_text(json.dumps({"kind": kind, "key": key, "files": files}))


def _ctypes_write(path: str) -> str:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.open(path.encode(), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    if fd < 0:
        return os.strerror(ctypes.get_errno())
    libc.write(fd, b"planted", 7)
    libc.close(fd)
    return "written"


@register_defense("cache_tamperer")
class CacheTamperer(Defense):
    """Plants and alters artifacts and signal shards in the cache it writes, then returns the model unchanged."""

    description = "Tries to poison the artifact cache (test fixture)."

    def adapt(self, model, data, ctx):
        # where the submission's cache writes go: its worker runs in <sandbox>/workers/<w>, the overlay is
        # <sandbox>/cache-overlay (the worker's environment no longer names it)
        overlay = Path(os.environ.get("PRIVBENCH_CACHE") or Path.cwd().parent.parent / "cache-overlay")
        report = {"cache": str(overlay)}
        # (5) first: straight into the shared cache, past the audit hook
        if os.environ.get("PRIVBENCH_TEST_CTYPES") == "1":
            report["ctypes"] = _ctypes_write(os.path.join(os.environ["PRIVBENCH_TEST_SHARED"], "planted.txt"))
        # (1) a self-consistent artifact of a trusted kind, under a key of its choosing
        art = overlay / "reference" / PLANTED_KEY
        art.mkdir(parents=True)
        (art / "config.json").write_text('{"planted": true}')
        _manifest(art, "reference", PLANTED_KEY)
        report["planted"] = "reference/" + PLANTED_KEY
        # (2) θ, built by trusted code in this run, altered and re-manifested: it still verifies
        for theta in sorted(d for d in (overlay / "pretrained").iterdir() if d.is_dir() and d.name[0] != "."):
            (theta / "privbench.json").write_text('{"altered": true}')
            _manifest(theta, "pretrained", theta.name)
            report["altered"] = "pretrained/" + theta.name
        # (3) an artifact whose file does not match its manifest
        bad = overlay / "tokenizer" / PLANTED_KEY
        bad.mkdir(parents=True)
        (bad / "tokenizer.json").write_text("{}")
        _manifest(bad, "tokenizer", PLANTED_KEY)
        (bad / "tokenizer.json").write_text('{"changed": "after the manifest"}')
        report["inconsistent"] = "tokenizer/" + PLANTED_KEY
        # (4) a well-formed signal shard
        from bench.signals import TokenSignals, save_signals
        shard = overlay / "signals" / ("f" * 16) / "planted.npz"
        shard.parent.mkdir(parents=True, exist_ok=True)
        save_signals(shard, ["k" * 16], [TokenSignals(np.arange(3, dtype=np.int32), np.zeros(3, np.float32),
                                                      np.zeros(3, np.float32), np.ones(3, np.float32),
                                                      np.zeros(3, np.int8))])
        report["shard"] = str(shard.relative_to(overlay))
        Path("tamper-report.json").write_text(json.dumps(report))
        return model
