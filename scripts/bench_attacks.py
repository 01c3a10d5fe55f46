"""Cost of the attack battery relative to the forward passes it cannot avoid, on one smoke-sized world.

(a) forward: the token signals of every target under θ' (adapted), θ (pretrained) and the attacker's reference
    model, computed once into an empty signal cache — the passes any membership audit needs.
(b) battery: every signal-only attack (loss, zlib, min_k with a K sweep, min_k_pp, reference) over every game,
    through the real path (Challenger.view → run_attack → RestrictedModel → signal cache), given (a).
(c) extra: each attack that needs forward passes of its own (lowercase: lowercased texts; recall / con_recall:
    prefixed texts and generation; rmia: shadow models and the population sample Z; self_prompt: generation and
    a fine-tune), timed separately over every game, with its own passes counted against it.

Reports (a), (b), (a+b)/a (goal ≤ 1.2) and each extra attack's cost as a multiple of (a). Not a test: run it on
an otherwise idle machine and record its output in docs/benchmarks.md.

    python scripts/bench_attacks.py                     # the smoke world, one defense (finetune)
    python scripts/bench_attacks.py --no-extra          # (a) and (b) only
    python scripts/bench_attacks.py --cache DIR         # reuse trained models from an artifact cache
    python scripts/bench_attacks.py --extra self_prompt # time one attack with passes of its own
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from bench.artifacts import ensure_adapted, ensure_pretrained, ensure_reference, ensure_tokenizer
from bench.attack import run_attack
from bench.cache import ArtifactCache, default_cache_dir
from bench.device import set_threads
from bench.game import GAMES, Challenger, ShadowSet
from bench.lm import HFLanguageModel, SignalCache
from bench.modeling import load_model, resolve_spec
from bench.registry import ATTACKS, DEFENSES, TASKS

SIGNAL_ATTACKS = [("loss", {}), ("zlib", {}), ("min_k", {"k": 0.05}), ("min_k", {"k": 0.1}), ("min_k", {"k": 0.2}),
                  ("min_k", {"k": 0.5}), ("min_k_pp", {}), ("reference", {})]
EXTRA_ATTACKS = [("lowercase", {}), ("recall", {}), ("con_recall", {}), ("rmia", {}), ("self_prompt", {})]


def build_world(cache: ArtifactCache, device: torch.device):
    """θ, θ' (finetune) and the attacker's reference of the smoke suite's world (trained or taken from the cache)."""
    data = TASKS.create("mini_pile", {"max_chars_per_source": 1_500_000}).build(cache)
    spec = resolve_spec("nano", {"pretrain_tokens": 250000, "reference_tokens": 120000})
    ch = Challenger(data, {"n_per_group": 60, "n_null": 500, "adapt_background": 60}, 0)
    tok = ensure_tokenizer(cache, spec, data)
    base = ensure_pretrained(cache, spec, data, tok, ch.pretraining_inserts(), 0, device, progress=False)
    n_z, k, m = 300, 2, 180                                      # the runner's population split (suite defaults)
    pop = list(data.population)
    split = {"z": tuple(pop[:n_z]), "shadow": [tuple(pop[n_z + i * m: n_z + (i + 1) * m]) for i in range(k)],
             "reference": tuple(pop[n_z + k * m:])}
    ref = ensure_reference(cache, spec, data, tok, device, progress=False, texts=split["reference"])
    defense = DEFENSES.create("finetune", {})
    adapted = ensure_adapted(cache, spec, base, defense, ch.adaptation_data(), 0, device, progress=False)[:2]
    return data, spec, ch, base, ref, adapted, defense, split


def lm_of(path_key, spec, device, signals: SignalCache) -> HFLanguageModel:
    model, tok = load_model(path_key[0], device=device)
    return HFLanguageModel(model, tok, fingerprint=path_key[1], max_length=spec.context_length,
                           batch_size=spec.score_batch_size, device=device, cache=signals)


