"""The arithmetic of unit-level DP-SGD shared by every per-record gradient mode of ``dp_adapt``: a unit's weight
per row, per-row tensors summed per unit, and token tensors laid out per unit (docs/dp.md, "Unit-level DP")."""

from __future__ import annotations

import torch


def unit_weights(row_unit: torch.Tensor) -> torch.Tensor:
    """1 / (rows of the row's unit): a unit's loss is the mean of its records' losses, so its gradient is the
    mean of theirs (Charles et al. 2024), on the scale of one record's whatever the unit's size."""
    return 1.0 / torch.bincount(row_unit)[row_unit].to(torch.float32)


def sum_rows_by_unit(x: torch.Tensor, row_unit: torch.Tensor, n_units: int) -> torch.Tensor:
    """Per-row tensors (rows, ...) summed per unit: (units, ...)."""
    return x.new_zeros((n_units, *x.shape[1:])).index_add_(0, row_unit.to(x.device), x)


def regroup_tokens(x: torch.Tensor, row_unit: torch.Tensor, n_units: int) -> torch.Tensor:
    """Per-row token tensors (rows, T, ...) laid out per unit: (units, R·T, ...) with R the most rows of a unit,
    a unit's rows one after another along the token axis and zeros where a unit has fewer rows.

    Why: a Linear layer's gradient of a unit is Σ_t g_tᵀ a_t over the tokens of all its rows, so the per-record
    ghost norm Σ_{t,s} (a_t·a_s)(g_t·g_s) holds per unit on this layout (where book-keeping finds it cheaper than
    forming each row's gradient and summing them per unit).
    """
    row_unit = row_unit.to(x.device)
    counts = torch.bincount(row_unit, minlength=n_units)
    width = int(counts.max())
    order = torch.argsort(row_unit, stable=True)  # rows by unit, each unit's rows in their order
    start = torch.cumsum(counts, 0) - counts  # where each unit's rows begin in that order
    position = torch.empty_like(row_unit)
    position[order] = torch.arange(len(row_unit), device=x.device) - start[row_unit[order]]
    out = x.new_zeros((n_units * width, *x.shape[1:]))
    out[row_unit * width + position] = x
    return out.reshape(n_units, width * x.shape[1], *x.shape[2:])


def embedding_sq_norms(ids: torch.Tensor, g_emb: torch.Tensor, row_unit: torch.Tensor | None, n: int) -> torch.Tensor:
    """Each record's (``row_unit`` None) or unit's squared norm of its input-embedding gradient, from the gradients
    ``g_emb`` (rows, T, d) at the embedding's output of the tokens ``ids`` (rows, T): (n,).

    Per record: Σ_{t,s} [x_t = x_s] g_t·g_s, the T×T Gram matrix of a row. Per unit: a unit's gradient has one
    row per distinct token id it holds, the sum of the ``g_emb`` rows of that id's occurrences, so the norm sums
    those sums' squares. Why not the Gram formula over :func:`regroup_tokens` there: that is quadratic in a unit's
    tokens (R·T)², this is linear in them.
    """
    if row_unit is None:
        same = (ids[:, :, None] == ids[:, None, :]).to(g_emb.dtype)
        return (torch.bmm(g_emb, g_emb.transpose(1, 2)) * same).sum((1, 2))
    row_unit = row_unit.to(ids.device)
    vocab = int(ids.max()) + 1
    keys = (row_unit[:, None] * vocab + ids).reshape(-1)  # (unit, token id), one key per pair
    pairs, slot = torch.unique(keys, return_inverse=True)
    summed = g_emb.new_zeros((len(pairs), g_emb.shape[-1])).index_add_(0, slot, g_emb.reshape(-1, g_emb.shape[-1]))
    return g_emb.new_zeros(n).index_add_(0, pairs // vocab, summed.square().sum(1))


def unit_count(row_unit: torch.Tensor) -> int:
    """Units in a batch whose rows ``row_unit`` numbers 0 .. units − 1."""
    return int(row_unit.max()) + 1
