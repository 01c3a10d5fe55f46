"""Device and precision selection: CUDA when present, else CPU; bf16 where the hardware supports it."""

from __future__ import annotations

import os

import torch


def select_device(preference: str = "auto") -> torch.device:
    if preference == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if preference.startswith("cuda") and not torch.cuda.is_available():
        from bench.errors import ConfigError
        raise ConfigError(f"device '{preference}' requested but CUDA is not available: use device: auto or cpu")
    return torch.device(preference)


def set_threads() -> None:
    n = int(os.environ.get("PRIVBENCH_THREADS", "0") or 0) or (os.cpu_count() or 1)
    torch.set_num_threads(n)


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
