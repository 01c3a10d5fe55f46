"""Real-data tasks read through ``datasets``: the same schema from the Hugging Face hub or from a local copy.

Every task here takes ``source``: a hub dataset id (the default) or a local
file / directory holding the same columns. Both go through
``datasets.load_dataset`` (the hub repository, or the packaged ``json`` /
``parquet`` / ``csv`` builder for local files) and then through the same row
code, so a local copy in the documented schema gives exactly what the hub
would. ``datasets`` writes only under ``<privbench cache>/hf_datasets``.

Sources and parameters
----------------------
Common parameters: ``source``, ``config_name`` (the hub config, e.g. MIMIR's
``pile_cc``; named so because ``config`` is every plugin's parameter dict),
``split``, ``n``, ``seed``, ``revision``, ``streaming`` and the relative pool
sizes ``heldout_weight``, ``population_weight``, ``adapt_weight``,
``targets_weight``.

``source`` may be one file (``.jsonl``, ``.json``, ``.parquet``, ``.csv``;
used as the requested split) or a directory; in a directory the split's files
are the first of these that exist (``<ext>`` one of the four, several shards
allowed; ``<config>`` patterns only when ``config_name`` is set)::

    <config>/<split>.<ext>   <config>/<split>-*.<ext>   <config>/<split>/*.<ext>
    data/<split>.<ext>       data/<split>-*.<ext>
    <split>.<ext>            <split>-*.<ext>            <split>/*.<ext>

which covers ``Dataset.to_parquet``/``to_json`` output, ``push_to_hub``
layouts (``data/train-00000-of-00001.parquet``) and the hub's parquet export
(``<config>/<split>/0000.parquet``).

Hub access
----------
A hub id needs the hub. With ``HF_HUB_OFFLINE=1`` / ``HF_DATASETS_OFFLINE=1``
a non-streaming task may still load a copy that an earlier online run cached
under ``<privbench cache>/hf_datasets``; otherwise, and whenever the hub
cannot be reached (a 3-second connection probe runs first, so nothing hangs
on retries), the task raises :class:`bench.errors.DataError` saying that the
hub is needed or that a local copy in the schema below can be passed as
``source``. ``revision`` pins a hub commit or tag; ``n`` reads at most the
first ``n`` rows (after filters) in source order; ``seed`` salts the
hash partitioning of records into pools. Hub datasets that are still
script-based (``datasets`` >= 4 cannot run scripts) need a local export.

Schemas and tasks
-----------------
``mimir`` — MIMIR (Duan et al. 2024, "Do Membership Inference Attacks Work on
    Large Language Models?"), hub ``iamgroot42/mimir``. Configs are Pile
    subsets (``pile_cc``, ``wikipedia_(en)``, ``github``, ``arxiv``,
    ``dm_mathematics``, ``hackernews``, ``pubmed_central``, ...), splits the
    n-gram-overlap filters (``ngram_13_0.8``, ``ngram_7_0.2``, ``none``).
    Columns: ``member`` (str, a Pile train text: in the pretraining data of
    Pythia / GPT-Neo) and ``nonmember`` (str, a Pile test text: not in it),
    one pair per row; other columns (``member_neighbors``, ...) are ignored.
    The hub repository is script-based (``mimir.py``); export a split once with
    ``datasets<4``: ``load_dataset("iamgroot42/mimir", "pile_cc",
    split="ngram_13_0.8", trust_remote_code=True).to_parquet("mimir/pile_cc/ngram_13_0.8.parquet")``
    and pass ``source: mimir``.
``pile_split`` — Pile documents with membership from the Pile's own splits
    (e.g. ``EleutherAI/pile``, ``monology/pile-uncopyrighted``): columns
    ``text`` (str) and ``meta`` (``{"pile_set_name": "Github"}``, a struct, or
    that object as a JSON string). ``subset`` filters ``pile_set_name``
    (``"Github"``, ``"Enron Emails"``, ``"BookCorpus2"``, ...; null = all).
    Members (a=1) are the first ``n`` matching rows of ``split`` (``train``:
    trained on by every Pythia model; deduplication only removed extra
    copies); non-members (a=0) the first ``n`` of ``nonmember_split``
    (``validation``; never trained on). Caveat: the Pile's validation set
    shares some documents and long n-grams with train (the reason MIMIR
    filters); texts seen in both samples are dropped from the non-members.
    A local source is a directory with both splits.
``samsum`` — SAMSum dialogue summarisation, hub ``knkarthick/samsum``
    (``samsum`` itself is script-based): columns ``id`` (str), ``dialogue``
    (str), ``summary`` (str). Record text ``"Dialogue:\\n{dialogue}\\nSummary:
    {summary}"``, as Marek et al. 2026 use SAMSum for out-of-distribution
    adaptation. Rows with an empty dialogue are skipped.
``german_wiki`` — German Wikipedia, hub ``wikimedia/wikipedia`` config
    ``20231101.de``: columns ``id``, ``url``, ``title``, ``text`` (str). One
    record per article: its text cut to ``max_chars`` at a whitespace.
``enron_users`` — user-level data for user inference (Kandpal et al. 2024): one row
    per document with a text column and a user column. Default hub
    ``corbt/enron-emails`` with ``body`` (the text) and ``from`` (the sender);
    arXiv by submitter is the same task with e.g. ``text_column: abstract``,
    ``user_column: submitter``. Users with fewer than
    ``min_records_per_user`` records are dropped; at most
    ``max_records_per_user`` records per user are kept. Note that the Pile
    has an "Enron Emails" subset: for a Pythia model these emails are
    probably pretraining data. No document is set aside for the attacker,
    so a user target shows the user's own training records: user-level
    membership inference in Kandpal et al.'s terms (section 2), a stronger
    attacker than their user inference (docs/units.md).

Mapping to :class:`bench.task.TaskData`
--------------------------------------
``mimir`` and ``pile_split`` (relation ``"overlap"``): targets are member and
non-member texts; ``target_meta[id]["a"]`` is 1 or 0, the KNOWN pretraining
membership from the dataset (:func:`known_membership`). They describe a
released pretrained model (e.g. a Pythia checkpoint, see
:data:`PYTHIA_SPECS`): "For a released pretrained model (e.g. a Pythia
checkpoint), a comes from its documented train/validation split and
pretraining is skipped" — the challenger does not insert targets into
pretraining and must take each target's ``a`` from ``target_meta``;
``pretrain`` is empty. All members are targets; the non-members are
hash-partitioned into targets, held-out, population and adaptation pools by
the ``*_weight`` parameters, so the held-out and population pools are
non-member data. ``public_format`` is None. A world's pooled draw splits the
members and the non-member target and adaptation pools again under its salt
(``bench.pools.split_known_pool``), so the public lists do not mark targets.

``samsum``, ``german_wiki`` (relation ``"ood"``) and ``enron_users``
(``unit: "user"``, ``target_meta[id]["user"]``; partitioned by user so a
user's records share a pool) hash-partition their records into the four
pools; their ``pretrain`` is ``pretrain_path`` (a local file, ``text``
column) or ``mini_pile``'s pretraining partition, minus texts equal to a
task record.

Record ids are deterministic: ``<task>-<dataset id>`` where the dataset has
ids, else ``<task>-<m|n|r>-<sha1(text)[:16]>``.
"""

