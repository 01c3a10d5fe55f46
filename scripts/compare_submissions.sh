#!/bin/bash
# Submit one plugin with two privbench source trees under the same draw secret and compare what they stored:
# every score (with its label) and every utility row but the wall-clock ones (train_seconds, adapt_seconds). Used to check that a change to how
# submissions run (bench/submit.py, bench/plugin_worker.py) leaves an honest plugin's results unchanged.
#
#   bash scripts/compare_submissions.sh OLD_TREE NEW_TREE PLUGIN [SUITE] [WORKDIR]
#
# OLD_TREE and NEW_TREE are checkouts (e.g. `git worktree add /tmp/old REV`); SUITE defaults to the tiny test
# world (tests/plugins/tiny.yaml); each side gets an empty cache and database under WORKDIR.
set -euo pipefail
old=$(realpath "$1"); new=$(realpath "$2"); plugin=$(realpath "$3")
suite=$(realpath "${4:-$new/tests/plugins/tiny.yaml}"); work=${5:-$(mktemp -d)}
mkdir -p "$work"
export PRIVBENCH_DRAW_SECRET=${PRIVBENCH_DRAW_SECRET:-compare-submissions}
for side in old new; do
  tree=$old; [ "$side" = new ] && tree=$new
  (cd "$tree" && PYTHONPATH="$tree" python3 -c "
import sys
from bench.sandbox import Limits
from bench.submit import submit
r = submit(sys.argv[1], suite=sys.argv[2], db='sqlite:///' + sys.argv[3], cache=sys.argv[4],
           limits=Limits(wall_s=3600, memory_bytes=8 << 30))
print(sys.argv[5], r.status, r.error or '', f'{r.seconds:.1f} s')
sys.exit(r.status != 'complete')
" "$plugin" "$suite" "$work/$side.db" "$work/cache-$side" "$side")
done
python3 - "$work/old.db" "$work/new.db" <<'PY'
import sqlite3, sys
def scores(db):
    return sorted(sqlite3.connect(db).execute(
        "SELECT e.defense, e.game, e.attack, e.seed, s.target_id, s.label, s.score "
        "FROM scores s JOIN evaluations e ON s.evaluation_id = e.id").fetchall())
def utility(db):
    return sorted(sqlite3.connect(db).execute(
        "SELECT defense, seed, role, dataset, metric, value FROM utility WHERE metric NOT IN ('train_seconds', 'adapt_seconds')").fetchall())
a, b = scores(sys.argv[1]), scores(sys.argv[2])
ua, ub = utility(sys.argv[1]), utility(sys.argv[2])
print(f"scores: {len(a)} vs {len(b)}, {'identical' if a == b else 'DIFFERENT'}")
print(f"utility rows (train_seconds and adapt_seconds aside): {len(ua)} vs {len(ub)}, {'identical' if ua == ub else 'DIFFERENT'}")
sys.exit(0 if a == b and ua == ub else 1)
PY
