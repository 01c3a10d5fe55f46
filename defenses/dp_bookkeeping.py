"""Book-keeping DP-SGD (Bu, Wang, Zha and Karypis 2023): per-record clipping at about the cost of one
non-private step.

A non-private step is one forward and one backward pass; the backward computes the activation gradients
and, from them and the saved activations, the weight gradients. DP-SGD needs each record's gradient norm
before it may sum. Opacus' hooks materialise every per-record weight gradient besides the summed one; its
ghost clipping gets the norms without them but then runs a second backward pass. Book-keeping runs the
backward once *without* weight gradients, keeps each layer's activations a and output gradients g (the
"book"), and from them computes

* the per-record norms: for a Linear layer ||g_iᵀ a_i||²_F = Σ_{t,s} (a_it·a_is)(g_it·g_is) (the ghost norm,
  Li et al. 2022) when T·(d_in + d_out) < d_in·d_out, else by forming g_iᵀ a_i; LayerNorm and bias gradients
  are small and formed directly; the input embedding's norm is Σ_{t,s} [x_it = x_is] g_it·g_is;
* the clipped sum Σ_i c_i g_iᵀ a_i = (c ∘ g)ᵀ a: one matrix product per layer, the same work as the weight
  gradient the non-private backward computes (or, where the per-record gradients were formed for the norm,
  their weighted sum).

Clipping (flat, c_i = min(1, C / (||g_i|| + 1e-6))), the noise N(0, (σC)²) drawn per parameter in the
optimizer's order, the division by the expected batch size and the accountant step are Opacus' DPOptimizer's,
so the step equals the hooks mode's for the same batch and noise generator (tests/test_dp.py).

Layers of one shape (a transformer's blocks) are grouped on a GPU: their activations and output gradients are
stacked along the batch and each operation above runs once per group instead of once per layer, because a small
model's step there is bound by kernel launches, not flops. Grouping sums the same terms in another order, so its
results differ from the per-layer step's in the last bits; the per-layer step stays the CPU default, whose
rounding the stored runs hold (``group_layers`` chooses; tests/test_dp.py holds the two equal to float tolerance).

Only the layers a step needs are tracked: trainable parameters are switched to ``requires_grad=False`` for the
pass, and the output of the first trainable layer on a path becomes the leaf of the backward, so with only
the head trainable the frozen body runs without autograd, as in the non-private step. Supported trainable
modules: ``nn.Linear`` (LoRA's A and B are Linear layers), ``nn.LayerNorm`` over the last dimension and the
input ``nn.Embedding``. Anything else (tied input and output embeddings, RMSNorm, prefix encoders) is refused
with the modes that handle it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bench.errors import ConfigError
from defenses.dp_units import embedding_sq_norms, regroup_tokens, sum_rows_by_unit, unit_count, unit_weights

SUPPORTED = (torch.nn.Linear, torch.nn.LayerNorm, torch.nn.Embedding)


def _tracked_modules(model: torch.nn.Module) -> tuple[dict[str, torch.nn.Module], torch.nn.Embedding | None]:
    """The modules owning trainable parameters (by name) and the trainable input embedding, checked."""
    owners: dict[int, str] = {}
    modules: dict[str, torch.nn.Module] = {}
    for name, module in model.named_modules():
        own = [p for p in module.parameters(recurse=False) if p.requires_grad]
        if not own:
            continue
        if not isinstance(module, SUPPORTED):
            raise ConfigError(f"dp_adapt: grad_sample_mode bk cannot track {type(module).__name__} ({name}): it "
                              f"supports Linear, LayerNorm and the input Embedding; use grad_sample_mode hooks "
                              f"or vmap")
        if isinstance(module, torch.nn.LayerNorm) and len(module.normalized_shape) != 1:
            raise ConfigError(f"dp_adapt: grad_sample_mode bk needs LayerNorm over the last dimension ({name}): "
                              f"use grad_sample_mode hooks")
        for p in own:
            if id(p) in owners:
                raise ConfigError(f"dp_adapt: grad_sample_mode bk cannot clip a parameter shared by {owners[id(p)]} "
                                  f"and {name} (tied embeddings): use grad_sample_mode hooks")
            owners[id(p)] = name
        modules[name] = module
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    emb = emb if emb is not None and any(m is emb for m in modules.values()) else None
    for name, module in modules.items():
        if isinstance(module, torch.nn.Embedding) and module is not emb:
            raise ConfigError(f"dp_adapt: grad_sample_mode bk tracks only the input embedding, not {name}: use "
                              f"grad_sample_mode hooks")
    return modules, emb


def _ghost_is_cheaper(a: torch.Tensor, g: torch.Tensor, unit_rows: int | None, n: int) -> bool:
    """Whether a Linear layer's norms cost fewer flops from T×T Gram matrices (the ghost norm) than from the
    formed per-record gradients: T·(d_in + d_out) < d_in·d_out per record. Per unit the Gram matrices span a
    unit's R·T tokens (R = ``unit_rows``, the most rows of a unit; None per record) while the gradients are formed
    per row and summed, so the comparison is n·(R·T)²·(d_in + d_out) against rows·T·d_in·d_out."""
    rows, t, d_in, d_out = a.shape[0], a.shape[1], a.shape[2], g.shape[2]
    if unit_rows is None:
        return t * (d_in + d_out) < d_in * d_out
    width = unit_rows * t
    return n * width * width * (d_in + d_out) < rows * t * d_in * d_out


def _cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` in ``dtype``, without a dispatch where it already is (each dispatch is a launch's host cost on a GPU)."""
    return x if x.dtype == dtype else x.to(dtype)


