"""How long the users track's documents are under its own tokenizer, and where a user's sign-off starts: the
measurement behind the track's 192-token context (bench/tracks/users.yaml). Builds the track's task and tokenizer
(cached under --cache) and prints, per partition, the token counts (BOS included) and the share of documents
longer than 128, 192 and 256 tokens, then the share of the attacker's samples whose personal phrase, sign-off
and signature begin past token 128 and 192; last, how many samples each user of the pool shows the attacker and
what `user_limit` at 3 documents per user takes from them. The pool is the users of the target and adaptation
partitions together, from which every world draws its target users and D's background users
(bench.pools.split_user_pool); a world's target users are a random draw of it.

    python scripts/users_doc_lengths.py [--cache DIR]
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np
from transformers import AutoTokenizer

from bench.artifacts import ensure_tokenizer
from bench.cache import ArtifactCache
from bench.suite import parse_suite
from bench.tracks import load_track


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", default=None, help="artifact cache (default $PRIVBENCH_CACHE or ~/.cache/privbench)")
    args = ap.parse_args()
    suite = parse_suite(load_track("users").suite_raw())
    cache = ArtifactCache(args.cache)
    data = suite.tasks[0].instance.build(cache)
    tok_dir, _ = ensure_tokenizer(cache, suite.models[0], data)
    tok = AutoTokenizer.from_pretrained(tok_dir)

    def lengths(texts) -> np.ndarray:
        return np.array([len(ids) + 1 for ids in tok(list(texts), add_special_tokens=False)["input_ids"]])

    samples = [s for v in data.public_format["user_samples"].values() for s in v]
    print(f"users track, model context_length {suite.models[0].context_length}")
    for name, texts in (("attacker samples", samples), ("target records", [t.text for t in data.targets]),
                        ("adaptation background", data.adapt)):
        n = lengths(texts)
        print(f"  {name:22s} n={len(n):5d}  median {np.median(n):.0f}  p90 {np.percentile(n, 90):.0f}  max {n.max()}"
              f"  >128: {np.mean(n > 128):.1%}  >192: {np.mean(n > 192):.1%}  >256: {np.mean(n > 256):.1%}")
    # a document ends "<body>\n\n<personal phrase>\n\n<sign-off>,\n<name>\n<job, city>": where each part begins
    for part, head in (("personal phrase", lambda d: d.rsplit("\n\n", 2)[0]),
                       ("sign-off", lambda d: d.rsplit("\n\n", 1)[0]),
                       ("signature", lambda d: d.rsplit("\n", 2)[0])):
        starts = lengths([head(s) for s in samples])
        print(f"  attacker samples whose {part:15s} begins past token 128: {np.mean(starts >= 128):5.1%}, "
              f"past 192: {np.mean(starts >= 192):.1%}")
    shown = Counter(len(v) for v in data.public_format["user_samples"].values())
    print("  samples the attacker holds per user of the pool: "
          + ", ".join(f"{k}: {v} users" for k, v in sorted(shown.items())))
    per_user = Counter(m["user"] for m in data.target_meta.values()) + Counter(data.adapt_owners)
    print(f"  user_limit at 3 per user: drops {sum(max(0, n - 3) for n in per_user.values())} of "
          f"{sum(per_user.values())} records of the pool, trims {sum(n > 3 for n in per_user.values())} of "
          f"{len(per_user)} users")

if __name__ == "__main__":
    main()
