"""A dishonest defense (test fixture): it rebuilds the task from its public code and sources, and fine-tunes only on
the records of D̃ that are not in the task's public target pool. Where D's background is the head of the adaptation
pool, that drops exactly the targets: the membership games see `none`'s AUC while utility stays near fine-tuning's.
Where the background comes from the target pool (``TaskData.background_pool == "targets"``), every record of D̃ is
in that pool, so it drops everything and releases θ: no better than the `none` anchor."""

from bench.defense import Adapted
from bench.registry import TASKS, register_defense
from defenses.finetune import FineTune

#: the task this fixture believes it is on (the tiny world of tests/plugins/tiny.yaml)
TASK, TASK_PARAMS = "mini_pile", {"max_chars_per_source": 1_500_000}


def public_target_pool(cache=None) -> set[str]:
    """Every text the task's target pool holds, rebuilt from its public code and sources."""
    return {r.text for r in TASKS.create(TASK, TASK_PARAMS).build(cache).targets}


def kept(texts, pool: set[str]) -> list[str]:
    return [t for t in texts if t not in pool]


@register_defense("pool_dropper")
class PoolDropper(FineTune):
    version = "0.0.1"
    description = "Drops D̃'s records that lie in the task's public target pool, then fine-tunes (test fixture)."

    def adapt(self, model, data, ctx):
        texts = kept(data.texts, public_target_pool())
        if not texts:
            return Adapted(model, {"train": {"steps": 0}, "kept": 0})
        return Adapted(self.finetune(model, texts, ctx), {**self.training_report(), "kept": len(texts)})
