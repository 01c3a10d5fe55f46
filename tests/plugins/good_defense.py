"""A well-behaved submitted defense: fine-tuning with a smaller learning rate (test fixture)."""

from bench.defense import Adapted, Defense, TrainContext
from bench.params import Param
from bench.registry import register_defense
from bench.training import train_causal_lm


@register_defense("gentle_finetune")
class GentleFineTune(Defense):
    """Fine-tune for one epoch at a low learning rate: leaks less than the default recipe, learns less."""

    version = "0.1.0"
    description = "Full fine-tuning, one epoch at lr 5e-4 (test fixture)."
    params = (Param("epochs", float, 1.0, "passes over the adaptation data", low=0.0, low_inclusive=False),
              Param("lr", float, 5e-4, "AdamW learning rate", low=0.0, low_inclusive=False))

    def adapt(self, model, data, ctx: TrainContext):
        stats = train_causal_lm(model, ctx.encode(data.texts, 64), epochs=self.epochs, lr=self.lr, batch_size=8,
                                seed=ctx.seed, pad_id=ctx.pad_id, device=ctx.device, progress=False)
        return Adapted(model, {"train": stats.to_dict()})