from __future__ import annotations

import glob
import json
import os
import re
import socket
from pathlib import Path
from typing import Any, Iterator, Mapping
from urllib.parse import urlparse

from bench.errors import DataError, PrivbenchError
# the named released checkpoints are model specs: they live with the specs in the core (re-exported here)
from bench.modeling import PYTHIA_SPECS
from bench.params import Param
from bench.registry import register_task
from bench.task import TargetRecord, Task, TaskData
from tasks.user_files import (
    FORMATS, assemble_task_data, file_format, hf_cache_dir, inspect_file, load_pretrain,
    partition_records, pool_params, pool_weights, read_rows, record_documents, require_nonempty, text_id,
)

__all__ = ["PYTHIA_SPECS", "known_membership", "open_rows", "is_local_source", "resolve_local_files",
           "Mimir", "PileSplit", "SamSum", "GermanWiki", "EnronUsers"]



def known_membership(data: TaskData) -> dict[str, int]:
    """target id -> a (1: in the released model's pretraining data, 0: not), for targets whose a is known."""
    return {tid: int(meta["a"]) for tid, meta in data.target_meta.items() if "a" in meta}


# ------------------------------------------------------------------------------------------------
# sources: hub id or local path

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?$")
_DATA_SUFFIXES = tuple(f".{e}" for e in FORMATS)


