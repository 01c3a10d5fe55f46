"""Zlib attack (Carlini et al., 2021): loss calibrated by the text's zlib entropy.

As in GUARD (anonymous preprint, 2025), §4.1.
"""

from __future__ import annotations

import zlib

import numpy as np

from bench.attack import Attack
from bench.registry import register_attack


def zlib_entropy(text: str) -> int:
    """Length in bytes of the zlib-compressed UTF-8 text (Carlini et al.'s zlib entropy)."""
    return len(zlib.compress(text.encode("utf-8")))


@register_attack("zlib")
class ZlibAttack(Attack):
    description = "Token loss divided by zlib entropy; members have low loss relative to their compressibility."
    reference = "Carlini et al. 2021; GUARD (anonymous preprint, 2025), §4.1: score = -L(x|θ) / zlib(x)"

    def score(self, view):
        sig = view.model.token_signals(view.texts)
        return np.array([-s.nll() / zlib_entropy(t) for s, t in zip(sig, view.texts)])
