"""What a defense gains by dropping the records of D̃ that θ knows best, with and without D's background in S.

The game keeps D's background out of S while the (1,1) targets are in both, so θ's memory of S marks them among
D̃ (docs/submitting.md, "Channels of the pools"). This trains and attacks ``none``, ``finetune`` and the fixture
``theta_dedup`` (tests/plugins/theta_dedup_defense.py: drop the share of D̃ with the lowest loss under θ, then
fine-tune), beside the same drop at random, in the dp/guard world with a secret draw, once per setting of world
``background_in_pretraining`` (``none``, the default, and ``matched``), and prints AUCs of the adapt, joint/seen and
null games, held-out loss and utility retained. (How the rule ranks targets against background, with θ an n-gram
model and with the S oracle: tests/test_fair_game.py.)

    python scripts/theta_memory_channel.py                    # about 4 minutes cold on 2 CPU cores
    python scripts/theta_memory_channel.py --drop-share 0.15  # a drop about the size of the (1,1) group
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.cache import ArtifactCache
from bench.runner import Runner
from bench.store import Store
from bench.suite import parse_suite

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "plugins"))
import theta_dedup_defense  # noqa: E402,F401  (registers the plugin "theta_dedup")


def suite(setting: str, seed: int, drop_share: float = 0.25) -> dict:
    return {"name": f"theta-memory-{setting}", "seeds": [seed],
            "tasks": [{"name": "mini_pile", "label": "wiki", "params": {"adapt_domain": "wiki"}}],
            "models": [{"name": "nano", "params": {"pretrain_tokens": 250000, "reference_tokens": 120000}}],
            "defenses": ["none", "finetune",
                         {"name": "theta_dedup", "label": "theta_dedup", "params": {"drop_share": drop_share}},
                         {"name": "theta_dedup", "label": "random_drop",
                          "params": {"drop_share": drop_share, "order": "random"}}],
            "attacks": ["loss", "min_k"], "games": ["adapt", "joint/seen", "null"],
            "reference": False, "metrics": {"n_boot": 200}, "utility": {"n_heldout": 200},
            "world": {"n_per_group": 60, "n_null": 400, "adapt_background": 200,
                      "background_in_pretraining": setting}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="/tmp/privbench-theta-memory", help="cache and databases")
    parser.add_argument("--seed", type=int, default=0, help="the world seed")
    parser.add_argument("--drop-share", type=float, default=0.25, help="share of D̃ both drops remove")
    args = parser.parse_args()
    root = Path(args.workdir)
    root.mkdir(parents=True, exist_ok=True)
    cache = ArtifactCache(root / "cache")
    secret = f"theta-memory-{args.seed}"
    print(f"{'background in S':16s} {'defense':18s} {'adapt: loss':>11s} {'min_k':>6s} {'seen: loss':>10s} "
          f"{'min_k':>6s} {'null: loss':>10s} {'held-out':>9s} {'retained':>8s}")
    for setting in ("none", "matched"):
        raw = suite(setting, args.seed, args.drop_share)
        store = Store(f"sqlite:///{root / f'{setting}-{args.drop_share}.db'}")
        run = Runner(parse_suite(raw), store, cache, quiet=True, draw_secret=secret).run()
        auc = {(r["defense"], r["game"], r["attack"]): r["value"] for r in store.metric_rows(run.run_id)
               if r["metric"] == "auc"}
        loss = {r["defense"]: r["value"] for r in store.utility_rows(run.run_id)
                if r["role"] == "adapted" and r["dataset"] == "heldout" and r["metric"] == "loss"}
        labels = ["none", "finetune", "theta_dedup", "random_drop"]
        for d in labels:
            retained = (loss["none"] - loss[d]) / (loss["none"] - loss["finetune"])
            print(f"{setting:16s} {d:18s} {auc[(d, 'adapt', 'loss')]:11.3f} {auc[(d, 'adapt', 'min_k')]:6.3f} "
                  f"{auc[(d, 'joint/seen', 'loss')]:10.3f} {auc[(d, 'joint/seen', 'min_k')]:6.3f} "
                  f"{auc[(d, 'null', 'loss')]:10.3f} {loss[d]:9.3f} {retained:8.2f}")
    print("(utility retained = (L(θ) - L(θ')) / (L(θ) - L(θ' of finetune)) on the held-out split)")


if __name__ == "__main__":
    main()
