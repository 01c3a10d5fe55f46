"""glibc's allocator tuned for tensor workloads. This module imports no torch, so the command line tunes the
allocator first thing without paying for torch's import (``privbench show`` and ``--help`` never load torch)."""

from __future__ import annotations

_ALLOCATOR_TUNED = False


def tune_allocator() -> bool:
    """Keep freed tensor memory in glibc's heap instead of returning it to the OS after each batch.

    Large activations (batch × length × vocab log-probs) are otherwise mmap'd and
    unmapped every step; the page faults cost about a third of CPU training and
    scoring time on small models (measured in docs/benchmarks.md). No-op off glibc.
    """
    global _ALLOCATOR_TUNED
    if _ALLOCATOR_TUNED:
        return True
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_max = -1, -4
        ok = libc.mallopt(m_mmap_max, 0) == 1 and libc.mallopt(m_trim_threshold, 1 << 30) == 1
    except (OSError, AttributeError):
        return False
    _ALLOCATOR_TUNED = ok
    return ok
