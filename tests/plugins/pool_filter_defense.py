"""A dishonest defense (test fixture): it rebuilds the task from its public code and sources, drops every record
of D̃ that lies in the task's public target partition, and fine-tunes on the rest. Against a world that took D's
background from the adaptation partition and its targets from the target partition, that drops exactly the
inserted targets: membership games then read as if nothing had been trained on them, while utility stays near the
fine-tune's. A world that draws both from one pool split by document under its own salt (bench/pools.py) leaves it
dropping targets and background alike."""

from __future__ import annotations

import dataclasses

from bench.params import Param
from bench.registry import register_defense
from defenses.finetune import FineTune
from tasks.splits import make_task


def public_target_pool(task: str, params: dict) -> frozenset[str]:
    """The texts of the task's target partition, rebuilt as anyone can rebuild them."""
    return frozenset(r.text for r in make_task(task, params).build().targets)


def drop_public_targets(texts, pool: frozenset[str]) -> list[str]:
    return [t for t in texts if t not in pool]


@register_defense("pool_filter")
class PoolFilter(FineTune):
    """Fine-tunes on D̃ minus the task's public target partition."""

    version = "0.1.0"
    description = "Drops D̃'s records that lie in the task's public target pool, then fine-tunes (test fixture)."
    params = FineTune.params + (
        Param("adapt_domain", str, "wiki", "the mini_pile task to rebuild", nullable=True),
    )

    def adapt(self, model, data, ctx):
        task_params = {} if self.adapt_domain is None else {"adapt_domain": self.adapt_domain}
        kept = drop_public_targets(data.texts, public_target_pool("mini_pile", task_params))
        return super().adapt(model, dataclasses.replace(data, texts=tuple(kept)), ctx)


def public_adaptation_partition(task: str, params: dict) -> frozenset[str]:
    """The texts of a user task's public adaptation partition: its background users' documents."""
    return frozenset(make_task(task, params).build().adapt)


def keep_public_background(texts, background: frozenset[str]) -> list[str]:
    """The user-task rule: under the task's own partitions D's background is the adaptation partition's head, so
    every record of D̃ outside that partition belongs to a target user with b = 1."""
    return [t for t in texts if t in background]


@register_defense("user_pool_filter")
class UserPoolFilter(FineTune):
    """Fine-tunes on the records of D̃ that lie in the user task's public adaptation partition."""

    version = "0.1.0"
    description = ("Keeps D̃'s records from the user task's public adaptation partition (drops every other user), "
                   "then fine-tunes (test fixture).")
    params = FineTune.params + (
        Param("task_params", str, "{}", "parameters of the synthetic_users task to rebuild, as a JSON object"),
    )

    def adapt(self, model, data, ctx):
        import json
        task_params = json.loads(self.task_params)
        kept = keep_public_background(data.texts, public_adaptation_partition("synthetic_users", task_params))
        if not kept:
            kept = list(data.texts[:1])
        return super().adapt(model, dataclasses.replace(data, texts=tuple(kept), users=None), ctx)
