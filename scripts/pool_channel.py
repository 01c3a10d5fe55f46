"""How well a defense that rebuilds a task's public pools can pick the inserted targets out of D̃.

For each world (a task and the world sizes of a shipped suite) and each of ``--seeds`` secret draws, two dishonest
rules score every record of D̃ as "an inserted target", and the AUC of that score against the truth is printed:

* ``partition``: the record lies in the task's public target partition (tests/plugins/pool_filter_defense.py);
* ``coverage``: the share of its document's records that D̃ holds (a side sampled more densely stands out).

Both are printed for the pooled draw (bench/pools.py) and, for ``partition``, for the draw it replaced (background
from the adaptation partition, targets from the target partition), where the rule is exact. 0.5 is chance.

Unit tasks (the users and secrets tracks' worlds) are scored per record of D̃ by the unit-level rules:

* ``partition``: the record lies outside the task's public adaptation partition (for users, the plugin
  ``user_pool_filter`` of tests/plugins/pool_filter_defense.py);
* ``unit size``: how many records of D̃ its unit (owner, or secret carried) has there.

User worlds draw their target and background users from one pool of users (bench.pools.split_user_pool); secret
worlds still draw from the task's partitions, where the partition rule is exact (docs/submitting.md, "Still open").

    python scripts/pool_channel.py --seeds 100
    python scripts/pool_channel.py --seeds 100 --only users,secrets   # the unit worlds alone
    python scripts/pool_channel.py --end-to-end     # the plugin trained and attacked, both draws (about 5 min)

The AUC of one world varies (a world holds few documents: the code pools are 35 files), so the mean over worlds,
with its standard error, is what says whether a rule finds targets: a defense cannot tell in which worlds it is lucky.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections import Counter

import numpy as np

from bench.game import Challenger
from bench.metrics import roc_auc
from tasks.splits import make_task

WORLDS = {
    "quick (mini_pile wiki)": ("mini_pile", {"adapt_domain": "wiki"},
                               {"n_per_group": 100, "n_null": 400, "adapt_background": 200}),
    "dp, guard (mini_pile wiki)": ("mini_pile", {"adapt_domain": "wiki"},
                                   {"n_per_group": 60, "n_null": 400, "adapt_background": 200}),
    "smoke (mini_pile wiki, 1.5M)": ("mini_pile", {"adapt_domain": "wiki", "max_chars_per_source": 1_500_000},
                                     {"n_per_group": 60, "n_null": 400, "adapt_background": 60}),
    "iid_ood: iid-code": ("pile_subset", {"subset": "code", "relation": "iid",
                                          "pretrain_sources": ["stdlib_code", "shakespeare"]},
                          {"n_per_group": 50, "n_null": 200, "adapt_background": 100}),
    "iid_ood: ood-wiki": ("pile_subset", {"subset": "wiki", "relation": "ood",
                                          "pretrain_sources": ["stdlib_code", "shakespeare"]},
                          {"n_per_group": 50, "n_null": 200, "adapt_background": 100}),
}


UNIT_WORLDS = {
    "users (synthetic_users)": ("synthetic_users", {"n_users": 950, "docs_median": 4.0, "max_docs": 12,
                                                    "attacker_fraction": 0.2, "canary_users": 20, "canary_length": 10,
                                                    "adapt_domain": "wiki"},
                                {"n_per_group": 40, "n_null": 400, "adapt_background": 150,
                                 "background_in_pretraining": "matched"}),
    "secrets (secrets)": ("secrets", {"n_secrets": 520, "secret_kind": "mixed", "records_per_secret_min": 2,
                                      "records_per_secret_max": 3, "adapt_domain": "wiki"},
                          {"n_per_group": 30, "n_null": 400, "adapt_background": 200,
                           "background_in_pretraining": "matched"}),
}


def unit_exploit_aucs(data, world: dict, seeds: range) -> dict[str, list[float]]:
    """The unit-level rules on a user or secret world, under the world's own draw and under the task's partitions."""
    public_background = frozenset(data.adapt)
    out: dict[str, list[float]] = {"partition": [], "unit size": [], "partition, old draw": []}
    for seed in seeds:
        secret = f"pool-channel-{seed}"
        for name, w in (("", world), (", old draw", {**world, "pool_draw": "partition"})):
            ch = Challenger(data, w, seed, secret=secret)
            d = ch.adaptation_data()
            inserted = set(ch.members("b"))
            y = np.array([t in inserted for t in d.texts], dtype=int)
            out["partition" + name].append(roc_auc(y, np.array([float(t not in public_background) for t in d.texts])))
            if not name:
                keys = d.users if d.users is not None else [s[0] if s else "" for s in d.secrets]
                size = Counter(keys)
                out["unit size"].append(roc_auc(y, np.array([float(size[k]) for k in keys])))
    return out


def exploit_aucs(data, world: dict, seeds: range) -> dict[str, list[float]]:
    docs = {r.text: d for r, d in zip(data.targets, data.target_docs)}
    docs.update(zip(data.adapt, data.adapt_docs))
    size = Counter(docs.values())
    partition = {r.text for r in data.targets}
    unpooled = dataclasses.replace(data, adapt_docs=None, target_docs=None)
    out: dict[str, list[float]] = {"partition": [], "coverage": [], "partition, old draw": []}
    for seed in seeds:
        secret = f"pool-channel-{seed}"
        for name, d in (("", data), (", old draw", unpooled)):
            ch = Challenger(d, world, seed, secret=secret)
            texts = ch.adaptation_data().texts
            inserted = set(ch.members("b"))
            y = np.array([t in inserted for t in texts], dtype=int)
            out["partition" + name].append(roc_auc(y, np.array([float(t in partition) for t in texts])))
            if not name:
                seen = Counter(docs[t] for t in texts)
                out["coverage"].append(roc_auc(y, np.array([seen[docs[t]] / size[docs[t]] for t in texts])))
    return out


def end_to_end(workdir: str, seed: int) -> None:
    """Train and attack ``none``, ``finetune`` and the dishonest ``pool_filter`` plugin in the dp/guard world, under
    the pooled draw and under the draw it replaced (``pool_draw: partition``), with a secret draw: adapt-game AUC
    per attack and held-out loss per defense."""
    import sys
    from pathlib import Path

    from bench.cache import ArtifactCache
    from bench.runner import Runner
    from bench.store import Store
    from bench.suite import parse_suite

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "plugins"))
    import pool_filter_defense  # noqa: F401  (registers the plugin "pool_filter")

    root = Path(workdir)
    root.mkdir(parents=True, exist_ok=True)
    cache = ArtifactCache(root / "cache")
    print(f"{'draw':10s} {'defense':12s} {'adapt AUC: loss':>16s} {'min_k':>7s} {'null: loss':>11s} "
          f"{'held-out loss':>14s} {'D~ records kept':>16s}")
    for draw in ("pooled", "partition"):
        raw = {"name": f"pool-channel-{draw}", "seeds": [seed],
               "tasks": [{"name": "mini_pile", "label": "wiki", "params": {"adapt_domain": "wiki"}}],
               "models": [{"name": "nano", "params": {"pretrain_tokens": 250000, "reference_tokens": 120000}}],
               "defenses": ["none", "finetune", "pool_filter"], "attacks": ["loss", "min_k"],
               "games": ["adapt", "null"], "reference": False, "metrics": {"n_boot": 200},
               "utility": {"n_heldout": 200},
               "world": {"n_per_group": 60, "n_null": 400, "adapt_background": 200, "pool_draw": draw}}
        store = Store(f"sqlite:///{root / (draw + '.db')}")
        run = Runner(parse_suite(raw), store, cache, quiet=True, draw_secret=f"pool-channel-{seed}").run()
        auc = {(r["defense"], r["game"], r["attack"]): r["value"] for r in store.metric_rows(run.run_id)
               if r["metric"] == "auc"}
        loss = {r["defense"]: r["value"] for r in store.utility_rows(run.run_id)
                if r["role"] == "adapted" and r["dataset"] == "heldout" and r["metric"] == "loss"}
        kept = pool_filter_defense.drop_public_targets
        pool = pool_filter_defense.public_target_pool("mini_pile", {"adapt_domain": "wiki"})
        world = raw["world"]
        data = next(iter(parse_suite(raw).tasks)).instance.build(cache)
        texts = Challenger(data, world, seed, secret=f"pool-channel-{seed}").adaptation_data().texts
        share = len(kept(texts, pool)) / len(texts)
        for d in ("none", "finetune", "pool_filter"):
            print(f"{draw:10s} {d:12s} {auc[(d, 'adapt', 'loss')]:16.3f} {auc[(d, 'adapt', 'min_k')]:7.3f} "
                  f"{auc[(d, 'null', 'loss')]:11.3f} {loss.get(d, float('nan')):14.3f} "
                  f"{share if d == 'pool_filter' else 1.0:16.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=100, help="secret draws per world")
    parser.add_argument("--end-to-end", action="store_true", help="train and attack the dishonest plugin instead")
    parser.add_argument("--workdir", default="/tmp/privbench-pool-channel", help="cache and databases of --end-to-end")
    parser.add_argument("--seed", type=int, default=0, help="the world seed of --end-to-end")
    parser.add_argument("--only", default="", help="comma-separated words; keep the worlds whose label has one")
    args = parser.parse_args()
    if args.end_to_end:
        end_to_end(args.workdir, args.seed)
        return
    print(f"{'world':30s} {'rule':22s} {'mean AUC':>9s} {'se':>6s} {'sd':>6s} {'min':>6s} {'max':>6s}")
    worlds = [(label, spec, exploit_aucs) for label, spec in WORLDS.items()]
    worlds += [(label, spec, unit_exploit_aucs) for label, spec in UNIT_WORLDS.items()]
    words = [w for w in args.only.split(",") if w]
    for label, (task, params, world), rules in worlds:
        if words and not any(w in label for w in words):
            continue
        data = make_task(task, params).build()
        for rule, aucs in rules(data, world, range(args.seeds)).items():
            a = np.array(aucs)
            se = a.std(ddof=1) / np.sqrt(len(a)) if len(a) > 1 else float("nan")
            print(f"{label:30s} {rule:22s} {a.mean():9.3f} {se:6.3f} {a.std():6.3f} {a.min():6.3f} {a.max():6.3f}")


if __name__ == "__main__":
    main()
