"""A user's own dataset as a task: the same ``datasets`` reading path as the hub loaders.

:func:`load_records` reads one ``.jsonl`` (JSON lines), ``.json`` (a list of
records, or JSON lines), ``.parquet`` or ``.csv`` file into records
``{"id": str, "text": str[, "user": str]}``. The file is checked first, so a
bad file fails with one :class:`bench.errors.DataError` line naming the file,
the place (line, row or byte offset) and the fix: missing file, unknown
extension, 0 bytes or 0 rows, bytes that are not UTF-8, a malformed JSON line,
a missing text/id/user column (the columns present are listed), an empty or
non-string text, a duplicate id. It is then read with
``datasets.load_dataset("json" | "parquet" | "csv", data_files=..., streaming=True)``
(the path hub data takes in :mod:`tasks.hub`): local files are read in place,
never copied; the only thing ``datasets`` writes is lock files, under
``<privbench cache>/hf_datasets`` (never ``~/.cache/huggingface``), and it
needs no network (works with ``HF_DATASETS_OFFLINE=1``). CSV cells are read as
strings (ids like ``007`` stay ``"007"``, a text ``NA`` stays ``"NA"``).

Record ids: the ``id_column`` value as a string, else ``"r-" + sha1(text)[:16]``
(content-derived, so a record keeps its id and partition when the file is
reordered). Exact duplicate texts are dropped, keeping the first: a text that
sits in two partitions would be a member and a non-member at once.

The ``local_text`` task hash-partitions the records (by record id; by document
when ``document_column`` is given, so that chunks of one document share a
partition; by user when ``user_column`` is given: all of a user's records share
a partition) into held-out, population, adaptation and target pools with
:func:`tasks.partition.assign_partition`. The pretraining corpus is a second
file (``pretrain_path``) or, by default, the pretraining partition of
``mini_pile``; texts equal to one of the user's records are removed from it.
"""

from __future__ import annotations

import csv
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from bench.errors import ConfigError, DataError, PrivbenchError
from bench.params import Param
from bench.registry import register_task
from bench.task import TargetRecord, Task, TaskData
from tasks.partition import assign_partition

__all__ = ["FORMATS", "POOLS", "LocalText", "load_records", "inspect_file", "read_rows", "file_format", "text_id",
           "hf_cache_dir", "partition_records", "assemble_task_data", "pool_params", "pool_weights",
           "require_nonempty", "load_pretrain", "record_documents"]

#: file formats and the ``datasets`` packaged builder that reads each
FORMATS = {"jsonl": "json", "json": "json", "parquet": "parquet", "csv": "csv"}
_EXTENSIONS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
#: the non-pretraining pools a task's records are partitioned into
POOLS = ("heldout", "population", "adapt", "targets")


# ------------------------------------------------------------------------------------------------
# reading and checking files


def hf_cache_dir(root: str | Path | None = None) -> Path:
    """Where ``datasets`` may write (lock files for local data, downloads for hub data): under privbench's cache."""
    if root is None:
        from bench.cache import default_cache_dir
        root = default_cache_dir()
    path = Path(root) / "hf_datasets"
    path.mkdir(parents=True, exist_ok=True)
    return path


def file_format(path: Path, format: str | None = None) -> str:
    """``jsonl`` / ``json`` / ``parquet`` / ``csv`` from ``format`` or the file extension."""
    if format is not None:
        if format not in FORMATS:
            raise ConfigError(f"{path.name}: format {format!r} is unknown: use one of {', '.join(FORMATS)}")
        return format
    fmt = _EXTENSIONS.get(path.suffix.lower())
    if fmt is None:
        raise DataError(f"{path}: unknown extension '{path.suffix or '(none)'}': use a .jsonl, .json, .parquet or "
                        f".csv file, or pass format=jsonl|json|parquet|csv")
    return fmt


def _check_file(path: Path) -> None:
    if not path.exists():
        raise DataError(f"{path}: no such file: check the path (relative paths start at {Path.cwd()})")
    if path.is_dir():
        raise DataError(f"{path}: is a directory: give the data file inside it")
    if path.stat().st_size == 0:
        raise DataError(f"{path}: the file is empty (0 bytes): give a file with at least one record")


