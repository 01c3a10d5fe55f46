"""Differentially private adaptation (DP-SGD with Adam, Opacus), after source 004 section 3 and appendix B.2.

One defense, ``dp_adapt``, with the four adaptation methods of 004:

* ``full``   – every weight trains (Li et al., 2022).
* ``head``   – only the output embedding (``model.get_output_embeddings()``;
  GPT-NeoX calls it ``embed_out`` / ``lm_head``) trains: 004's "last layer".
* ``lora``   – peft LoRA, r = 8, alpha = 16, merged into the weights at release.
* ``prefix`` – prefix tuning (Li & Liang 2021) through peft: trainable key/value
  vectors prepended at every layer. It trains under DP here (:func:`train_prefix`),
  but it cannot be merged into GPT-NeoX weights, so the store path of privbench
  (``ensure_adapted`` saves a plain Hugging Face checkpoint that ``load_model``
  reads back) cannot release it: ``method: prefix`` raises a ConfigError that says
  so, instead of silently releasing the base model. docs/dp.md gives the core
  change that would release it.

Privacy (Abadi et al., 2016): every step draws a Poisson sample of the records
(each with probability q), clips each record's gradient to L2 norm ``clip``,
adds N(0, (σ·clip)²) noise to the sum and divides by the expected batch size;
Adam(W) then uses that noisy gradient. σ is calibrated so that the RDP accountant
(or PRV, ``accountant: prv``) gives ε ≤ ``epsilon`` at δ after all steps; the
ledger recomputes ε with both accountants. The unit of privacy is one adaptation
record (a text, truncated to ``chunk_length`` tokens), i.e. 004's sentence-level
DP where each record is one chunk. The loss of a record is its own mean token
loss, so no record's gradient depends on another record (a token-mean over the
whole batch, as Hugging Face computes it, would couple records).

``epsilon: inf`` is the non-private run of the same method: the same Poisson
batches, steps, optimizer and loss, with neither clipping nor noise.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from bench.accounting import DPLedger, noise_for_epsilon
from bench.defense import Defense, TrainContext
from bench.errors import ConfigError
from bench.params import Param
from bench.registry import register_defense

METHODS = ("full", "head", "lora", "prefix")
EPSILON_GRID = (0.1, 0.5, 1.0, 3.0, 8.0, math.inf)  # 004's privacy regimes
DEFAULT_LR = {"full": 1e-3, "head": 1e-3, "lora": 3e-3, "prefix": 1e-2}
LORA_TARGETS = ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"]
PREFIX_UNSUPPORTED = (
    "dp_adapt: method 'prefix' cannot be released by privbench yet: prefix tuning adds trained key/value "
    "vectors at every layer that cannot be merged into GPT-NeoX weights, and the release path stores and "
    "reloads a plain Hugging Face checkpoint (ensure_adapted -> save_pretrained -> load_model), which would "
    "silently drop the prefix; use method full, head or lora (docs/dp.md names the core change that would "
    "release prefix-tuned models)")


class _EpsilonParam(Param):
    """A float parameter that also accepts infinity (``inf``, ``.inf``): the ε = ∞ column of the grid."""

    def validate(self, value: Any, owner: str) -> Any:
        if isinstance(value, str) and value.strip().lower().lstrip("+.") in ("inf", "infinity"):
            return math.inf
        if isinstance(value, float) and value == math.inf:
            return math.inf
        return super().validate(value, owner)


PARAMS = (
    Param("method", str, "full", "what trains: all weights, the output head, LoRA adapters, or a prefix",
          choices=METHODS),
    _EpsilonParam("epsilon", float, 8.0, "target epsilon of (epsilon, delta)-DP; inf = the same method without DP",
                  low=0.0, low_inclusive=False),
    Param("delta", float, None, "delta of (epsilon, delta)-DP; null = 1 / number of records", low=0.0,
          low_inclusive=False, high=1.0, high_inclusive=False, nullable=True),
    Param("clip", float, 0.1, "per-record L2 clipping norm (0.1 as in 004, after Li et al. 2022)", low=0.0,
          low_inclusive=False),
    Param("noise_multiplier", float, None, "noise std / clip; null = calibrated to epsilon (give it to override)",
          low=0.0, nullable=True),
    Param("accountant", str, "rdp", "accountant that calibrates the noise (both are recorded)",
          choices=("rdp", "prv")),
    Param("epochs", float, 4.0, "expected passes over the data: steps = epochs / sampling rate", low=0.0,
          low_inclusive=False),
    Param("lr", float, None, "Adam(W) learning rate; null = 1e-3 full/head, 3e-3 lora, 1e-2 prefix", low=0.0,
          low_inclusive=False, nullable=True),
    Param("batch_size", int, 16, "expected records per step under Poisson sampling", low=1),
    Param("chunk_length", int, 128, "tokens per record (longer records are truncated)", low=8),
    Param("weight_decay", float, 0.0, "AdamW weight decay (0 = Hugging Face's default)", low=0.0),
    Param("r", int, 8, "LoRA rank (004: 8)", low=1),
    Param("alpha", int, 16, "LoRA alpha (004: 16)", low=1),
    Param("target_modules", list, LORA_TARGETS, "modules that get LoRA adapters", item_type=str),
    Param("prefix_length", int, 8, "prefix tuning: virtual tokens (004 uses 64 with 256-token chunks; 8 "
          "keeps the same small share of the 128-token context here)", low=1),
    Param("grad_sample_mode", str, "hooks", "per-record gradients: Opacus hooks or functorch, or one torch.func "
          "vmap over the whole model (with Opacus' DPOptimizer and accountant)",
          choices=("hooks", "functorch", "vmap")),
)


# ------------------------------------------------------------------------------------------ data
class _Records(torch.utils.data.Dataset):
    def __init__(self, seqs: list[list[int]]) -> None:
        self.seqs = seqs

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, i: int) -> list[int]:
        return self.seqs[i]


class _Collate:
    """Right-pad a batch of token lists to (ids, mask); picklable for DataLoader workers."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, batch: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        if not batch:  # Poisson sampling can draw no record at all
            return torch.zeros((0, 1), dtype=torch.long), torch.zeros((0, 1), dtype=torch.long)
        width = max(len(s) for s in batch)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for r, s in enumerate(batch):
            ids[r, : len(s)] = torch.tensor(s, dtype=torch.long)
            mask[r, : len(s)] = 1
        return ids, mask


