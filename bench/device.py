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


def bf16_supported(device: torch.device) -> bool:
    """bf16 autocast is worth it (and numerically sane) on CUDA GPUs with native bf16 (Ampere and later)."""
    return device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def is_oom(exc: BaseException) -> bool:
    """True for a CUDA out-of-memory error (``torch.OutOfMemoryError`` or the older RuntimeError text)."""
    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def release_memory(device: torch.device | None = None) -> None:
    """Return freed accelerator memory between jobs: collect dropped model references, empty the CUDA cache."""
    import gc
    gc.collect()
    if torch.cuda.is_available() and (device is None or device.type == "cuda"):
        torch.cuda.empty_cache()


def run_with_oom_backoff(fn, batch_size: int, device: torch.device, *, on_shrink=None, min_batch: int = 1):
    """``fn(batch_size)``, halving the batch on each CUDA out-of-memory error until it fits.

    Automatic batch sizing for scoring: start from the spec's batch size (set it high on a GPU)
    and settle on the largest power-of-two fraction that fits. ``on_shrink(b)`` is told the batch
    that finally worked. A batch of ``min_batch`` that still does not fit re-raises the error.
    """
    bs = max(int(batch_size), 1)
    while True:
        try:
            out = fn(bs)
        except Exception as exc:  # noqa: BLE001 - only OOM is retried, everything else propagates
            if not is_oom(exc) or bs <= min_batch:
                raise
            del exc
            release_memory(device)
            bs = max(bs // 2, min_batch)
            continue
        if bs != batch_size and on_shrink is not None:
            on_shrink(bs)
        return out


def score_bf16(device: torch.device) -> bool:
    """Score under bf16 autocast? Opt-in (``PRIVBENCH_SCORE_BF16=1``) and only where bf16 is native.

    fp32 stays the default: Min-K%++ divides by the per-position σ of log p, and
    bf16 logits (8-bit mantissa) move σ enough to reorder close scores; loss-based
    attacks tolerate bf16. The flag is part of every model fingerprint, so bf16
    signals never mix with fp32 ones in the cache.
    """
    return os.environ.get("PRIVBENCH_SCORE_BF16", "") == "1" and bf16_supported(device)


def configure_determinism() -> bool:
    """With ``PRIVBENCH_DETERMINISTIC=1``: deterministic kernels only (docs/determinism.md).

    Sets ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (when unset; it must be set before cuBLAS
    starts, so set it in the environment for GPU runs), ``torch.use_deterministic_algorithms(True)``
    (an op without a deterministic kernel then raises instead of silently varying), and
    cuDNN's deterministic mode without autotuning. Off by default: on CPU privbench is already
    bit-reproducible at a fixed thread count, and on GPUs these flags cost speed.
    """
    if os.environ.get("PRIVBENCH_DETERMINISTIC", "") != "1":
        return False
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    return True
