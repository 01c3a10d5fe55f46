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
    norm and clipped-sum formulas (the ghost norm, the embedding's Σ_{t,s}) hold per unit on this layout.
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


def unit_count(row_unit: torch.Tensor) -> int:
    """Units in a batch whose rows ``row_unit`` numbers 0 .. units − 1."""
    return int(row_unit.max()) + 1
