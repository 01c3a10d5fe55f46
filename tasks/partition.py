"""Deterministic, hash-based partitioning and chunking helpers.

Nothing here uses RNG state or depends on iteration order: a key's partition is
a pure function of (key, salt, weights), identical on every machine.
"""

from __future__ import annotations

import hashlib
from typing import Mapping

from bench.errors import ConfigError

__all__ = ["stable_hash", "assign_partition", "chunk_text", "normalized_key", "alnum_fraction"]

_SEP = "\x1f"
_SCALE = float(2**64)


def stable_hash(*parts: str) -> int:
    """First 8 bytes (big-endian) of sha256 over ``"\\x1f".join(parts)``."""
    digest = hashlib.sha256(_SEP.join(parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big")


def _cumulative(weights: Mapping[str, float]) -> list[tuple[str, float]]:
    if not weights:
        raise ConfigError("partition weights are empty: give at least one partition a positive weight")
    names = sorted(weights)
    values = []
    for name in names:
        w = float(weights[name])
        if not w >= 0.0 or w == float("inf"):
            raise ConfigError(f"partition weight {name}={weights[name]!r} is invalid: use a finite number >= 0")
        values.append(w)
    total = sum(values)
    if total <= 0.0:
        raise ConfigError("partition weights sum to 0: give at least one partition a positive weight")
    out, acc = [], 0.0
    for name, w in zip(names, values):
        acc += w / total
        out.append((name, acc))
    return out


def assign_partition(key: str, salt: str, weights: Mapping[str, float]) -> str:
    """Partition of ``key``: u = stable_hash(salt, key) / 2**64 falls into the
    cumulative (normalised) weight range of one partition, names in sorted order."""
    ranges = _cumulative(weights)
    u = stable_hash(salt, key) / _SCALE
    for name, upper in ranges:
        if u < upper:
            return name
    # Floating point rounding left u just above the last bound: last positive one.
    for name in reversed(sorted(weights)):
        if float(weights[name]) > 0.0:
            return name
    raise AssertionError("unreachable")  # pragma: no cover


def alnum_fraction(text: str) -> float:
    if not text:
        return 0.0
    return sum(1 for ch in text if ch.isalnum()) / len(text)


def _split_long_line(line: str, target_chars: int) -> list[str]:
    pieces = []
    while len(line) > target_chars:
        head = line[:target_chars]
        cut = max(head.rfind(" "), head.rfind("\t"))
        piece = head[:cut].rstrip() if cut > 0 else ""
        if piece:
            pieces.append(piece)
            line = line[cut:].lstrip()
        else:  # no usable whitespace: hard cut
            pieces.append(head)
            line = line[target_chars:]
    if line:
        pieces.append(line)
    return pieces


def chunk_text(text: str, target_chars: int, min_chars: int) -> list[str]:
    """Split ``text`` into consecutive records of at most ``target_chars``.

    Cuts only at line boundaries; a single line longer than ``target_chars`` is
    cut at its last whitespace before ``target_chars`` (hard-cut if none).
    Trailing whitespace and leading blank lines are stripped; chunks shorter than
    ``min_chars`` or less than 50% alphanumeric are dropped.
    """
    if target_chars <= 0:
        raise ConfigError(f"target_chars={target_chars} is invalid: use a positive number")
    if min_chars < 0 or min_chars > target_chars:
        raise ConfigError(f"min_chars={min_chars} is invalid: use 0 <= min_chars <= target_chars ({target_chars})")
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    chunks: list[str] = []
    current: list[str] = []
    size = 0

    def flush() -> None:
        chunk = "\n".join(current).rstrip().lstrip("\n")
        if len(chunk) >= min_chars and alnum_fraction(chunk) >= 0.5:
            chunks.append(chunk)

    for raw_line in text.split("\n"):
        line = raw_line.rstrip()
        for piece in _split_long_line(line, target_chars) if line else [""]:
            if not current and not piece:
                continue  # never start a chunk with a blank line
            extra = len(piece) + (1 if current else 0)
            if current and size + extra > target_chars:
                flush()
                current, size = [], 0
                if not piece:
                    continue
                extra = len(piece)
            current.append(piece)
            size += extra
    if current:
        flush()
    return chunks


def normalized_key(text: str) -> str:
    """sha1 hex of the lowercased, whitespace-collapsed text (exact-dup key)."""
    return hashlib.sha1(" ".join(text.lower().split()).encode("utf-8")).hexdigest()