def _utf8_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, decoded line) of a text file; a non-UTF-8 byte fails with its byte offset and line."""
    offset = 0
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                pos = offset + exc.start
                raise DataError(f"{path}: byte 0x{raw[exc.start]:02x} at byte offset {pos} (line {lineno}) is not "
                                f"UTF-8: re-save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None
            if lineno == 1 and line.startswith("\ufeff"):
                line = line[1:]
            offset += len(raw)
            yield lineno, line


def _too_deep(path: Path, lineno: int | None) -> DataError:
    where = f"line {lineno}" if lineno is not None else "the file"
    return DataError(f"{path}: {where} nests JSON values deeper than Python can read: records are flat objects "
                     f'of fields, e.g. {{"text": "..."}}')


def _json_error(path: Path, lineno: int, exc: json.JSONDecodeError) -> DataError:
    return DataError(f"{path}: line {lineno} is not valid JSON ({exc.msg}, column {exc.colno}): fix or remove "
                     f"that line (JSON lines: one complete object per line)")


def _scan_jsonl(path: Path) -> tuple[list[int], list[str]]:
    """Line numbers of the records and the union of their keys; fails at the first malformed line."""
    lines: list[int] = []
    keys: dict[str, None] = {}
    for lineno, line in _utf8_lines(path):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise _json_error(path, lineno, exc) from None
        except RecursionError:
            raise _too_deep(path, lineno) from None
        if not isinstance(obj, dict):
            raise DataError(f"{path}: line {lineno} is a JSON {type(obj).__name__}, not an object: write one "
                            f'object per line, e.g. {{"text": "..."}}')
        keys.update(dict.fromkeys(obj))
        lines.append(lineno)
    return lines, list(keys)


def _scan_json(path: Path) -> tuple[str, list[int] | None, int, list[str]]:
    """('list' | 'jsonl', line numbers or None, number of records, keys) of a .json file."""
    text = "".join(line for _, line in _utf8_lines(path))
    try:
        obj = json.loads(text)
    except RecursionError:
        raise _too_deep(path, None) from None
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":  # several top-level values: JSON lines in a .json file
            lines, keys = _scan_jsonl(path)
            return "jsonl", lines, len(lines), keys
        raise DataError(f"{path}: not valid JSON at line {exc.lineno}, column {exc.colno} ({exc.msg}): fix the file; "
                        f"it must be a list of objects [{{...}}, ...] or one object per line") from None
    if isinstance(obj, dict):
        lists = [k for k, v in obj.items() if isinstance(v, list)]
        hint = f" (the records look like they are under '{lists[0]}': save that list alone)" if lists else ""
        raise DataError(f"{path}: the top-level JSON value is an object, not a list of records{hint}: write "
                        f"[{{...}}, {{...}}] or one object per line")
    if not isinstance(obj, list):
        raise DataError(f"{path}: the top-level JSON value is a {type(obj).__name__}: write a list of objects "
                        f"[{{...}}, ...] or one object per line")
    keys: dict[str, None] = {}
    for i, rec in enumerate(obj, start=1):
        if not isinstance(rec, dict):
            raise DataError(f"{path}: record {i} of the JSON list is a {type(rec).__name__}, not an object: "
                            f"make every element an object like {{\"text\": \"...\"}}")
        keys.update(dict.fromkeys(rec))
    return "list", None, len(obj), list(keys)


def _csv_header(path: Path) -> list[str]:
    for _ in _utf8_lines(path):  # encoding check of the whole file
        pass
    with path.open(encoding="utf-8-sig", newline="") as f:
        try:
            header = next(csv.reader(f), None)
        except csv.Error as exc:
            raise DataError(f"{path}: cannot read the CSV header ({exc}): fix the first line") from None
    if not header or not any(h.strip() for h in header):
        raise DataError(f"{path}: the CSV file has no header line: put the column names (e.g. text) on line 1")
    names = [h if h != "" else f"Unnamed: {i}" for i, h in enumerate(header)]  # pandas' names for blank headers
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise DataError(f"{path}: the CSV header names column '{dup}' twice: give every column a distinct name")
    return names


def _parquet_info(path: Path) -> tuple[int, list[str]]:
    import pyarrow.parquet as pq
    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid / OSError for non-parquet bytes
        raise DataError(f"{path}: not a readable Parquet file ({str(exc).splitlines()[0]}): re-export it, e.g. "
                        f"pandas.DataFrame.to_parquet, or rename it to its real extension") from None
    return pf.metadata.num_rows, list(pf.schema_arrow.names)


@dataclass
class FileInfo:
    """What the checks found out about a file before ``datasets`` reads it."""

    path: Path
    format: str
    n_rows: int
    columns: list[str]
    lines: list[int] | None = None           # JSON lines: line number of each record
    builder_kwargs: dict[str, Any] = field(default_factory=dict)

    def where(self, i: int) -> str:
        """Human position of record ``i`` (0-based)."""
        if self.lines is not None:
            return f"line {self.lines[i]}"
        if self.format == "csv":
            return f"row {i + 1} (after the header)"
        if self.format == "json":
            return f"record {i + 1}"
        return f"row {i + 1}"


def inspect_file(path: str | Path, format: str | None = None) -> FileInfo:
    """Check a data file (existence, size, encoding, JSON syntax) and return its format, row count and columns."""
    path = Path(path).expanduser()
    fmt = file_format(path, format)
    _check_file(path)
    if fmt == "jsonl":
        lines, keys = _scan_jsonl(path)
        info = FileInfo(path, fmt, len(lines), keys, lines)
    elif fmt == "json":
        kind, lines, n, keys = _scan_json(path)
        info = FileInfo(path, "jsonl" if kind == "jsonl" else "json", n, keys, lines)
    elif fmt == "csv":
        from datasets import Features, Value
        names = _csv_header(path)
        info = FileInfo(path, fmt, -1, names, builder_kwargs={
            "features": Features({n: Value("string") for n in names}), "keep_default_na": False})
    else:
        n, names = _parquet_info(path)
        info = FileInfo(path, fmt, n, names)
    if info.n_rows == 0:
        raise DataError(f"{path}: the file has 0 records: give a file with at least one record")
    return info


def read_rows(paths: Sequence[str | Path], format: str, *, cache_dir: str | Path | None = None,
              builder_kwargs: Mapping[str, Any] | None = None, what: str | None = None) -> Iterator[dict[str, Any]]:
    """Rows of local files through ``datasets.load_dataset(<builder>, data_files=..., streaming=True)``.

    ``cache_dir`` is the privbench cache root (``datasets`` writes only lock files, under its ``hf_datasets``).
    Errors raised by ``datasets`` while opening or reading become one-line :class:`DataError` s naming ``what``
    (default: the first file).
    """
    paths = [str(Path(p).expanduser()) for p in paths]
    what = what or (paths[0] if len(paths) == 1 else f"{paths[0]} (+{len(paths) - 1} files)")
    builder = FORMATS[format]
    try:
        from datasets import load_dataset
        from datasets.utils import logging as ds_logging
        ds_logging.set_verbosity(ds_logging.CRITICAL)  # a read error is reported once, by privbench, not also logged
        ds = load_dataset(builder, data_files=paths, split="train", streaming=True,
                          cache_dir=str(hf_cache_dir(cache_dir)),
                          **dict(builder_kwargs or {}))
        it = iter(ds)
    except PrivbenchError:
        raise
    except Exception as exc:
        raise _read_error(what, format, exc) from None
    while True:
        try:
            row = next(it)
        except StopIteration:
            return
        except Exception as exc:
            raise _read_error(what, format, exc) from None
        yield row


def _read_error(what: str, fmt: str, exc: Exception) -> DataError:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, UnicodeDecodeError):
        return DataError(f"{what}: {first}: the file is not UTF-8: re-save it as UTF-8")
    low = first.lower()
    if "expected" in low and "fields" in low:
        hint = "every line needs as many fields as the header: quote values that hold the separator"
    elif "surrogate" in low:
        hint = "a string holds an invalid \\u escape (a lone surrogate): fix or remove that record"
    elif "type" in low or "schema" in low or "cast" in low:
        hint = "every value of a column must have the same type"
    else:
        hint = f"it must be valid {fmt} throughout"
    return DataError(f"{what}: cannot read it as {fmt} ({type(exc).__name__}: {first[:300]}): check the file "
                     f"({hint})")


def _as_id(value: Any) -> str | None:
    if value is None or isinstance(value, (dict, list)):
        return None
    if isinstance(value, float):
        if value != value:  # NaN
            return None
        if value.is_integer():
            value = int(value)
    s = str(value).strip()
    return s or None


def text_id(text: str, prefix: str = "r") -> str:
    return f"{prefix}-{hashlib.sha1(text.encode('utf-8')).hexdigest()[:16]}"


def _load(path: str | Path, *, text_column: str = "text", id_column: str | None = None,
          user_column: str | None = None, format: str | None = None, cache_dir: str | Path | None = None,
          drop_duplicate_texts: bool = True,
          document_column: str | None = None) -> tuple[list[dict[str, str]], dict[str, Any]]:
    info = inspect_file(path, format)
    p = info.path
    need = [("text", text_column)] + ([("id", id_column)] if id_column else []) + (
        [("user", user_column)] if user_column else []) + ([("document", document_column)] if document_column else [])
    for role, col in need:
        if col not in info.columns:
            cols = ", ".join(repr(c) for c in info.columns) or "none"
            flag = f"{role}_column"
            raise DataError(f"{p}: no {role} column '{col}' (columns present: {cols}): set {flag} to one of them")
    records: list[dict[str, str]] = []
    seen_ids: dict[str, int] = {}
    seen_texts: set[str] = set()
    dropped = 0
    n = 0
    for i, row in enumerate(read_rows([p], info.format, cache_dir=cache_dir, builder_kwargs=info.builder_kwargs,
                                      what=str(p))):
        n += 1
        text = row.get(text_column)
        if text is not None and not isinstance(text, str):
            raise DataError(f"{p}: {info.where(i)}: '{text_column}' is a {type(text).__name__} ({str(text)[:40]!r}), "
                            f"not a string: store the text as a string")
        if text is None or not text.strip():
            raise DataError(f"{p}: {info.where(i)}: '{text_column}' is empty: fill it in or remove the row")
        rec = {"text": text}
        if id_column:
            rid = _as_id(row.get(id_column))
            if rid is None:
                raise DataError(f"{p}: {info.where(i)}: id column '{id_column}' is empty: give every row an id")
            if rid in seen_ids:
                raise DataError(f"{p}: duplicate id {rid!r} ({info.where(seen_ids[rid])} and {info.where(i)}): "
                                f"make the ids in '{id_column}' unique")
            seen_ids[rid] = i
        else:
            rid = text_id(text)
        rec["id"] = rid
        if user_column:
            user = _as_id(row.get(user_column))
            if user is None:
                raise DataError(f"{p}: {info.where(i)}: user column '{user_column}' is empty: give every row a user")
            rec["user"] = user
        if document_column:
            doc = _as_id(row.get(document_column))
            if doc is None:
                raise DataError(f"{p}: {info.where(i)}: document column '{document_column}' is empty: give every row "
                                f"its document")
            rec["document"] = doc
        if text in seen_texts:
            if drop_duplicate_texts:
                dropped += 1
                continue
        seen_texts.add(text)
        records.append(rec)
    if n == 0:
        raise DataError(f"{p}: the file has 0 records: give a file with at least one record")
    return records, {"file": str(p), "format": info.format, "rows": n, "duplicate_texts_dropped": dropped,
                     "columns": info.columns}


def load_records(path: str | Path, *, text_column: str = "text", id_column: str | None = None,
                 user_column: str | None = None, format: str | None = None,
                 cache_dir: str | Path | None = None, drop_duplicate_texts: bool = True) -> list[dict[str, str]]:
    """Records ``{"id", "text"[, "user"]}`` of a .jsonl/.json/.parquet/.csv file, in file order.

    Raises :class:`DataError` (one line: the file, the problem, the fix) for any file the task could not use.
    ``cache_dir`` is the privbench cache root (default ``$PRIVBENCH_CACHE`` or ``~/.cache/privbench``).
    """
    return _load(path, text_column=text_column, id_column=id_column, user_column=user_column, format=format,
                 cache_dir=cache_dir, drop_duplicate_texts=drop_duplicate_texts)[0]


# ------------------------------------------------------------------------------------------------
# records -> TaskData (shared with tasks.hub)


def partition_records(records: Sequence[Mapping[str, Any]], *, salt: str, weights: Mapping[str, float],
                      key: str = "id") -> dict[str, list[Mapping[str, Any]]]:
    """Hash-partition records by ``record[key]`` (``"user"`` keeps a user's records together); file order kept."""
    out: dict[str, list[Mapping[str, Any]]] = {name: [] for name in weights}
    for rec in records:
        out[assign_partition(str(rec[key]), salt, weights)].append(rec)
    return out


def _fingerprint(name: str, pretrain: Sequence[str], pools: Mapping[str, Sequence[str]],
                 targets: Sequence[TargetRecord], extra: Any) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([name, extra], sort_keys=True, default=str).encode("utf-8"))
    for part, texts in (("pretrain", pretrain), *((k, pools[k]) for k in sorted(pools))):
        h.update(b"\x1e" + part.encode())
        for t in texts:
            h.update(b"\x1f" + hashlib.sha1(t.encode("utf-8")).digest())
    h.update(b"\x1etargets")
    for r in targets:
        h.update(b"\x1f" + r.id.encode("utf-8") + b"\x1d" + hashlib.sha1(r.text.encode("utf-8")).digest())
    return h.hexdigest()[:32]


