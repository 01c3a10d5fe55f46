"""Shared bookkeeping of tasks derived from a base task (canaries, Names2IDs, users, secrets)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from bench.hashing import canonical_json
from bench.task import TargetRecord


def derived_fingerprint(header: dict[str, Any], targets: Sequence[TargetRecord], adapt: Sequence[str],
                        population: Sequence[str]) -> str:
    """sha256 over ``header`` (name, config, base fingerprint, public format, …) and the texts the task adds:
    content-based, so a code change that alters the data changes the fingerprint."""
    h = hashlib.sha256(canonical_json(header).encode())
    for part, texts in (("targets", [f"{t.id}\x1f{t.text}" for t in targets]), ("adapt", adapt),
                        ("population", population)):
        h.update(b"\x1e" + part.encode())
        for t in texts:
            h.update(b"\x1f" + t.encode("utf-8"))
    return h.hexdigest()


def partition_stats(**parts: Sequence[str]) -> dict[str, Any]:
    """Records and characters per partition, for `privbench data show`."""
    return {name: {"n_records": len(texts), "n_chars": sum(len(t) for t in texts)} for name, texts in parts.items()}