def is_local_source(source: str) -> bool:
    """True for an existing path or anything that looks like one; False for a hub id like ``owner/name``."""
    if Path(source).expanduser().exists():
        return True
    if source.startswith(("/", "./", "../", "~", ".\\")) or "\\" in source or source.lower().endswith(_DATA_SUFFIXES):
        return True
    if not _HUB_ID.match(source) or ".." in source:
        return True
    return False


def _layout_patterns(config: str | None, split: str) -> list[str]:
    s = glob.escape(split)
    pats = []
    if config:
        c = glob.escape(config)
        pats += [f"{c}/{s}.{{ext}}", f"{c}/{s}-*.{{ext}}", f"{c}/{s}/*.{{ext}}"]
    pats += [f"data/{s}.{{ext}}", f"data/{s}-*.{{ext}}", f"{s}.{{ext}}", f"{s}-*.{{ext}}", f"{s}/*.{{ext}}"]
    return pats


def resolve_local_files(source: str | Path, config: str | None, split: str, *, task: str) -> tuple[list[Path], str]:
    """(files, format) of one split of a local copy: the file itself, or the split's files in a directory."""
    root = Path(source).expanduser()
    if not root.exists():
        raise DataError(f"task '{task}': local source {root} does not exist: give an existing file or directory, or "
                        f"a hub dataset id (owner/name)")
    if root.is_file():
        return [root], file_format(root)
    for pat in _layout_patterns(config, split):
        for ext in FORMATS:
            files = sorted(Path(p) for p in glob.glob(str(root / pat.format(ext=ext))) if Path(p).is_file())
            if files:
                return files, file_format(files[0])
    present = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())[:8]
    want = ", ".join(p.format(ext="parquet") for p in _layout_patterns(config, split)[:3])
    raise DataError(f"task '{task}': no data for split '{split}'{f' of config {config!r}' if config else ''} in {root} "
                    f"(files there: {', '.join(present) or 'none'}): put it at e.g. {want} "
                    f"(.parquet, .jsonl, .json or .csv)")


_TRUE = {"1", "ON", "YES", "TRUE"}