def assemble_task_data(name: str, *, pretrain: Sequence[str], heldout: Sequence[str], population: Sequence[str],
                       adapt: Sequence[str], targets: Sequence[TargetRecord], relation: str, unit: str = "record",
                       target_meta: Mapping[str, Mapping[str, Any]] | None = None,
                       sources: Sequence[Mapping[str, Any]] = (), stats: Mapping[str, Any] | None = None,
                       config: Mapping[str, Any] | None = None,
                       adapt_owners: Sequence[str] | None = None,
                       adapt_docs: Sequence[str] | None = None,
                       target_docs: Sequence[str] | None = None) -> TaskData:
    """TaskData with a fingerprint over the config, every partition's texts and the target ids and metadata.

    ``adapt_owners`` (the user of each adaptation record) is required for unit ``"user"``: without it every
    background record would be its own owner while target users own several records, so a defense could tell
    the targets apart by their owners' record counts. ``adapt_docs`` and ``target_docs`` (the document of each
    adaptation and target record) let a world pool the two partitions and split them by document under its own
    salt (bench.pools), so that a defense that rebuilds the task cannot tell targets by their partition."""
    if unit == "user":
        if adapt_owners is None or len(adapt_owners) != len(adapt):
            raise DataError(f"task '{name}' has membership unit 'user' but names the owners of "
                            f"{0 if adapt_owners is None else len(adapt_owners)} of its {len(adapt)} adaptation "
                            f"records: give every adaptation record its user (adapt_owners)")
    elif adapt_owners is not None:
        raise DataError(f"task '{name}': adapt_owners is given but the membership unit is {unit!r}: owners belong "
                        f"to user tasks")
    if (adapt_docs is None) != (target_docs is None):
        raise DataError(f"task '{name}': documents are given for only one of the adaptation and target partitions: "
                        f"give both (adapt_docs and target_docs) or neither")
    if adapt_docs is not None and target_docs is not None:
        if unit != "record":
            raise DataError(f"task '{name}': documents are given but the membership unit is {unit!r}: documents "
                            f"belong to record tasks (a user's or a secret's records already share a partition)")
        for what, docs, recs in (("adaptation", adapt_docs, adapt), ("target", target_docs, targets)):
            if len(docs) != len(recs):
                raise DataError(f"task '{name}': {len(docs)} documents for {len(recs)} {what} records: give each "
                                f"{what} record its document")
    meta = {k: dict(v) for k, v in (target_meta or {}).items()}
    pools = {"heldout": list(heldout), "population": list(population), "adapt": list(adapt)}
    extra = {"relation": relation, "unit": unit, "meta": meta, "config": dict(config or {})}
    if adapt_owners is not None:
        extra["adapt_owners"] = list(adapt_owners)
    if adapt_docs is not None and target_docs is not None:  # the pool split groups by them: part of what a world is
        extra["docs"] = [list(map(str, adapt_docs)), list(map(str, target_docs))]
    fp = _fingerprint(name, pretrain, pools, targets, extra)
    st = dict(stats or {})
    st.update({"pretrain": len(pretrain), "heldout": len(heldout), "population": len(population),
               "adapt": len(adapt), "targets": len(targets)})
    return TaskData(name=name, pretrain=tuple(pretrain), heldout=tuple(heldout), population=tuple(population),
                    adapt=tuple(adapt), targets=tuple(targets), fingerprint=fp, sources=tuple(dict(s) for s in sources),
                    stats=st, relation=relation, unit=unit, target_meta=meta, public_format=None,
                    adapt_owners=None if adapt_owners is None else tuple(str(u) for u in adapt_owners),
                    adapt_docs=None if adapt_docs is None else tuple(map(str, adapt_docs)),
                    target_docs=None if target_docs is None else tuple(map(str, target_docs)))