def record_losses(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each record's own mean next-token loss, shape (batch,): no record's value depends on another."""
    lp = torch.nn.functional.cross_entropy(logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten(),
                                           reduction="none").view(ids.shape[0], -1)
    m = mask[:, 1:].to(lp.dtype)
    return (lp * m).sum(1) / m.sum(1).clamp_min(1.0)


# ------------------------------------------------------------------------------------------ training
def dp_train(model: torch.nn.Module, seqs: list[list[int]], *, pad_id: int, epsilon: float, delta: float | None,
             clip: float, epochs: float, lr: float, batch_size: int, seed: int, weight_decay: float = 0.0,
             noise_multiplier: float | None = None, accountant: str = "rdp", grad_sample_mode: str = "hooks",
             device: torch.device | None = None, desc: str = "dp", progress: bool = False) -> dict:
    """Train the parameters of ``model`` that require grad with DP-SGD + AdamW; returns the report.

    ``epsilon = inf`` (and no ``noise_multiplier``) trains on the same Poisson batches without
    clipping or noise. The report has ``ledger`` (a :class:`DPLedger` dict, or None when non-private)
    and the step timing.
    """
    from opacus import PrivacyEngine
    from opacus.data_loader import DPDataLoader

    seqs = [list(s) for s in seqs if len(s) >= 2]
    if not seqs:
        raise ConfigError(f"{desc}: no training record has 2 or more tokens: check the adaptation data")
    device = device or next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ConfigError(f"{desc}: nothing to train (no parameter requires grad)")
    n = len(seqs)
    if batch_size > n:
        raise ConfigError(f"{desc}: batch_size {batch_size} exceeds the {n} records: lower batch_size")
    private = noise_multiplier is not None or math.isfinite(epsilon)
    gen = torch.Generator().manual_seed(seed)
    loader = torch.utils.data.DataLoader(_Records(seqs), batch_size=batch_size, collate_fn=_Collate(pad_id),
                                         generator=gen)
    sample_rate = 1.0 / len(loader)  # Opacus' definition: q = 1 / batches per epoch, about batch_size / n
    steps = max(1, int(round(epochs / sample_rate)))
    delta = float(delta) if delta is not None else 1.0 / n
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)  # HF defaults: betas (0.9, 0.999), eps 1e-8
    torch.manual_seed(seed)
    model.train()  # Opacus needs training mode before make_private (offline-facts)
    hooks = vmap_grads = None
    if private:
        if noise_multiplier is not None:
            sigma, calibrated_by, target = float(noise_multiplier), "given", None
        else:
            sigma = noise_for_epsilon(epsilon, delta, sample_rate, steps, accountant=accountant)
            calibrated_by, target = accountant, float(epsilon)
        noise_gen = torch.Generator(device=device).manual_seed(seed + 1)
        if grad_sample_mode == "vmap":
            # the same three Opacus parts, assembled by hand: Poisson loader, DPOptimizer (clip + noise), RDP
            # accountant; per-record gradients come from torch.func.vmap over the whole model (see _VmapGrads)
            from opacus.accountants import RDPAccountant
            from opacus.optimizers import DPOptimizer
            loader = DPDataLoader.from_data_loader(loader, generator=gen)
            opt = DPOptimizer(opt, noise_multiplier=sigma, max_grad_norm=clip,
                              expected_batch_size=int(n * sample_rate), loss_reduction="mean", generator=noise_gen)
            accountant_obj = RDPAccountant()
            opt.attach_step_hook(accountant_obj.get_optimizer_hook_fn(sample_rate=sample_rate))
            vmap_grads = _VmapGrads(model)
        else:
            engine = PrivacyEngine(accountant="rdp")
            hooks, opt, loader = engine.make_private(
                module=model, optimizer=opt, data_loader=loader, noise_multiplier=sigma, max_grad_norm=clip,
                poisson_sampling=True, grad_sample_mode=grad_sample_mode, loss_reduction="mean", wrap_model=False,
                noise_generator=noise_gen)
            accountant_obj = engine.accountant
    else:
        loader = DPDataLoader.from_data_loader(loader, generator=gen)  # same Poisson batches, no clip, no noise
    sched = lambda s: lr * max(0.0, 1.0 - s / steps)  # noqa: E731  (HF Trainer's default linear decay)

    step, tokens, empty, loss_val = 0, 0, 0, float("nan")
    step_times: list[float] = []
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=steps, desc=desc, unit="step", leave=False, mininterval=1.0)
    try:
        while step < steps:
            for ids, mask in loader:
                if step >= steps:
                    break
                t0 = time.perf_counter()
                for g in opt.param_groups:
                    g["lr"] = sched(step)
                if ids.shape[0] == 0:
                    empty += 1
                    if private:  # the release of an empty step is noise alone: still take it
                        for p in params:
                            p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device)
                        opt.step()
                    opt.zero_grad(set_to_none=True)
                else:
                    ids, mask = ids.to(device), mask.to(device)
                    if vmap_grads is not None:
                        loss = vmap_grads.step(ids, mask)
                    else:
                        logits = model(input_ids=ids, attention_mask=mask).logits
                        loss = record_losses(logits, ids, mask).mean()
                    if not torch.isfinite(loss):
                        raise ConfigError(f"{desc}: training loss became {loss.item()}: lower the learning rate")
                    if vmap_grads is None:
                        loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    tokens += int(mask.sum())
                    loss_val = float(loss.detach())
                step += 1
                step_times.append(time.perf_counter() - t0)
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        if hooks is not None:
            hooks.cleanup()  # removes Opacus' hooks and grad_sample attributes: the model is plain again
        for p in params:
            for attr in ("grad_sample", "summed_grad", "_processed"):
                if hasattr(p, attr):
                    try:
                        delattr(p, attr)
                    except AttributeError:
                        pass
            p.grad = None
    model.eval()

    ledger = None
    if private:
        hist = accountant_obj.history
        if hist != [(sigma, sample_rate, steps)]:  # the engine's own account must match ours
            raise ConfigError(f"{desc}: Opacus accounted {hist}, expected {[(sigma, sample_rate, steps)]}")
        ledger = DPLedger.build(sigma=sigma, sample_rate=sample_rate, steps=steps, clip=clip, delta=delta,
                                n_records=n, target_epsilon=target, accountant=calibrated_by,
                                grad_sample_mode=grad_sample_mode)
    timed = step_times[1:] or step_times  # the first step pays one-off setup
    total = sum(step_times)
    return {
        "ledger": ledger.to_dict() if ledger is not None else None,
        "_ledger": ledger,
        "private": private,
        "steps": steps, "empty_steps": empty, "tokens": tokens, "final_loss": loss_val,
        "seconds": round(total, 3), "step_seconds_mean": sum(timed) / len(timed),
        "tokens_per_s": round(tokens / total, 1) if total > 0 else float("nan"),
        "sample_rate": sample_rate, "expected_batch": sample_rate * n, "n_records": n, "delta": delta,
        "lr": lr,
    }


class _VmapGrads:
    """Per-record gradients of every trainable parameter in one ``vmap(grad(...))`` over the whole model.

    Opacus' hooks compute per-record weight gradients from saved activations while autograd also computes
    the summed gradient that DP-SGD then throws away; here each record's loss is differentiated once.
    Records are right-padded and the model is causal, so real tokens never see padding: the forward needs
    no attention mask (whose data-dependent checks vmap cannot trace); padding is excluded from the loss.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        from torch.func import functional_call, grad, vmap

        self.model = model
        self.trainable = {k: p for k, p in model.named_parameters() if p.requires_grad}
        frozen = {k: p.detach() for k, p in model.named_parameters() if not p.requires_grad}
        frozen.update(dict(model.named_buffers()))

        def loss_one(params, ids, mask):
            out = functional_call(model, ({**params, **frozen},), args=(),
                                  kwargs={"input_ids": ids[None], "use_cache": False})
            loss = record_losses(out.logits, ids[None], mask[None])[0]
            return loss, loss.detach()

        self._fn = vmap(grad(loss_one, has_aux=True), in_dims=(None, 0, 0), randomness="different")

    def step(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        grads, losses = self._fn({k: p.detach() for k, p in self.trainable.items()}, ids, mask)
        for k, p in self.trainable.items():
            p.grad_sample = grads[k]
        return losses.mean()


def train_prefix(model: torch.nn.Module, seqs: list[list[int]], *, prefix_length: int, **train_kw) -> tuple:
    """DP prefix tuning through peft: returns (peft model with the trained prefix, report).

    The result is a ``PeftModelForCausalLM``: the prefix lives in its ``prompt_encoder``
    and is passed as past key/values on every forward. It cannot be merged into the
    base weights; see the module docstring for why ``dp_adapt`` does not release it.
    """
    from peft import PrefixTuningConfig, get_peft_model

    cfg = PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=prefix_length)
    peft_model = get_peft_model(model, cfg)
    report = dp_train(peft_model, seqs, **train_kw)
    return peft_model, report


# ------------------------------------------------------------------------------------------ defense
@register_defense("dp_adapt")
class DPAdapt(Defense):
    description = ("DP-SGD adaptation (Opacus, Poisson sampling, per-record clipping, AdamW) of all weights, "
                   "the output head or LoRA adapters, with (epsilon, delta) accounted by RDP and PRV; "
                   "epsilon: inf trains the same method without DP.")
    params = PARAMS

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        if self.method == "prefix":
            raise ConfigError(PREFIX_UNSUPPORTED)
        self._ledger: DPLedger | None = None
        self._report: dict = {}

    @property
    def private(self) -> bool:
        return self.noise_multiplier is not None or math.isfinite(self.epsilon)

    def _train_kw(self, ctx: TrainContext, desc: str) -> dict:
        return dict(pad_id=ctx.pad_id, epsilon=self.epsilon, delta=self.delta, clip=self.clip, epochs=self.epochs,
                    lr=self.lr if self.lr is not None else DEFAULT_LR[self.method], batch_size=self.batch_size,
                    seed=ctx.seed, weight_decay=self.weight_decay, noise_multiplier=self.noise_multiplier,
                    accountant=self.accountant, grad_sample_mode=self.grad_sample_mode, device=ctx.device,
                    desc=desc, progress=ctx.progress)

    def adapt(self, model, data, ctx: TrainContext):
        desc = f"adapt: dp_adapt {self.method} eps={self.epsilon}"
        seqs = ctx.encode(data.texts, self.chunk_length)
        total = sum(p.numel() for p in model.parameters())
        if self.method == "full":
            for p in model.parameters():
                p.requires_grad_(True)
            trainable = total
            report = dp_train(model, seqs, **self._train_kw(ctx, desc))
            out = model
        elif self.method == "head":
            head = model.get_output_embeddings()
            if head is None:
                raise ConfigError(f"{desc}: the model has no output embedding to fine-tune: use method full or lora")
            for p in model.parameters():
                p.requires_grad_(False)
            for p in head.parameters():
                p.requires_grad_(True)
            trainable = sum(p.numel() for p in head.parameters())
            try:
                report = dp_train(model, seqs, **self._train_kw(ctx, desc))
            finally:
                for p in model.parameters():
                    p.requires_grad_(True)
            out = model
        elif self.method == "lora":
            from peft import LoraConfig, get_peft_model
            cfg = LoraConfig(r=self.r, lora_alpha=self.alpha, lora_dropout=0.0, target_modules=list(self.target_modules),
                             task_type="CAUSAL_LM", bias="none")
            peft_model = get_peft_model(model, cfg)
            trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
            report = dp_train(peft_model, seqs, **self._train_kw(ctx, desc))
            out = peft_model.merge_and_unload()
            for p in out.parameters():
                p.requires_grad_(True)
        else:  # pragma: no cover - rejected in __init__
            raise ConfigError(PREFIX_UNSUPPORTED)
        self._ledger = report.pop("_ledger")
        self._report = {"method": self.method, "train": report, "trainable_params": trainable,
                        "total_params": total, "ledger": report["ledger"]}
        return out

    def guarantee(self) -> dict[str, Any] | None:
        base = {"name": "epsilon", "method": self.method, "clip": self.clip,
                "epsilon_target": self.epsilon if math.isfinite(self.epsilon) else "inf"}
        if self._ledger is None:
            if not self._report:
                return None  # nothing adapted yet
            return {**base, "value": math.inf, "delta": None, "accountant": None,
                    "note": "non-private run (epsilon: inf): no DP guarantee"}
        led = self._ledger
        return {**base, **led.to_dict(), "value": led.epsilon, "delta": led.delta, "accountant": led.accountant}


# ------------------------------------------------------------------------------------------ step cost
def measure_step_cost(spec_name: str = "nano", *, batch: int = 16, length: int = 128, steps: int = 12,
                      modes: tuple[str, ...] = ("hooks", "functorch", "vmap"), method: str = "full",
                      vocab: int = 8192, seed: int = 0) -> dict:
    """Seconds per optimizer step, non-private vs DP-SGD, on a random-init model of ``spec_name``.

    Fixed batches of ``batch`` records of ``length`` tokens (no Poisson sampling, so every
    step does the same work); the first two steps of each run are warm-up and not timed.
    """
    from opacus import PrivacyEngine
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    from bench.modeling import BUILTIN_SPECS

    spec = BUILTIN_SPECS[spec_name]
    cfg = GPTNeoXConfig(vocab_size=vocab, hidden_size=spec.hidden_size, num_hidden_layers=spec.num_layers,
                        num_attention_heads=spec.num_heads, intermediate_size=4 * spec.hidden_size,
                        max_position_embeddings=spec.context_length, rotary_pct=0.25, use_parallel_residual=True,
                        tie_word_embeddings=False)
    g = torch.Generator().manual_seed(seed)
    data = [torch.randint(0, vocab, (batch, length), generator=g) for _ in range(steps)]
    mask = torch.ones(batch, length, dtype=torch.long)

    def build():
        torch.manual_seed(seed)
        m = GPTNeoXForCausalLM(cfg)
        if method == "head":
            for p in m.parameters():
                p.requires_grad_(False)
            m.get_output_embeddings().weight.requires_grad_(True)
        elif method == "lora":
            from peft import LoraConfig, get_peft_model
            m = get_peft_model(m, LoraConfig(r=8, lora_alpha=16, target_modules=LORA_TARGETS, task_type="CAUSAL_LM"))
        return m.train()

    def run(m, opt, vg=None) -> float:
        times = []
        for ids in data:
            t0 = time.perf_counter()
            if vg is not None:
                vg.step(ids, mask)
            else:
                loss = record_losses(m(input_ids=ids, attention_mask=mask).logits, ids, mask).mean()
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t0)
        return sum(times[2:]) / len(times[2:])

    out: dict[str, Any] = {"spec": spec_name, "method": method, "batch": batch, "length": length,
                           "threads": torch.get_num_threads()}
    m = build()
    out["nonprivate_s"] = run(m, torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4))
    for mode in modes:
        m = build()
        opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4)
        hooks = vg = None
        if mode == "vmap":
            from opacus.optimizers import DPOptimizer
            opt = DPOptimizer(opt, noise_multiplier=1.0, max_grad_norm=0.1, expected_batch_size=batch)
            vg = _VmapGrads(m)
        else:
            loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(batch * 4, 1)),
                                                 batch_size=batch)
            hooks, opt, _ = PrivacyEngine().make_private(module=m, optimizer=opt, data_loader=loader,
                                                         noise_multiplier=1.0, max_grad_norm=0.1,
                                                         grad_sample_mode=mode, wrap_model=False)
        try:
            out[f"{mode}_s"] = run(m, opt, vg)
        except Exception as exc:  # record, do not hide, a mode that fails
            out[f"{mode}_s"] = None
            out[f"{mode}_error"] = f"{type(exc).__name__}: {exc}"
        if hooks is not None:
            hooks.cleanup()
        if out.get(f"{mode}_s"):
            out[f"{mode}_ratio"] = round(out[f"{mode}_s"] / out["nonprivate_s"], 3)
    return out


if __name__ == "__main__":  # python -m defenses.dp [spec] [method]
    import json
    import sys
    print(json.dumps(measure_step_cost(sys.argv[1] if len(sys.argv) > 1 else "nano",
                                       method=sys.argv[2] if len(sys.argv) > 2 else "full"), indent=1))
