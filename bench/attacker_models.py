"""Models the attacker trains itself during an attack: a fine-tuned copy of its calibration model.

Self-prompt (Fu et al., 2024) fine-tunes a reference model on text the attacker chooses (generations of the
released model). The attacker owns the starting point — θ where the game releases it, else its own reference
model trained on population data — and the public training recipe, so privbench does the training for it
through a :class:`ReferenceTrainer` and caches the result by content (start model, texts, recipe, code), like
every other model artifact. The trainer holds its start model in a closure (as :class:`bench.lm.RestrictedModel`
does), never the released θ' nor any training data of the challenger.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from bench.cache import ArtifactCache
from bench.errors import ConfigError
from bench.hashing import CACHE_SCHEMA, content_hash, module_hash, text_hash
from bench.lm import TOKEN_LOGPROBS, HFLanguageModel, LanguageModel, RestrictedModel, SignalCache
from bench.modeling import ModelSpec

#: the code whose changes invalidate attacker-trained models
FINETUNE_CODE = ("bench.training", "bench.modeling", "bench.defense", "bench.attacker_models")


def finetune_key(start_key: str, texts: Sequence[str], *, epochs: float, lr: float, batch_size: int, seed: int,
                 spec: ModelSpec) -> str:
    """Content key of a fine-tuned copy: start model, the texts in order, the recipe and the training code."""
    return content_hash("attacker_finetune", CACHE_SCHEMA, module_hash(*FINETUNE_CODE), start_key,
                        [text_hash(t) for t in texts], float(epochs), float(lr), int(batch_size), int(seed),
                        spec.context_length, spec.autocast_bf16)


def ensure_finetuned(cache: ArtifactCache, spec: ModelSpec, start: tuple[Path | str, str], texts: Sequence[str], *,
                     epochs: float, lr: float, batch_size: int, seed: int, device: torch.device) -> tuple[Path, str]:
    """The start model fine-tuned on ``texts`` (full fine-tuning, AdamW + cosine schedule), built once per key."""
    from bench.defense import TrainContext
    from bench.modeling import load_model
    from bench.training import train_causal_lm

    texts = [t for t in texts if t]
    if not texts:
        raise ConfigError("attacker fine-tuning got no non-empty text: generate or choose at least one text")
    key = finetune_key(start[1], texts, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed, spec=spec)

    def build(tmp: Path) -> None:
        released = spec.source == "hf" and str(start[0]) == str(spec.hf_id)
        model, tok = load_model(start[0], revision=spec.revision if released else None, device=device,
                                gguf_file=spec.gguf_file if released else None)
        ctx = TrainContext(tok, device, spec.context_length, seed, spec.autocast_bf16, progress=False)
        stats = train_causal_lm(model, ctx.encode(texts), epochs=epochs, lr=lr, batch_size=batch_size, seed=seed,
                                pad_id=ctx.pad_id, autocast_bf16=spec.autocast_bf16, device=device,
                                desc="attacker fine-tune", progress=False)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "privbench.json").write_text(json.dumps({"train": stats.to_dict(), "n_texts": len(texts)}))

    return cache.get_or_build("attacker_finetune", key, build), key


class ReferenceTrainer:
    """What an attack with ``finetune_reference`` receives: ``finetune(texts, ...)`` → a scoring-only model.

    ``start`` says what is fine-tuned ("released θ" or "attacker reference"). Read-only; the start model and the
    cache live in a closure, not in attributes.
    """

    __slots__ = ("start", "_run", "_private", "__weakref__")

    def __init__(self, start: str, run: Callable[..., LanguageModel],
                 private: Callable[[], ReferenceTrainer] | None = None) -> None:
        object.__setattr__(self, "start", start)
        object.__setattr__(self, "_run", run)
        object.__setattr__(self, "_private", private)

    def __setattr__(self, name, value):
        raise AttributeError("the reference trainer is read-only")

    def finetune(self, texts: Sequence[str], *, epochs: float, lr: float, batch_size: int = 16,
                 seed: int = 0) -> LanguageModel:
        """A copy of the start model fine-tuned on ``texts``; it releases token log-probs only."""
        return self._run(list(texts), float(epochs), float(lr), int(batch_size), int(seed))

    def with_private_cache(self) -> ReferenceTrainer:
        """A trainer that trains into a throw-away cache of its own, so that whether a model was trained before
        (and how fast it comes back) says nothing of another game's calls; itself where it has no cache."""
        return self._private() if self._private is not None else self


def make_trainer(cache: ArtifactCache, spec: ModelSpec, start: tuple[Path | str, str], label: str,
                 device: torch.device, signals: SignalCache | None = None) -> ReferenceTrainer:
    """A :class:`ReferenceTrainer` fine-tuning ``start`` (path, key); its models score through ``signals``.

    The closure captures only the artifact cache, the public model spec, the start model's location, the device
    and the signal cache: nothing that leads to the runner, the challenger or the store.
    """
    def runner(into: ArtifactCache, scores: SignalCache | None) -> Callable[..., LanguageModel]:
        def run(texts, epochs, lr, batch_size, seed) -> LanguageModel:
            from bench.modeling import load_model
            path, key = ensure_finetuned(into, spec, start, texts, epochs=epochs, lr=lr, batch_size=batch_size,
                                         seed=seed, device=device)
            model, tok = load_model(path, device=device)
            lm = HFLanguageModel(model, tok, fingerprint=key, max_length=spec.context_length,
                                 batch_size=spec.score_batch_size, device=device, cache=scores)
            return RestrictedModel(lm, frozenset({TOKEN_LOGPROBS}), "self-trained reference")
        return run

    def private() -> ReferenceTrainer:
        import shutil
        import tempfile
        import weakref
        scratch = tempfile.mkdtemp(prefix="privbench-trainer-")
        trainer = ReferenceTrainer(label, runner(ArtifactCache(scratch), SignalCache(None)))
        weakref.finalize(trainer, shutil.rmtree, scratch, True)
        return trainer

    return ReferenceTrainer(label, runner(cache, signals), private)