def run_battery(ch, attacks, theta, theta_p, reference, population, shadows=None, trainers=None) -> dict:
    """Seconds per attack label over all seven games, through Challenger.view and run_attack."""
    out = {}
    for name, params in attacks:
        attack = ATTACKS.create(name, params)
        label = name + ("(" + ", ".join(f"{k}={v}" for k, v in params.items()) + ")" if params else "")
        t0 = time.perf_counter()
        for game in GAMES.values():
            inst = ch.instance(game)
            run_attack(attack, ch.view(inst, requires=attack.requires, pretrained=theta, adapted=theta_p,
                                       reference=reference, population=population, attack_name=label,
                                       shadows=shadows, trainers=trainers))
        out[label] = time.perf_counter() - t0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", default=str(default_cache_dir()), help="artifact cache for the trained models")
    ap.add_argument("--no-extra", action="store_true", help="skip the attacks with forward passes of their own")
    ap.add_argument("--profile", action="store_true", help="cProfile the signal-only battery (top 15 by cumtime)")
    ap.add_argument("--extra", nargs="*", default=[name for name, _ in EXTRA_ATTACKS],
                    help="which attacks with passes of their own to time (default: all)")
    args = ap.parse_args()
    set_threads()
    device = torch.device("cpu")
    print(json.dumps({"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                      "torch": torch.__version__, "threads": torch.get_num_threads()}), flush=True)
    cache = ArtifactCache(Path(args.cache))
    t0 = time.perf_counter()
    data, spec, ch, base, ref, adapted, defense, split = build_world(cache, device)
    print(json.dumps({"world_ready_s": round(time.perf_counter() - t0, 1), "targets": len(ch.target_texts())}),
          flush=True)

    signals = SignalCache(None)                                  # empty, in memory: (a) really computes
    theta, theta_p, reference = (lm_of(x, spec, device, signals) for x in (base, adapted, ref))
    targets = ch.target_texts()
    t0 = time.perf_counter()
    for lm in (theta_p, theta, reference):
        lm.token_signals(targets)
    forward = time.perf_counter() - t0
    n_tok = sum(s.n_tokens + 1 for s in theta.token_signals(targets)) * 3
    print(json.dumps({"a_forward_s": round(forward, 3), "texts": 3 * len(targets), "tokens": n_tok}), flush=True)

    if args.profile:
        import cProfile
        import pstats
        prof = cProfile.Profile()
        prof.enable()
    per_attack = run_battery(ch, SIGNAL_ATTACKS, theta, theta_p, reference, data.population)
    if args.profile:
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(15)
    battery = sum(per_attack.values())
    print(json.dumps({"b_battery_s": round(battery, 3), "evaluations": len(SIGNAL_ATTACKS) * len(GAMES),
                      "per_attack_s": {k: round(v, 4) for k, v in per_attack.items()},
                      "ratio_(a+b)/a": round((forward + battery) / forward, 3)}), flush=True)
    if args.no_extra:
        return

    from functools import partial

    from bench.attacker_models import make_trainer
    from bench.keys import shadow_seed
    shadow_sets = {}                                             # as bench/world.py Worlds builds them
    t0 = time.perf_counter()
    for which, start in (("base", base), ("reference", ref)):
        models = []
        for i, texts in enumerate(split["shadow"]):
            from bench.game import AdaptationData
            path_key = ensure_adapted(cache, spec, start, defense, AdaptationData(texts), shadow_seed(i), device,
                                      progress=False)[:2]
            models.append(lm_of(path_key, spec, device, signals))
        shadow_sets[which] = ShadowSet(tuple(models), tuple(split["shadow"]), split["z"], which)
    shadow_sets["pretrain"] = ShadowSet((reference,), (split["reference"],), split["z"], "attacker reference")
    print(json.dumps({"shadows_ready_s": round(time.perf_counter() - t0, 1)}), flush=True)
    trainers = {"base": partial(make_trainer, cache, spec, base, "released θ", device, signals),
                "reference": partial(make_trainer, cache, spec, ref, "attacker reference", device, signals)}
    extra = dict(EXTRA_ATTACKS)
    for name, params in [(n, extra[n]) for n in args.extra if n in extra]:   # in the order asked
        secs = run_battery(ch, [(name, params)], theta, theta_p, reference, data.population, shadow_sets, trainers)
        again = run_battery(ch, [(name, params)], theta, theta_p, reference, data.population, shadow_sets, trainers)
        print(json.dumps({"attack": name, "first_s": round(secs[name], 2), "x_forward": round(secs[name] / forward, 2),
                          "cached_rerun_s": round(again[name], 3)}), flush=True)


if __name__ == "__main__":
    main()