def pool_params(heldout: float, population: float, adapt: float, targets: float) -> tuple[Param, ...]:
    """Partition-weight parameters (relative; all > 0) with the given defaults."""
    return (
        Param("heldout_weight", float, heldout, "relative size of the held-out pool (utility evaluation)",
              low=0.0, low_inclusive=False),
        Param("population_weight", float, population, "relative size of the attacker's population pool",
              low=0.0, low_inclusive=False),
        Param("adapt_weight", float, adapt, "relative size of the adaptation pool D", low=0.0, low_inclusive=False),
        Param("targets_weight", float, targets, "relative size of the target pool", low=0.0, low_inclusive=False),
    )


def pool_weights(task: Task) -> dict[str, float]:
    return {name: float(getattr(task, f"{name}_weight")) for name in POOLS}


def require_nonempty(parts: Mapping[str, Sequence[Any]], *, where: str, n_records: int, unit: str = "record",
                     n_units: int | None = None) -> None:
    for name in POOLS:
        if not parts.get(name):
            size = f"{n_records} records" + (f" of {n_units} users" if unit == "user" and n_units is not None else "")
            raise DataError(f"{where}: partition '{name}' is empty ({size} split into {', '.join(POOLS)}): add more "
                            f"{'users' if unit == 'user' else 'rows'} (a few hundred at least) or raise "
                            f"{name}_weight")