def _sq_norms(per_record: torch.Tensor) -> torch.Tensor:
    """Squared L2 norm of each record's slice (first dimension), in one pass without a squared copy."""
    return torch.linalg.vector_norm(per_record.reshape(per_record.shape[0], -1), dim=1).square()


def _group_key(module: torch.nn.Module, a: torch.Tensor, g: torch.Tensor) -> tuple:
    """Layers with equal keys run the same step operations on tensors of the same shapes, so one stacked call
    serves them all: the module's kind, which of its parameters train, its LayerNorm settings and the shapes."""
    trains = tuple(p is not None and p.requires_grad for p in (module.weight, module.bias))
    dtypes = tuple(None if p is None else p.dtype for p in (module.weight, module.bias))
    norm = (tuple(module.normalized_shape), module.eps) if isinstance(module, torch.nn.LayerNorm) else None
    return type(module), norm, trains, dtypes, tuple(a.shape), tuple(g.shape), a.dtype, g.dtype


def _sum_over_layers(part: torch.Tensor, layers: int, n: int) -> torch.Tensor:
    """A group's per-record squared norms (layers·n,), laid out layer after layer, summed over its layers: (n,)."""
    return part if layers == 1 else part.view(layers, n).sum(0)


def _weighted_sums(weights: torch.Tensor, x: torch.Tensor, layers: int) -> list[torch.Tensor]:
    """Σ_r w_r x_r for each layer of a group whose rows are stacked layer after layer: x (layers·R, ...), w (R,)."""
    if layers == 1:
        return [torch.tensordot(weights, x, dims=1)]
    flat = torch.matmul(weights, x.reshape(layers, weights.shape[0], -1))
    return list(flat.view(layers, *x.shape[1:]).unbind(0))


def _row_products(x: torch.Tensor, y: torch.Tensor, layers: int) -> list[torch.Tensor]:
    """Σ_r x_rᵀ y_r for each layer of a group: x (layers·R, p), y (layers·R, q), rows stacked layer after layer."""
    if layers == 1:
        return [x.T @ y]
    return list(torch.bmm(x.view(layers, -1, x.shape[-1]).mT, y.view(layers, -1, y.shape[-1])).unbind(0))


