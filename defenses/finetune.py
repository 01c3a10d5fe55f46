"""Plain full fine-tuning: the undefended baseline every other defense is compared with."""

from __future__ import annotations

from bench.defense import Adapted, Defense, TrainContext
from bench.params import Param
from bench.registry import register_defense
from bench.training import train_causal_lm

ADAPT_PARAMS = (
    Param("epochs", float, 4.0, "passes over the adaptation data", low=0.0, low_inclusive=False),
    Param("lr", float, 2e-3, "AdamW learning rate", low=0.0, low_inclusive=False),
    Param("batch_size", int, 16, "records per step", low=1),
    Param("chunk_length", int, 128, "tokens per training record (longer records are truncated)", low=8),
    Param("weight_decay", float, 0.0, "AdamW weight decay", low=0.0),
)


@register_defense("finetune")
class FineTune(Defense):
    description = "Full fine-tuning of every weight with AdamW: the undefended baseline (no privacy protection)."
    params = ADAPT_PARAMS

    def adapt(self, model, data, ctx: TrainContext) -> Adapted:
        return Adapted(self.finetune(model, data.texts, ctx), self.training_report())

    def finetune(self, model, texts, ctx: TrainContext, desc: str = "adapt: finetune", **hooks):
        """The recipe on ``texts``; ``hooks`` go to :func:`train_causal_lm` (loss mask, clipping, early stop).

        Shared by the empirical mitigations (defenses/mitigations.py, dedup, goldfish); with no hooks it is
        the plain fine-tuning baseline exactly.
        """
        stats = train_causal_lm(model, ctx.encode(texts, self.chunk_length), epochs=self.epochs, lr=self.lr,
                                batch_size=self.batch_size, seed=ctx.seed, pad_id=ctx.pad_id,
                                weight_decay=self.weight_decay, autocast_bf16=ctx.autocast_bf16, device=ctx.device,
                                desc=desc, progress=ctx.progress, **hooks)
        self._report = {"train": stats.to_dict(), "trainable_params": sum(p.numel() for p in model.parameters())}
        return model
