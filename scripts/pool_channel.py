"""How well a defense that rebuilds a task's public pools can pick the inserted targets out of D̃.

For each world (a task and the world sizes of a shipped suite) and each of ``--seeds`` secret draws, two dishonest
rules score every record of D̃ as "an inserted target", and the AUC of that score against the truth is printed:

* ``partition``: the record lies in the task's public target partition (tests/plugins/pool_filter_defense.py);
* ``coverage``: the share of its document's records that D̃ holds (a side sampled more densely stands out).

Both are printed for the pooled draw (bench/pools.py) and, for ``partition``, for the draw it replaced (background
from the adaptation partition, targets from the target partition), where the rule is exact. 0.5 is chance.

    python scripts/pool_channel.py --seeds 100

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=100, help="secret draws per world")
    args = parser.parse_args()
    print(f"{'world':30s} {'rule':22s} {'mean AUC':>9s} {'se':>6s} {'sd':>6s} {'min':>6s} {'max':>6s}")
    for label, (task, params, world) in WORLDS.items():
        data = make_task(task, params).build()
        for rule, aucs in exploit_aucs(data, world, range(args.seeds)).items():
            a = np.array(aucs)
            se = a.std(ddof=1) / np.sqrt(len(a)) if len(a) > 1 else float("nan")
            print(f"{label:30s} {rule:22s} {a.mean():9.3f} {se:6.3f} {a.std():6.3f} {a.min():6.3f} {a.max():6.3f}")


if __name__ == "__main__":
    main()