def default_pretrain(cache=None) -> tuple[list[str], dict[str, Any]]:
    """The pretraining partition of ``mini_pile`` with its default parameters (shares mini_pile's cache)."""
    from tasks.mini_pile import MiniPile
    mp = MiniPile()
    data = mp.build(cache)
    return list(data.pretrain), {"name": "mini_pile", "kind": "task", "fingerprint": data.fingerprint,
                                 "params": mp.config}


def load_pretrain(path: str | None, *, text_column: str, format: str | None = None, cache=None,
                  exclude: set[str] | None = None) -> tuple[list[str], dict[str, Any], int]:
    """(pretraining texts, provenance, number removed because they equal a task record)."""
    if path:
        recs = load_records(path, text_column=text_column, format=format,
                            cache_dir=getattr(cache, "root", None))
        texts = [r["text"] for r in recs]
        prov = {"name": "pretrain_file", "kind": "local", "path": str(Path(path).expanduser()),
                "text_column": text_column}
    else:
        texts, prov = default_pretrain(cache)
    removed = 0
    if exclude:
        kept = [t for t in texts if t not in exclude]
        removed = len(texts) - len(kept)
        texts = kept
    if not texts:
        raise DataError(f"{path or 'mini_pile'}: the pretraining corpus is empty after removing texts that are also "
                        f"task records: give a pretraining file with other texts")
    return texts, prov, removed


