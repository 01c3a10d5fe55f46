"""privbench's LanguageModel as an lm-evaluation-harness model.

Any released model — a merged checkpoint, a prefix-tuned adapter, an aggregate of several models
(NAF) — is a :class:`bench.lm.LanguageModel`; registering that one API with lm-eval lets its task
library score every defense's utility the same way (local YAML tasks offline; the standard tasks
where the hub is reachable). ``lm_eval --model privbench --model_args path=DIR`` loads a Hugging Face
directory; :func:`evaluate` takes a LanguageModel object directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from bench.lm import LanguageModel


def _rolling_chunks(lm: LanguageModel, text: str, chunk_tokens: int) -> list[tuple[str, str]]:
    """(prefix, chunk) pairs covering ``text``: every token is scored once, with the text before it as context."""
    out, done, rest = [], "", text
    while rest:
        head, rest = lm.split_at_token(rest, chunk_tokens)
        if not head:  # a tokenizer that cannot split further: score the remainder whole
            head, rest = rest, ""
        out.append((done, head))
        done += head
    return out


@register_model("privbench")
class PrivbenchLM(LM):
    """lm-eval's three request types answered from privbench's per-token signals and greedy generation.

    Conditional log-likelihood scores the continuation's tokens with the context as prefix
    (``token_signals(..., prefix=context)``: context and continuation are tokenised separately,
    so a token never straddles them). Rolling log-likelihood cuts a long document into chunks that fit
    the context window with room for the preceding text, as lm-eval's rolling windows do.
    """

    def __init__(self, model: LanguageModel | None = None, *, max_length: int = 128, **kwargs: Any) -> None:
        super().__init__()
        if model is None:
            raise ValueError("PrivbenchLM needs a privbench LanguageModel, or `path=DIR` via --model_args")
        self.model = model
        self.max_length = int(getattr(model, "max_length", max_length))

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> PrivbenchLM:
        from bench.lm import HFLanguageModel
        from bench.modeling import load_model
        args = dict(kv.split("=", 1) for kv in arg_string.split(",") if kv)
        if "path" not in args:
            raise ValueError("--model_args must name the model directory: path=DIR")
        path = Path(args["path"])
        model, tok = load_model(path)
        max_length = int(args.get("max_length", getattr(model.config, "max_position_embeddings", 128)))
        lm = HFLanguageModel(model, tok, fingerprint=f"lm-eval:{path.resolve()}", max_length=max_length,
                             batch_size=int(args.get("batch_size", 16)), cache=None, progress=False)
        return cls(lm, max_length=max_length)

    # -- the three request types --------------------------------------------------------------------
    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        out = []
        for req in requests:
            context, continuation = req.args
            sig = self.model.token_signals([continuation], prefix=context)[0]
            out.append((float(sig.logprobs.astype(np.float64).sum()), bool(sig.top1.all())))
        return out

    def loglikelihood_rolling(self, requests) -> list[float]:
        chunk = max(1, (3 * self.max_length) // 4 - 1)
        out = []
        for req in requests:
            (text,) = req.args[:1]
            total = 0.0
            for prefix, piece in _rolling_chunks(self.model, text, chunk):
                sig = self.model.token_signals([piece], prefix=prefix if prefix else None)[0]
                total += float(sig.logprobs.astype(np.float64).sum())
            out.append(total)
        return out

    def generate_until(self, requests) -> list[str]:
        out = []
        for req in requests:
            context, gen_kwargs = req.args
            gen_kwargs = dict(gen_kwargs or {})
            until: Sequence[str] = gen_kwargs.get("until") or []
            if isinstance(until, str):
                until = [until]
            text = self.model.generate([context], int(gen_kwargs.get("max_gen_toks", 32)))[0]
            cut = min((text.find(s) for s in until if s and s in text), default=-1)
            out.append(text[:cut] if cut >= 0 else text)
        return out


def evaluate(model: LanguageModel, tasks: list[str], *, include_path: str | Path | None = None,
             limit: int | None = None) -> dict:
    """Run lm-eval tasks on a privbench LanguageModel; returns lm-eval's ``results`` mapping per task."""
    import lm_eval
    from lm_eval.tasks import TaskManager
    manager = TaskManager(include_path=str(include_path)) if include_path else TaskManager()
    res = lm_eval.simple_evaluate(model=PrivbenchLM(model), tasks=tasks, task_manager=manager, limit=limit,
                                  bootstrap_iters=0)
    return res["results"]
