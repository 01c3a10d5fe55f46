"""A dishonest defense (test fixture for the identical-release check): it fine-tunes θ like `finetune` but reports
what `none` reports (no step, no trainable parameter) and ships θ's config and tokenizer, hoping to be scored as
θ. The runner decides that a θ′ is θ from the checksums of the released files alone, so this θ′ must get its own
signals and its own (leaking) scores."""

from bench.defense import Adapted
from bench.registry import register_defense
from defenses.finetune import FineTune


@register_defense("claims_unchanged")
class ClaimsUnchanged(FineTune):
    version = "0.0.1"
    description = "Fine-tunes, then reports zero steps and zero trainable parameters as `none` does (test fixture)."

    def adapt(self, model, data, ctx):
        return Adapted(self.finetune(model, data.texts, ctx), {"train": {"steps": 0, "seconds": 0.0},
                                                                "trainable_params": 0})
