"""Where the probability floor of Segal et al. 2025 goes changes k_x by orders of magnitude: on the rule's inputs
(constituents and base, as `naf` applies `min_log_prob`) or on its output too. Prints k_x (99th percentile, mean,
max over every next-token position) of one NAF release on Names2IDs records under no floor, the floor on the inputs,
and the floor on inputs and output.

    python scripts/naf_floor_placement.py CACHE/adapted/<key> [--records 48] [--floor -20]

A release directory is any `adapted/<key>` holding a `release.json` of kind naf (e.g. from `privbench run --suite
naf --cache CACHE`); the constituents are read from it, the floor is set here.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from bench import aggregate as agg
from bench.lm import HFLanguageModel
from bench.release import load_release
from defenses.naf import NAFLanguageModel
from tasks.names2ids import Names2IDs


class _OutputFloored(NAFLanguageModel):
    """The rule's output mixed with the uniform distribution too (what `naf` does not do)."""

    def combine(self, *args, **kwargs) -> torch.Tensor:
        return agg.floor_log_probs(super().combine(*args, **kwargs), self.min_log_prob)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("release", type=Path)
    ap.add_argument("--records", type=int, default=48)
    ap.add_argument("--floor", type=float, default=-20.0)
    args = ap.parse_args()
    spec = json.loads((args.release / "release.json").read_text())
    if spec.get("kind") != "naf":
        raise SystemExit(f"{args.release} holds a release of kind {spec.get('kind')!r}, not naf: pick an "
                         f"adapted/<key> directory written by the naf defense")
    torch.set_num_threads(1)

    def make_lm(model, tok, suffix=""):
        return HFLanguageModel(model, tok, fingerprint=f"floor-placement{suffix}", max_length=128, batch_size=8)

    loaded = load_release(args.release, device=torch.device("cpu"), fingerprint="floor-placement", make_lm=make_lm)
    texts = [t.text for t in Names2IDs(n_people=2000, heldout_fraction=0.1,
                                       max_chars_per_source=1_500_000).build().targets[: args.records]]
    meta = spec["meta"]
    print(f"{args.release.name}: variant {meta['variant']}, {len(texts)} Names2IDs records")
    for label, cls, floor in (("no floor", NAFLanguageModel, None), ("floor on the inputs", NAFLanguageModel,
                              args.floor), ("floor on inputs and output", _OutputFloored, args.floor)):
        lm = cls(loaded.constituents, variant=meta["variant"], m=int(meta["m"]), base=loaded.base,
                 constant_logp=loaded.constant_logp, fuse_grid=int(meta["fuse_grid"]), fingerprint=label,
                 min_log_prob=floor)
        kx = lm.naf_bounds(texts)
        print(f"  {label:27s} k_x p99 {np.percentile(kx, 99):.4f}  mean {kx.mean():.4f}  max {kx.max():.4f}")


if __name__ == "__main__":
    main()