# ------------------------------------------------------------------------------------------------
# the task


@register_task("local_text")
class LocalText(Task):
    needs = "a local data file: --params path=<file.jsonl|.json|.parquet|.csv>"

    version = "0.2.0"  # 0.2.0: records carry their documents, and worlds pool (bench.pools)
    description = ("A user's own .jsonl/.json/.parquet/.csv file, hash-partitioned into held-out, population, "
                   "adaptation and target pools; pretraining on a second file or on mini_pile's pretraining part.")
    params = (
        Param("path", str, "", "data file (.jsonl, .json, .parquet, .csv); required"),
        Param("text_column", str, "text", "column holding the text"),
        Param("id_column", str, None, "column of unique record ids (default: ids from the text)", nullable=True),
        Param("user_column", str, None, "column of user ids: membership unit becomes the user", nullable=True),
        Param("document_column", str, None, "column naming each record's document (chunks of one text): a "
              "document's records share a partition and a side of the world's pool split (default: each record "
              "is its own document)", nullable=True),
        Param("format", str, None, "file format when the extension does not say it", nullable=True,
              choices=tuple(FORMATS)),
        Param("pretrain_path", str, None, "pretraining corpus file (default: mini_pile's pretraining partition)",
              nullable=True),
        Param("pretrain_text_column", str, None, "text column of pretrain_path (default: text_column)",
              nullable=True),
        Param("relation", str, None, "relation of the records to pretraining (default: iid with pretrain_path, "
              "ood with mini_pile)", nullable=True, choices=("iid", "ood")),
        *pool_params(0.1, 0.3, 0.2, 0.4),
        Param("salt", str, "privbench-v1", "partition salt; changing it draws new partitions"),
    )

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        if not self.path:
            raise ConfigError("task 'local_text': parameter 'path' is required: give the data file, "
                              "e.g. params: {path: data/my_records.jsonl}")
        if self.user_column and self.document_column:
            raise ConfigError("task 'local_text': user_column and document_column are both set: with user_column "
                              "the user is the membership unit and a user's records already share a partition; "
                              "drop document_column")

    def build(self, cache=None) -> TaskData:
        cache_root = getattr(cache, "root", None)
        records, info = _load(self.path, text_column=self.text_column, id_column=self.id_column,
                              user_column=self.user_column, format=self.format, cache_dir=cache_root,
                              document_column=self.document_column)
        unit = "user" if self.user_column else "record"
        key = "user" if self.user_column else "document" if self.document_column else "id"
        parts = partition_records(records, salt=self.salt, weights=pool_weights(self), key=key)
        require_nonempty(parts, where=info["file"], n_records=len(records), unit=unit,
                         n_units=len({r["user"] for r in records}) if self.user_column else None)
        pretrain, prov, removed = load_pretrain(
            self.pretrain_path, text_column=self.pretrain_text_column or self.text_column, cache=cache,
            exclude={r["text"] for r in records})
        relation = self.relation or ("iid" if self.pretrain_path else "ood")
        targets = [TargetRecord(r["id"], r["text"]) for r in parts["targets"]]
        meta = {r["id"]: {"user": r["user"]} for r in parts["targets"]} if self.user_column else {}
        src = {"name": "local_text", "kind": "local", "path": info["file"], "format": info["format"],
               "text_column": self.text_column, "id_column": self.id_column, "user_column": self.user_column,
               "document_column": self.document_column}
        stats = {"rows": info["rows"], "records": len(records), "duplicate_texts_dropped":
                 info["duplicate_texts_dropped"], "pretrain_removed_as_task_records": removed}
        if self.user_column:
            stats["users"] = len({r["user"] for r in records})
        return assemble_task_data(
            self.name, pretrain=pretrain, heldout=[r["text"] for r in parts["heldout"]],
            population=[r["text"] for r in parts["population"]], adapt=[r["text"] for r in parts["adapt"]],
            targets=targets, relation=relation, unit=unit, target_meta=meta, sources=[src, prov], stats=stats,
            config=self.config, adapt_owners=[r["user"] for r in parts["adapt"]] if self.user_column else None,
            **({} if self.user_column else record_documents(parts, key)))


def record_documents(parts: Mapping[str, Sequence[Mapping[str, Any]]], key: str = "id") -> dict[str, list[str]]:
    """``adapt_docs`` and ``target_docs`` of a record task: each record's ``key`` (its document, or the record
    itself when records are whole documents)."""
    return {"adapt_docs": [str(r[key]) for r in parts["adapt"]],
            "target_docs": [str(r[key]) for r in parts["targets"]]}
