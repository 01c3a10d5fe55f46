"""Model artifacts: tokenizer, pretrained θ, the attacker's reference, adapted θ'; each cached by content key."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from bench.cache import ArtifactCache
from bench.defense import Defense, TrainContext
from bench.game import AdaptationData
from bench.release import Release, save_release
from bench.hashing import CACHE_SCHEMA, content_hash, module_hash, text_hash

#: the code whose changes invalidate trained artifacts
TRAINING_CODE = ("bench.training", "bench.modeling", "bench.tokenizer", "bench.artifacts", "bench.defense")
from bench.modeling import ModelSpec, build_scratch_model, load_model
from bench.task import TaskData
from bench.tokenizer import train_bpe_tokenizer
from bench.training import train_causal_lm

from transformers.utils import logging as _hf_logging

_hf_logging.disable_progress_bar()  # weight loading/saving takes well under a second here

TOKENIZER_CHARS = 4_000_000  # characters of the pretraining partition the tokenizer learns from


def pretrain_fingerprint(data: TaskData) -> str:
    """Content hash of the pretraining corpus alone: tasks that share it share the tokenizer and base recipe."""
    import hashlib
    h = hashlib.sha256()
    for t in data.pretrain:
        h.update(t.encode("utf-8"))
        h.update(b"\x1e")
    return h.hexdigest()[:24]


def tokenizer_key(spec: ModelSpec, data: TaskData) -> str:
    return content_hash("tokenizer", CACHE_SCHEMA, module_hash("bench.tokenizer"), pretrain_fingerprint(data),
                        spec.vocab_size, TOKENIZER_CHARS)


# -- content keys: computable without building, so the plan (bench/plan.py) names every job by its artifact's key
def pretrained_key(spec: ModelSpec, data: TaskData, tok_key: str | None, inserts: list[str], seed: int) -> str:
    if spec.source == "hf":
        return content_hash("hf", spec.hf_id, spec.revision, spec.gguf_file)
    return content_hash("pretrained", CACHE_SCHEMA, module_hash(*TRAINING_CODE), spec.arch_dict(),
                        spec.pretrain_tokens, spec.pretrain_epochs,
                        spec.pretrain_lr, spec.pretrain_batch_size, spec.autocast_bf16, tok_key,
                        pretrain_fingerprint(data), sorted(text_hash(t) for t in inserts), seed)


def reference_key(spec: ModelSpec, tok_key: str, texts) -> str:
    return content_hash("reference", CACHE_SCHEMA, module_hash(*TRAINING_CODE), spec.arch_dict(),
                        spec.reference_tokens, spec.pretrain_epochs,
                        spec.pretrain_lr, spec.pretrain_batch_size, spec.autocast_bf16, tok_key,
                        [text_hash(t) for t in texts[:50_000]], len(texts))


def adapted_key(spec: ModelSpec, base_key: str, defense: Defense, data: AdaptationData, seed: int) -> str:
    return content_hash("adapted", CACHE_SCHEMA, module_hash(*TRAINING_CODE, type(defense).__module__,
                                                             *getattr(defense, "code_modules", ())), base_key,
                        defense.name, defense.version, defense.config,
                        *data.key_parts(), seed, spec.context_length, spec.autocast_bf16)


def ensure_tokenizer(cache: ArtifactCache, spec: ModelSpec, data: TaskData) -> tuple[Path, str]:
    """Byte-level BPE trained on the pretraining partition only (targets never shape the vocabulary)."""
    key = tokenizer_key(spec, data)

    def build(tmp: Path) -> None:
        def texts():
            n = 0
            for t in data.pretrain:
                yield t
                n += len(t)
                if n >= TOKENIZER_CHARS:
                    return
        train_bpe_tokenizer(texts(), tmp, vocab_size=spec.vocab_size)

    return cache.get_or_build("tokenizer", key, build), key


def _pack(tokenizer, texts, n_tokens: int, block: int) -> list[list[int]]:
    """Concatenate texts (BOS-separated) and cut into blocks of ``block`` tokens, up to ``n_tokens``."""
    bos = tokenizer.bos_token_id
    stream: list[int] = []
    for start in range(0, len(texts), 256):
        for ids in tokenizer(list(texts[start:start + 256]), add_special_tokens=False)["input_ids"]:
            stream.append(bos)
            stream.extend(ids)
        if len(stream) >= n_tokens:
            break
    stream = stream[:n_tokens]
    return [stream[i:i + block] for i in range(0, len(stream) - 1, block) if len(stream[i:i + block]) >= 2]


def _scratch_pretrain(tmp: Path, spec: ModelSpec, tok_dir: Path, corpus, inserts: list[str], n_tokens: int,
                      seed: int, device: torch.device, desc: str, progress: bool = True) -> None:
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tok_dir)
    model = build_scratch_model(spec, tok, seed).to(device)
    ctx = TrainContext(tok, device, spec.context_length, seed, spec.autocast_bf16)
    seqs = _pack(tok, corpus, n_tokens, spec.context_length) + ctx.encode(inserts)
    stats = train_causal_lm(model, seqs, epochs=spec.pretrain_epochs, lr=spec.pretrain_lr,
                            batch_size=spec.pretrain_batch_size, seed=seed, pad_id=ctx.pad_id, weight_decay=0.01,
                            autocast_bf16=spec.autocast_bf16, device=device, desc=desc, progress=progress)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "privbench.json").write_text(json.dumps({"train": stats.to_dict(), "n_inserted": len(inserts)}))


def ensure_pretrained(cache: ArtifactCache, spec: ModelSpec, data: TaskData, tok: tuple[Path, str],
                      inserts: list[str], seed: int, device: torch.device,
                      progress: bool = True) -> tuple[Path, str]:
    """θ: trained from scratch on S ∪ {a=1 targets}; or a released checkpoint for ``source: hf``."""
    if spec.source == "hf":
        return spec.hf_id, pretrained_key(spec, data, None, inserts, seed)
    key = pretrained_key(spec, data, tok[1], inserts, seed)
    path = cache.get_or_build("pretrained", key, lambda tmp: _scratch_pretrain(
        tmp, spec, tok[0], data.pretrain, inserts, spec.pretrain_tokens, seed, device,
        desc=f"pretrain {spec.name} seed {seed}", progress=progress))
    return path, key


def ensure_reference(cache: ArtifactCache, spec: ModelSpec, data: TaskData, tok: tuple[Path, str],
                     device: torch.device, progress: bool = True,
                     texts: tuple[str, ...] | None = None) -> tuple[Path, str]:
    """The attacker's reference model: the same public recipe, trained on attacker-owned population data."""
    texts = data.population if texts is None else texts
    key = reference_key(spec, tok[1], texts)
    path = cache.get_or_build("reference", key, lambda tmp: _scratch_pretrain(
        tmp, spec, tok[0], texts, [], spec.reference_tokens, 1_000_003, device,
        desc=f"reference {spec.name}", progress=progress))
    return path, key


