"""Every content key of a run, defined once: the plan names its jobs by these keys and the jobs store their rows
under the keys they are handed, so what the plan marks done is exactly what the store and the caches hold.

Model artifacts have their own keys (bench/artifacts.py: ``pretrained_key``, ``adapted_key``, ...). A model is
*scored* under a fingerprint derived here from its artifact key and the scoring settings; the runner loads every
model with exactly that fingerprint, so the signal cache, the plan and the evaluation keys agree without loading a
model to find out.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench.hashing import content_hash, module_hash, text_hash

#: shadow ``i`` of a world trains with seed ``SHADOW_SEED_BASE + i`` (never a world seed of a suite)
SHADOW_SEED_BASE = 10_000


def shadow_seed(i: int) -> int:
    """The training seed of the attacker's shadow model ``i``."""
    return SHADOW_SEED_BASE + i


def scoring_fingerprint(artifact_key: str, *, max_length: int, bf16: bool) -> str:
    """The fingerprint a model is scored under: its artifact and the settings that change its signals.

    The tokenizer's BOS handling is a property of the artifact, so the artifact key covers it; the scoring code's
    own hash is included so a change to how signals are computed never reuses stale ones. The compiled signal kernel
    (``PRIVBENCH_COMPILE=1``) rounds differently from the eager one (within 1e-5), so its signals get a fingerprint
    of their own; the eager fingerprint is the one it always was."""
    from bench.logit_stats import compile_enabled
    settings = {"model": artifact_key, "max_length": max_length, "bf16": bool(bf16),
                "code": module_hash("bench.lm", "bench.signals", "bench.logit_stats")}
    if compile_enabled():
        settings["compiled"] = True
    return content_hash(settings)


def data_key(task_name: str, task_key: str, data_fingerprint: str) -> str:
    return content_hash("data", task_name, task_key, data_fingerprint)


def signals_key(fingerprint: str, texts: Sequence[str]) -> str:
    """A model's signals on a world's warm-up texts (targets, samples, held-out)."""
    return content_hash("signals", fingerprint, [text_hash(x) for x in texts])


def utility_key(artifact_key: str, n_texts: int) -> str:
    """A model's held-out utility row."""
    return content_hash(artifact_key, "heldout", n_texts)


def ood_utility_key(artifact_key: str, label: str, n_texts: int) -> str:
    """A model's out-of-domain utility row."""
    return content_hash(artifact_key, "ood", label, n_texts)


def match_key(defense_key: str, theta_key: str, match: dict, seed: int) -> str:
    """The row of a matched-utility defense's tuning (the value chosen and the loss it reached)."""
    return content_hash(defense_key, theta_key, "match", match, seed)


def retained_key(task: str, model: str, seed: int, defense: str, base: float, finetune: float, value: float) -> str:
    return content_hash("retained", task, model, seed, defense, base, finetune, value)


def eval_key(world_key: str, theta_fp: str, theta_p_fp: str, reference_fp: str | None, defense_label: str,
             defense_key: str, game: str, attack_label: str, attack_key: str, metrics: dict) -> str:
    """An evaluation's content key: world, every model's scoring fingerprint, defense, game, attack, metric
    settings."""
    return content_hash(world_key, theta_fp, theta_p_fp, reference_fp, defense_label, defense_key, game,
                        attack_label, attack_key, metrics)