class BookKeepingDP:
    """The optimizer-like object dp_train drives: ``backward(ids, mask)`` then ``step()`` (as ``_VmapDP``)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, noise_multiplier: float,
                 max_grad_norm: float, expected_batch_size: float, generator: torch.Generator | None,
                 accountant=None, sample_rate: float = 1.0, loss_fn, group_layers: bool | None = None,
                 autocast_bf16: bool = False) -> None:
        """``group_layers``: stack layers of one shape and run each step operation once per group (fewer kernel
        launches, another summation order); None groups on CUDA and steps layer by layer elsewhere.
        ``autocast_bf16``: the forward pass under bf16 autocast; the book's entries are then bf16 and the step
        takes the norms and clipped sums from them in fp32."""
        self.loss_fn = loss_fn  # (logits, ids, mask) -> one loss per record (defenses.dp.record_losses)
        self.model, self.optimizer = model, optimizer
        self.sigma, self.clip, self.expected = float(noise_multiplier), float(max_grad_norm), float(expected_batch_size)
        self.generator, self.accountant, self.sample_rate = generator, accountant, sample_rate
        self.modules, self.emb = _tracked_modules(model)
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        tracked = {id(p) for m in self.modules.values() for p in m.parameters(recurse=False) if p.requires_grad}
        if tracked != {id(p) for p in self.params}:
            raise ConfigError("dp_adapt: grad_sample_mode bk: the optimizer's parameters are not the model's "
                              "trainable ones")
        self._book: dict[str, list] = {}
        self._pending: tuple | None = None
        if group_layers is None:
            group_layers = bool(self.params) and self.params[0].device.type == "cuda"
        self.group_layers = bool(group_layers)
        self.autocast_bf16 = bool(autocast_bf16)

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def _record(self, name: str):
        def hook(_module, args, output):
            x = args[0].detach()
            if not output.requires_grad:  # nothing trainable upstream: this layer's output starts the backward
                output = output.detach().requires_grad_(True)
            entry = [x, None]
            self._book[name].append(entry)
            output.register_hook(lambda g: entry.__setitem__(1, g.detach()))
            return output
        return hook

    def backward(self, ids: torch.Tensor, mask: torch.Tensor, row_unit: torch.Tensor | None = None) -> torch.Tensor:
        """One forward and one backward pass without weight gradients; returns the mean record loss.

        With ``row_unit`` (unit-level DP) each record's loss is weighted by 1 / its unit's rows, so a unit's
        gradient is the mean of its records'; ``step`` takes the norms per unit and clips units. Returns the
        mean unit loss then."""
        self._book = {n: [] for n, m in self.modules.items() if m is not self.emb}
        handles = [m.register_forward_hook(self._record(n)) for n, m in self.modules.items() if m is not self.emb]
        for p in self.params:
            p.requires_grad_(False)
        try:
            with torch.enable_grad():
                with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=self.autocast_bf16):
                    if self.emb is not None:
                        embeds = self.emb(ids).detach().requires_grad_(True)
                        logits = self.model(inputs_embeds=embeds, attention_mask=mask).logits
                    else:
                        embeds = None
                        logits = self.model(input_ids=ids, attention_mask=mask).logits
                    losses = self.loss_fn(logits, ids, mask)
                if row_unit is not None:
                    losses = losses * unit_weights(row_unit)
                if losses.requires_grad:
                    losses.sum().backward()  # records are independent: each output gradient is its own record's
        finally:
            for h in handles:
                h.remove()
            for p in self.params:
                p.requires_grad_(True)
        self._pending = (ids, embeds.grad if embeds is not None else None, row_unit)
        if row_unit is None:
            return losses.detach().mean()
        return losses.detach().sum() / unit_count(row_unit)

    def _entries(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(activations, output gradients) of a layer as (B, T, d) tensors, calls joined along T."""
        xs, gs = [], []
        for x, g in self._book[name]:
            if g is None:  # the output took no part in the loss
                continue
            if x.dim() == 2:
                x, g = x[:, None], g[:, None]
            elif x.dim() > 3:
                x, g = x.reshape(x.shape[0], -1, x.shape[-1]), g.reshape(g.shape[0], -1, g.shape[-1])
            xs.append(x)
            gs.append(g)
        if not xs:
            return None, None
        if len(xs) == 1:  # one call (the usual case): no copy
            return xs[0], gs[0]
        return torch.cat(xs, 1), torch.cat(gs, 1)

    def _groups(self) -> list[tuple[list[torch.nn.Module], torch.Tensor, torch.Tensor]]:
        """The tracked layers with a book as (modules, activations, output gradients), float32, in module order:
        one layer each, or with ``group_layers`` the layers of one key stacked along the batch, layer after layer.
        The book is emptied as it is read and a group's parts are let go once stacked, so the stacked copies
        take the book's place; layers that read one tensor (a block's two LayerNorms, LoRA's A matrices of q, k
        and v) get a copy each, so the step holds up to a few times the book where the per-layer step holds it
        once (GPU memory: the activations the backward pass held are freed by then)."""
        found: dict[object, list] = {}
        for name, module in self.modules.items():
            if module is self.emb:
                continue
            a, g = self._entries(name)
            self._book.pop(name, None)
            if a is None:
                continue
            key = _group_key(module, a, g) if self.group_layers else name
            found.setdefault(key, []).append((module, a, g))
        out = []
        for members in found.values():
            mods = [m for m, _, _ in members]
            if len(members) == 1:
                a, g = members[0][1], members[0][2]
            else:
                a, g = torch.cat([x for _, x, _ in members]), torch.cat([y for _, _, y in members])
            members.clear()
            out.append((mods, _cast(a, torch.float32), _cast(g, torch.float32)))
        return out

    @torch.no_grad()
    def step(self) -> None:
        sums: dict[int, torch.Tensor] = {}
        if self._pending is not None:
            ids, g_emb, row_unit = self._pending
            n = ids.shape[0] if row_unit is None else unit_count(row_unit)
            unit_rows = None if row_unit is None else int(torch.bincount(row_unit).max())  # once a step, not a layer
            stacked: dict[int, tuple] = {1: (row_unit, n)}  # per group size k: (row units, units) of k layers

            def units_of(k: int) -> tuple[torch.Tensor | None, int]:
                if k not in stacked:  # layer l's rows belong to units l·n .. l·n + n − 1
                    offsets = None if row_unit is None else \
                        (row_unit[None, :] + n * torch.arange(k, device=row_unit.device)[:, None]).reshape(-1)
                    stacked[k] = (offsets, n * k)
                return stacked[k]

            norm2 = torch.zeros(n, dtype=torch.float32, device=ids.device)
            groups = []
            for mods, a, g in self._groups():
                module, k = mods[0], len(mods)
                unit_k, n_k = units_of(k)
                # unit-level: per-row tensors summed per unit (identity per record); book entries stay per row
                by_unit = (lambda x: x) if unit_k is None else (lambda x, u=unit_k, m=n_k: sum_rows_by_unit(x, u, m))
                per_record = None  # per-record (per-unit) weight gradients, where forming them is the cheaper way
                if isinstance(module, torch.nn.LayerNorm):
                    a = F.layer_norm(a, module.normalized_shape, eps=module.eps)  # x̂: the weight's input
                    if module.weight is not None and module.weight.requires_grad:
                        per_record = by_unit((g * a).sum(1))
                        norm2 += _sum_over_layers(_sq_norms(per_record), k, n)
                elif module.weight.requires_grad:
                    if _ghost_is_cheaper(a, g, unit_rows, n_k):
                        if unit_k is not None:  # each unit's tokens along one axis: its norm over all of them
                            a_u, g_u = regroup_tokens(a, unit_k, n_k), regroup_tokens(g, unit_k, n_k)
                        else:
                            a_u, g_u = a, g
                        ghost = (torch.bmm(a_u, a_u.transpose(1, 2)) * torch.bmm(g_u, g_u.transpose(1, 2))).sum((1, 2))
                        norm2 += _sum_over_layers(ghost, k, n)
                    else:
                        per_record = by_unit(torch.bmm(g.transpose(1, 2), a))
                        norm2 += _sum_over_layers(_sq_norms(per_record), k, n)
                g_bias = None  # each row's bias gradient: its output gradients summed over positions
                if module.bias is not None and module.bias.requires_grad:
                    g_bias = g.sum(1)
                    norm2 += _sum_over_layers(_sq_norms(by_unit(g_bias)), k, n)
                groups.append((mods, a, g, per_record, g_bias))
            if g_emb is not None:
                norm2 += embedding_sq_norms(ids, g_emb, row_unit, n)
            coef = (self.clip / (norm2.sqrt() + 1e-6)).clamp(max=1.0)
            row_coef = coef if row_unit is None else coef[row_unit.to(coef.device)]  # a row is clipped as its unit
            row_scale = row_coef[:, None, None]
            for mods, a, g, per_record, g_bias in groups:
                k, w = len(mods), mods[0].weight
                if w is not None and w.requires_grad:
                    if per_record is not None:  # already formed: a weighted sum over records (units)
                        got = _weighted_sums(coef, per_record, k)
                    else:  # (c ∘ g)ᵀ a: the non-private weight gradient's product, records weighted
                        scale = row_scale if k == 1 else row_scale.repeat(k, 1, 1)
                        got = _row_products((g * scale).reshape(-1, g.shape[-1]), a.reshape(-1, a.shape[-1]), k)
                    for m, s in zip(mods, got):
                        sums[id(m.weight)] = _cast(s, w.dtype)
                if g_bias is not None:
                    for m, s in zip(mods, _weighted_sums(row_coef, g_bias, k)):
                        sums[id(m.bias)] = _cast(s, m.bias.dtype)
            if g_emb is not None:
                w = self.emb.weight
                sums[id(w)] = torch.zeros_like(w).index_add_(
                    0, ids.reshape(-1), _cast((row_scale * g_emb).reshape(-1, w.shape[1]), w.dtype))
        # Opacus' DPOptimizer: noise per parameter in the optimizer's order, drawn one parameter at a time (the
        # generator's stream), then (clipped sum + noise) / expected batch size; the sums and divisions run as
        # multi-tensor (foreach) kernels, so a GPU step launches two kernels here instead of two per parameter
        grads = [torch.normal(0.0, self.sigma * self.clip, p.shape, generator=self.generator, device=p.device)
                 for p in self.params]
        summed = [(i, sums[id(p)]) for i, p in enumerate(self.params) if id(p) in sums]
        if summed:
            torch._foreach_add_([grads[i] for i, _ in summed], [s for _, s in summed])
        torch._foreach_div_(grads, self.expected)
        for p, grad in zip(self.params, grads):
            p.grad = grad
        self.optimizer.step()
        if self.accountant is not None:
            self.accountant.step(noise_multiplier=self.sigma, sample_rate=self.sample_rate)
        self._pending = None
        self._book = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._pending = None
        self._book = {}
        self.optimizer.zero_grad(set_to_none=set_to_none)