def ensure_adapted(cache: ArtifactCache, spec: ModelSpec, base: tuple[Path | str, str], defense: Defense,
                   data: AdaptationData, seed: int, device: torch.device,
                   progress: bool = True) -> tuple[Path, str, dict]:
    """θ' = defense.adapt(θ, D̃): a plain Hugging Face checkpoint, or a :class:`Release` directory."""
    key = adapted_key(spec, base[1], defense, data, seed)

    def build(tmp: Path) -> None:
        released = spec.source == "hf" and str(base[0]) == str(spec.hf_id)
        model, tok = load_model(base[0], revision=spec.revision if released else None, device=device,
                                gguf_file=spec.gguf_file if released else None)
        ctx = TrainContext(tok, device, spec.context_length, seed, spec.autocast_bf16, progress=progress)
        torch.manual_seed(seed)
        adapted = defense.adapt(model, data, ctx)
        if isinstance(adapted, Release):  # an aggregate or an unmergeable adapter: saved by its own rules
            save_release(adapted, tmp)
        else:
            adapted.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "privbench.json").write_text(json.dumps({"report": defense.training_report(),
                                                        "guarantee": defense.guarantee()}, default=str))

    path = cache.get_or_build("adapted", key, build)
    meta = json.loads((path / "privbench.json").read_text())
    return path, key, meta