def hub_offline() -> bool:
    if any(os.environ.get(k, "").upper() in _TRUE for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")):
        return True
    try:
        import datasets.config as dc
        return bool(getattr(dc, "HF_HUB_OFFLINE", False))
    except Exception:  # pragma: no cover - datasets missing
        return False


def _probe_hub(timeout: float = 3.0) -> str | None:
    """None when a TCP connection to the hub endpoint opens within ``timeout`` s, else why not.

    Skipped (None) behind a proxy, where a direct connection says nothing about reachability.
    """
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    url = urlparse(endpoint)
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return f"cannot connect to {host}:{port} ({exc.strerror or type(exc).__name__})"


def _local_hint(task: str) -> str:
    return (f"pass a local copy in the same schema as the task's `source` (a file or directory; schema in "
            f"tasks/hub.py, task '{task}')")


def _hub_error(exc: Exception, hub_id: str, config: str | None, split: str, task: str) -> DataError:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    what = f"task '{task}': hub dataset '{hub_id}'" + (f" config '{config}'" if config else "") + f" split '{split}'"
    low = first.lower()
    try:
        from datasets.exceptions import DatasetNotFoundError
    except Exception:  # pragma: no cover
        DatasetNotFoundError = ()  # type: ignore[assignment]
    if isinstance(exc, ConnectionError) or "couldn't reach" in low or "offline" in low:
        return DataError(f"{what}: the Hugging Face hub is needed but not reachable ({first}): connect to the hub "
                         f"(unset HF_HUB_OFFLINE/HF_DATASETS_OFFLINE), or {_local_hint(task)}")
    if "script" in low and ("no longer supported" in low or "trust_remote_code" in low):
        return DataError(f"{what}: the hub dataset is script-based, which this `datasets` cannot run ({first}): "
                         f"export the split once with datasets<4 (see tasks/hub.py) and {_local_hint(task)}")
    if DatasetNotFoundError and isinstance(exc, DatasetNotFoundError):
        return DataError(f"{what}: not found on the hub, or gated ({first}): check the id, accept its terms and "
                         f"`huggingface-cli login`, or {_local_hint(task)}")
    if "config" in low and ("not found" in low or "available" in low):
        return DataError(f"{what}: unknown config ({first}): set `config` to one of the dataset's configs")
    if "split" in low and ("unknown" in low or "bad split" in low or "should be one of" in low):
        return DataError(f"{what}: unknown split ({first}): set `split` to one of the dataset's splits")
    return DataError(f"{what}: cannot load it ({type(exc).__name__}: {first}): check source/config/split/revision, "
                     f"or {_local_hint(task)}")


def open_rows(source: str, *, config: str | None, split: str, revision: str | None = None,
              streaming: bool = False, cache_root: str | Path | None = None, task: str = "hub"
              ) -> tuple[Iterator[dict[str, Any]], dict[str, Any]]:
    """(rows, provenance) of one split of ``source``: a hub id or a local file/directory, both via ``datasets``."""
    if is_local_source(source):
        files, fmt = resolve_local_files(source, config, split, task=task)
        kwargs: dict[str, Any] = {}
        for f in files:  # full checks (encoding, JSON lines, columns) for files of ordinary size
            if f.stat().st_size <= 64 << 20 or fmt == "csv":
                info = inspect_file(f)
                kwargs = kwargs or info.builder_kwargs
            elif f.stat().st_size == 0:
                raise DataError(f"{f}: the file is empty (0 bytes): give a file with at least one record")
        what = str(files[0]) if len(files) == 1 else f"{files[0].parent} ({len(files)} files of split '{split}')"
        prov = {"kind": "local", "source": str(Path(source).expanduser()), "config": config, "split": split,
                "files": [str(f) for f in files], "format": fmt}
        return read_rows(files, fmt, cache_dir=cache_root, builder_kwargs=kwargs, what=what), prov
    prov = {"kind": "hub", "source": source, "config": config, "split": split, "revision": revision,
            "streaming": streaming}
    return _hub_rows(source, config, split, revision, streaming, cache_root, task), prov


def _hub_rows(hub_id, config, split, revision, streaming, cache_root, task) -> Iterator[dict[str, Any]]:
    where = f"task '{task}': hub dataset '{hub_id}'"
    if hub_offline():
        if streaming:
            raise DataError(f"{where}: the Hugging Face hub is needed but offline mode is on (HF_HUB_OFFLINE / "
                            f"HF_DATASETS_OFFLINE) and streaming reads no cache: go online, set streaming: false "
                            f"after one online run, or {_local_hint(task)}")
    else:
        why = _probe_hub()
        if why is not None:
            raise DataError(f"{where}: the Hugging Face hub is needed but not reachable ({why}): connect to the "
                            f"hub, set HF_DATASETS_OFFLINE=1 to use a copy cached by an earlier run, or "
                            f"{_local_hint(task)}")
    try:
        from datasets import load_dataset
        ds = load_dataset(hub_id, config, split=split, revision=revision, streaming=streaming,
                          cache_dir=str(hf_cache_dir(cache_root)))
        it = iter(ds)
    except PrivbenchError:
        raise
    except Exception as exc:
        raise _hub_error(exc, hub_id, config, split, task) from None
    return _guarded(it, hub_id, config, split, task)


def _guarded(it, hub_id, config, split, task) -> Iterator[dict[str, Any]]:
    while True:
        try:
            row = next(it)
        except StopIteration:
            return
        except Exception as exc:
            raise _hub_error(exc, hub_id, config, split, task) from None
        yield row


# ------------------------------------------------------------------------------------------------
# row helpers


def _require(row: Mapping[str, Any], columns: tuple[str, ...], where: str, fix: str) -> None:
    missing = [c for c in columns if c not in row]
    if missing:
        present = ", ".join(repr(c) for c in row) or "none"
        raise DataError(f"{where}: no column {', '.join(repr(c) for c in missing)} (columns present: {present}): "
                        f"{fix}")


def _text(value: Any) -> str | None:
    """The value as a non-empty, stripped string, or None."""
    if not isinstance(value, str):
        return None
    value = value.strip()
    return value or None


def truncate(text: str, max_chars: int | None) -> str:
    """``text`` cut to at most ``max_chars`` at the last whitespace (hard cut if there is none in the second half)."""
    if max_chars is None or len(text) <= max_chars:
        return text
    head = text[:max_chars]
    cut = max(head.rfind(" "), head.rfind("\n"), head.rfind("\t"))
    return (head[:cut] if cut >= max_chars // 2 else head).rstrip()


def _take(rows: Iterator[dict[str, Any]], n: int | None) -> Iterator[dict[str, Any]]:
    for i, row in enumerate(rows):
        if n is not None and i >= n:
            return
        yield row


def _where(prov: Mapping[str, Any], task: str) -> str:
    if prov["kind"] == "local":
        files = prov["files"]
        return files[0] if len(files) == 1 else f"{Path(files[0]).parent} (split '{prov['split']}')"
    return f"task '{task}': hub dataset '{prov['source']}' split '{prov['split']}'"


def _source_params(source: str, config: str | None, split: str, n: int | None, streaming: bool,
                   config_help: str = "hub config name (dataset subset)") -> tuple[Param, ...]:
    return (
        Param("source", str, source, "hub dataset id, or a local file/directory in the same schema"),
        Param("config_name", str, config, config_help, nullable=True),
        Param("split", str, split, "split to read"),
        Param("n", int, n, "read at most the first n rows (after filters); null = all", low=1, nullable=True),
        Param("seed", int, 0, "salt of the hash partitioning into pools", low=0),
        Param("revision", str, None, "hub commit/tag to pin (ignored for local sources)", nullable=True),
        Param("streaming", bool, streaming, "stream from the hub instead of downloading the whole split"),
    )


class _HubTask(Task):
    needs = "the Hugging Face hub (not reachable offline) or a local copy: --params source=<file or dir>"

    def _open(self, cache, *, split: str | None = None) -> tuple[Iterator[dict[str, Any]], dict[str, Any]]:
        return open_rows(self.source, config=self.config_name, split=split or self.split, revision=self.revision,
                         streaming=self.streaming, cache_root=getattr(cache, "root", None), task=self.name)

    def _salt(self) -> str:
        return f"{self.name}/{self.seed}"


# ------------------------------------------------------------------------------------------------
# known membership: MIMIR and the Pile's own splits


def _membership_data(task: _HubTask, members: list[tuple[str, str]], nonmembers: list[tuple[str, str]],
                     *, where: str, sources: list[dict[str, Any]], stats: dict[str, Any]) -> TaskData:
    """All members -> targets (a=1); non-members hash-partitioned into the four pools (targets get a=0)."""
    member_texts = {t for _, t in members}
    both = {t for _, t in nonmembers} & member_texts
    if both:  # a text listed on both sides is a member: keep it only as one
        nonmembers = [(i, t) for i, t in nonmembers if t not in both]
    stats = dict(stats, texts_on_both_sides_dropped_from_nonmembers=len(both))
    if not members:
        raise DataError(f"{where}: no member texts: check split/subset, or give more rows (n)")
    parts = partition_records([{"id": i, "text": t} for i, t in nonmembers], salt=task._salt(),
                              weights=pool_weights(task))
    require_nonempty(parts, where=where, n_records=len(nonmembers))
    targets = [TargetRecord(i, t) for i, t in members] + [TargetRecord(r["id"], r["text"]) for r in parts["targets"]]
    meta = {i: {"a": 1} for i, _ in members}
    meta.update({r["id"]: {"a": 0} for r in parts["targets"]})
    stats.update(members=len(members), nonmembers=len(nonmembers), pretraining="released model: skipped")
    return assemble_task_data(
        task.name, pretrain=(), heldout=[r["text"] for r in parts["heldout"]],
        population=[r["text"] for r in parts["population"]], adapt=[r["text"] for r in parts["adapt"]],
        targets=targets, relation="overlap", unit="record", target_meta=meta, sources=sources, stats=stats,
        config=task.config)


def _dedupe(pairs: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], int]:
    seen: set[str] = set()
    out = []
    for i, t in pairs:
        if i in seen:
            continue
        seen.add(i)
        out.append((i, t))
    return out, len(pairs) - len(out)


@register_task("mimir")
class Mimir(_HubTask):
    known_pretraining_membership = True
    description = ("MIMIR (Duan et al. 2024): Pile member / non-member texts of a released Pythia or GPT-Neo model; "
                   "known membership a from the dataset, pretraining skipped.")
    params = (
        *_source_params("iamgroot42/mimir", "pile_cc", "ngram_13_0.8", None, False,
                        "Pile subset: pile_cc, wikipedia_(en), github, arxiv, dm_mathematics, hackernews, "
                        "pubmed_central, ..."),
        Param("max_chars", int, None, "cut texts to this many characters", low=1, nullable=True),
        *pool_params(0.1, 0.2, 0.1, 0.6),
    )

    def build(self, cache=None) -> TaskData:
        rows, prov = self._open(cache)
        where = _where(prov, self.name)
        members, nonmembers, empty = [], [], 0
        for i, row in enumerate(_take(rows, self.n)):
            if i == 0:
                _require(row, ("member", "nonmember"), where, "MIMIR rows have a 'member' and a 'nonmember' text")
            for col, out, tag in (("member", members, "m"), ("nonmember", nonmembers, "n")):
                t = _text(row.get(col))
                if t is None:
                    empty += 1
                    continue
                t = truncate(t, self.max_chars)
                out.append((text_id(t, f"mimir-{tag}"), t))
        members, d1 = _dedupe(members)
        nonmembers, d2 = _dedupe(nonmembers)
        return _membership_data(self, members, nonmembers, where=where,
                                sources=[dict(prov, name="mimir", citation="Duan et al. 2024, MIMIR")],
                                stats={"empty_texts_skipped": empty, "duplicates_dropped": d1 + d2})


def _pile_set(meta: Any) -> str | None:
    if isinstance(meta, str):
        try:
            meta = json.loads(meta)
        except json.JSONDecodeError:
            return None
    if isinstance(meta, Mapping):
        name = meta.get("pile_set_name")
        return name if isinstance(name, str) else None
    return None


@register_task("pile_split")
class PileSplit(_HubTask):
    known_pretraining_membership = True
    description = ("Pile documents of one subset with known membership: the Pile train split (a=1, trained on by "
                   "Pythia) against its validation split (a=0).")
    params = (
        *_source_params("EleutherAI/pile", None, "train", 1000, True),
        Param("subset", str, "Github", "meta.pile_set_name to keep (Github, Enron Emails, BookCorpus2, ...); "
              "null = all", nullable=True),
        Param("nonmember_split", str, "validation", "split of the non-members (a=0)"),
        Param("max_chars", int, 2000, "cut documents to this many characters", low=1, nullable=True),
        Param("max_scan", int, 5_000_000, "stop scanning a split after this many rows", low=1),
        *pool_params(0.1, 0.2, 0.1, 0.6),
    )

    def _read(self, cache, split: str, tag: str) -> tuple[list[tuple[str, str]], dict[str, Any], dict[str, int]]:
        if is_local_source(self.source) and Path(self.source).expanduser().is_file():
            raise DataError(f"task 'pile_split': source {self.source} is one file but members and non-members come "
                            f"from two splits: give a directory with '{self.split}' and '{self.nonmember_split}' "
                            f"files (e.g. train.jsonl and validation.jsonl)")
        rows, prov = self._open(cache, split=split)
        where = _where(prov, self.name)
        out: list[tuple[str, str]] = []
        seen: set[str] = set()
        counts = {"scanned": 0, "empty": 0, "duplicates": 0}
        for i, row in enumerate(rows):
            if i == 0:
                _require(row, ("text",) + (("meta",) if self.subset else ()), where,
                         "Pile rows have 'text' and 'meta' {'pile_set_name': ...}" +
                         ("; or set subset: null to keep all rows" if self.subset else ""))
            if i >= self.max_scan or (self.n is not None and len(out) >= self.n):
                break
            counts["scanned"] += 1
            if self.subset and _pile_set(row.get("meta")) != self.subset:
                continue
            t = _text(row.get("text"))
            if t is None:
                counts["empty"] += 1
                continue
            t = truncate(t, self.max_chars)
            rid = text_id(t, f"pile-{tag}")
            if rid in seen:
                counts["duplicates"] += 1
                continue
            seen.add(rid)
            out.append((rid, t))
        if not out:
            raise DataError(f"{where}: no rows of subset {self.subset!r} among the first {counts['scanned']} rows: "
                            f"check `subset` (a meta.pile_set_name such as Github) or raise max_scan")
        return out, prov, counts

    def build(self, cache=None) -> TaskData:
        members, p1, c1 = self._read(cache, self.split, "m")
        nonmembers, p2, c2 = self._read(cache, self.nonmember_split, "n")
        where = _where(p2, self.name)
        return _membership_data(
            self, members, nonmembers, where=where,
            sources=[dict(p1, name="pile", role="members"), dict(p2, name="pile", role="nonmembers")],
            stats={"subset": self.subset, "member_scan": c1, "nonmember_scan": c2})


# ------------------------------------------------------------------------------------------------
# out-of-distribution and user-level pools


def _pool_data(task: Task, records: list[dict[str, str]], *, where: str, relation: str, prov: dict[str, Any],
               cache, stats: dict[str, Any], unit: str = "record") -> TaskData:
    key = "user" if unit == "user" else "id"
    parts = partition_records(records, salt=task._salt(), weights=pool_weights(task), key=key)
    require_nonempty(parts, where=where, n_records=len(records), unit=unit,
                     n_units=len({r["user"] for r in records}) if unit == "user" else None)
    pretrain, pprov, removed = load_pretrain(task.pretrain_path, text_column="text", cache=cache,
                                             exclude={r["text"] for r in records})
    targets = [TargetRecord(r["id"], r["text"]) for r in parts["targets"]]
    meta = {r["id"]: {"user": r["user"]} for r in parts["targets"]} if unit == "user" else {}
    stats = dict(stats, records=len(records), pretrain_removed_as_task_records=removed)
    return assemble_task_data(
        task.name, pretrain=pretrain, heldout=[r["text"] for r in parts["heldout"]],
        population=[r["text"] for r in parts["population"]], adapt=[r["text"] for r in parts["adapt"]],
        targets=targets, relation=relation, unit=unit, target_meta=meta, sources=[prov, pprov], stats=stats,
        config=task.config, adapt_owners=[r["user"] for r in parts["adapt"]] if unit == "user" else None,
        # one record per row, each its own document: a world pools the adaptation and target partitions
        **(record_documents(parts) if unit == "record" else {}))


_PRETRAIN_PARAM = Param("pretrain_path", str, None, "pretraining corpus file with a 'text' column (default: "
                        "mini_pile's pretraining partition)", nullable=True)


def _collect_records(rows, n, where: str, required: tuple[str, ...], schema_hint: str, text_of,
                     id_prefix: str) -> tuple[list[dict], int]:
    """Rows → unique ``{"id", "text"}`` records: the schema checked on the first row, rows without text and
    repeated ids or texts skipped (and counted), ids from the row's ``id`` or else from the text."""
    records, seen, skipped = [], set(), 0
    for i, row in enumerate(_take(rows, n)):
        if i == 0:
            _require(row, required, where, schema_hint)
        text = text_of(row)
        if text is None:
            skipped += 1
            continue
        row_id = row.get("id")
        rid = f"{id_prefix}-{row_id}" if row_id not in (None, "") else text_id(text, f"{id_prefix}-r")
        if rid in seen or text in seen:
            skipped += 1
            continue
        seen.update((rid, text))
        records.append({"id": rid, "text": text})
    return records, skipped


@register_task("samsum")
class SamSum(_HubTask):
    version = "0.2.0"  # 0.2.0: records carry their documents, and worlds pool (bench.pools)
    description = ("SAMSum dialogues with their summaries as out-of-distribution adaptation data (Marek et al. "
                   "2026), hash-partitioned into held-out, population, adaptation and target pools.")
    params = (
        *_source_params("knkarthick/samsum", None, "train", None, False),
        _PRETRAIN_PARAM,
        *pool_params(0.1, 0.3, 0.3, 0.3),
    )

    def build(self, cache=None) -> TaskData:
        rows, prov = self._open(cache)
        where = _where(prov, self.name)

        def text_of(row):
            dialogue, summary = _text(row.get("dialogue")), _text(row.get("summary"))
            return None if dialogue is None or summary is None else f"Dialogue:\n{dialogue}\nSummary: {summary}"

        records, skipped = _collect_records(rows, self.n, where, ("dialogue", "summary"),
                                            "SAMSum rows have 'id', 'dialogue' and 'summary'", text_of, "samsum")
        return _pool_data(self, records, where=where, relation="ood", cache=cache,
                          prov=dict(prov, name="samsum", citation="Gliwa et al. 2019, SAMSum"),
                          stats={"rows_skipped": skipped})


@register_task("german_wiki")
class GermanWiki(_HubTask):
    version = "0.2.0"  # 0.2.0: records carry their documents, and worlds pool (bench.pools)
    description = "German Wikipedia articles (cut to max_chars) as out-of-distribution data for an English model."
    params = (
        *_source_params("wikimedia/wikipedia", "20231101.de", "train", 5000, True),
        Param("max_chars", int, 1000, "cut each article to this many characters", low=1, nullable=True),
        _PRETRAIN_PARAM,
        *pool_params(0.1, 0.3, 0.3, 0.3),
    )

    def build(self, cache=None) -> TaskData:
        rows, prov = self._open(cache)
        where = _where(prov, self.name)

        def text_of(row):
            t = _text(row.get("text"))
            return None if t is None else truncate(t, self.max_chars)

        records, skipped = _collect_records(rows, self.n, where, ("text",),
                                            "Wikipedia rows have 'id', 'url', 'title' and 'text'", text_of, "dewiki")
        return _pool_data(self, records, where=where, relation="ood", cache=cache,
                          prov=dict(prov, name="german_wiki"), stats={"rows_skipped": skipped})


@register_task("enron_users")
class EnronUsers(_HubTask):
    description = ("User-level records (Enron emails by sender, arXiv abstracts by submitter, ...): membership "
                   "unit is the user (Kandpal et al. 2024); a user's records share one pool.")
    params = (
        *_source_params("corbt/enron-emails", None, "train", 20000, True),
        Param("text_column", str, "body", "column of the text (arXiv: abstract)"),
        Param("user_column", str, "from", "column of the user (Enron: from; arXiv: submitter)"),
        Param("min_records_per_user", int, 3, "drop users with fewer records", low=1),
        Param("max_records_per_user", int, 50, "keep at most this many records per user (first in order)", low=1),
        Param("max_chars", int, 2000, "cut texts to this many characters", low=1, nullable=True),
        Param("relation", str, "ood", "relation to the pretraining corpus", choices=("ood", "iid", "overlap")),
        _PRETRAIN_PARAM,
        *pool_params(0.1, 0.3, 0.3, 0.3),
    )

    def build(self, cache=None) -> TaskData:
        rows, prov = self._open(cache)
        where = _where(prov, self.name)
        by_user: dict[str, list[dict[str, str]]] = {}
        seen: set[str] = set()
        skipped = 0
        for i, row in enumerate(_take(rows, self.n)):
            if i == 0:
                _require(row, (self.text_column, self.user_column), where,
                         "set text_column and user_column to the dataset's text and user columns")
            t, u = _text(row.get(self.text_column)), row.get(self.user_column)
            u = _text(str(u)) if u is not None and not isinstance(u, (list, dict)) else None
            if t is None or u is None:
                skipped += 1
                continue
            t = truncate(t, self.max_chars)
            if t in seen:
                skipped += 1
                continue
            seen.add(t)
            recs = by_user.setdefault(u, [])
            if len(recs) < self.max_records_per_user:
                recs.append({"id": text_id(t, "user-r"), "text": t, "user": u})
        kept = {u: r for u, r in by_user.items() if len(r) >= self.min_records_per_user}
        records = [r for u in sorted(kept) for r in kept[u]]
        if not records:
            raise DataError(f"{where}: no user has {self.min_records_per_user}+ records among the rows read "
                            f"({len(by_user)} users): raise n or lower min_records_per_user")
        return _pool_data(self, records, where=where, relation=self.relation, cache=cache, unit="user",
                          prov=dict(prov, name="enron_users", text_column=self.text_column,
                                    user_column=self.user_column),
                          stats={"rows_skipped": skipped, "users": len(kept),
                                 "users_dropped_too_few_records": len(by_user) - len(kept)})
