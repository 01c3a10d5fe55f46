"""Per-token signals of a model on a text, computed once and shared by every attack.

For each text we keep the token ids, log p(x_t | x_<t) of every scored token,
and the mean and variance of log p(z) under the model's own next-token
distribution at that position (what Min-K%++ normalises by). Loss, zlib,
Min-K%, Min-K%++, reference and RMIA are then cheap functions of these.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class TokenSignals:
    """Signals of one text under one model. Arrays have one entry per scored token."""

    token_ids: np.ndarray   # int32, the scored tokens
    logprobs: np.ndarray    # float32, log p(x_t | x_<t)
    mu: np.ndarray          # float32, E_{z~p(.|x_<t)}[log p(z)]
    sigma2: np.ndarray      # float32, Var_{z~p(.|x_<t)}[log p(z)]
    top1: np.ndarray        # int8, 1 where x_t is the model's most likely next token (next-token accuracy)
    top1_logprob: np.ndarray | None = None  # float32, max_z log p(z | x_<t): confidence of the greedy prediction

    @property
    def n_tokens(self) -> int:
        return int(self.logprobs.shape[0])

    def nll(self) -> float:
        """Mean negative log-likelihood per token (the 'loss' of the text)."""
        if self.n_tokens == 0:
            return float("nan")
        return float(-self.logprobs.astype(np.float64).mean())


def save_signals(path: Path, keys: list[str], signals: list[TokenSignals]) -> None:
    """Pack many texts' signals into one .npz (concatenated arrays plus offsets)."""
    lengths = np.array([s.n_tokens for s in signals], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    cat = lambda name, dt: (np.concatenate([getattr(s, name) for s in signals]).astype(dt)  # noqa: E731
                            if signals else np.zeros(0, dt))
    extra = {}
    if signals and all(s.top1_logprob is not None for s in signals):
        extra["top1_logprob"] = cat("top1_logprob", np.float32)
    with path.open("wb") as f:
        np.savez(f, keys=np.array(keys, dtype=np.str_), offsets=offsets,
                 token_ids=cat("token_ids", np.int32), logprobs=cat("logprobs", np.float32),
                 mu=cat("mu", np.float32), sigma2=cat("sigma2", np.float32), top1=cat("top1", np.int8), **extra)


def load_signals(path: Path) -> dict[str, TokenSignals]:
    """Read one shard. Pickled arrays are refused (``allow_pickle=False``): a shard is data, and a planted pickle
    would run code in whoever reads the cache; a refused shard raises, and the cache recomputes what it held."""
    # NpzFile re-reads an array from the zip on every data[name] access: read each array exactly once
    with np.load(path, allow_pickle=False) as data:
        arrays = {name: data[name] for name in ("keys", "offsets", "token_ids", "logprobs", "mu", "sigma2", "top1")}
        t1 = data["top1_logprob"] if "top1_logprob" in data.files else None
    keys, off = list(arrays["keys"]), arrays["offsets"]
    out = {}
    for i, k in enumerate(keys):
        sl = slice(int(off[i]), int(off[i + 1]))
        out[str(k)] = TokenSignals(arrays["token_ids"][sl], arrays["logprobs"][sl], arrays["mu"][sl],
                                   arrays["sigma2"][sl], arrays["top1"][sl], None if t1 is None else t1[sl])
    return out
