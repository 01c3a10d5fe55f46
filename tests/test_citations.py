"""Papers are cited by authors and year (docs/references.md), never by a file number, and no text names a path on
the machine the project was written on.

Walks the repository's text files (tracked, plus untracked ones git does not ignore) and flags, with file:line:

* "source 004", "sources 004 and 003", "source paper 004": a paper named by its number;
* a bare paper number: 000-004 standing alone as a word — "(002, 4.4)", "003 A.6", "001 Lemma 3.2", "004 B.6",
  "000's", "002 finds", "| 001 |". Parts of larger numbers (0.001, 1,000, 3,000,000, "100 000", "50 001") and
  quoted strings ("000") are not citations;
* an absolute path into the build machine's work or check directory, or any path through the seeds folder.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SELF = "tests/test_citations.py"
SUFFIXES = (".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".sh")

SOURCE_NUMBER = re.compile(r"\bsources?\s+(?:paper\s+)?00\d\b", re.IGNORECASE)
# 000-004 as a word of its own: not inside a larger number (0.001, 1,000, 1e-001, the "000" of "100 000"), an
# identifier, a path or a quoted string, and not continued by decimals or a thousands group (001.5, 000,000)
BARE_NUMBER = re.compile(r"(?<![\w.,:/\"'#-])(?<!\d )00[0-4]\b(?!\.?\d|,\d{3})")
MACHINE_PATH = re.compile(r"(?<![\w.~/-])/(?:work|check)/|shared/seeds")

RULES = (
    (SOURCE_NUMBER, "paper named by its number"),
    (BARE_NUMBER, "bare paper number"),
    (MACHINE_PATH, "machine path"),
)


def text_files(root: Path) -> list[str]:
    """Repository-relative paths of tracked and untracked-but-not-ignored files with a text suffix."""
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, check=True).stdout.decode("utf-8", "surrogateescape")
    return sorted({p for p in out.split("\0") if p.endswith(SUFFIXES) and p != SELF})


def find_problems(root: Path) -> list[str]:
    """``path:line: why: text`` for every offending line of the text files under ``root``."""
    problems = []
    for rel in text_files(root):
        path = root / rel
        if not path.is_file():  # deleted in the work tree, still in the index
            continue
        data = path.read_bytes()
        if b"\0" in data:  # binary
            continue
        for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            whys = [why for pattern, why in RULES if pattern.search(line)]
            if whys:
                problems.append(f"{rel}:{number}: {'; '.join(whys)}: {line.strip()[:160]}")
    return problems


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                    reason="needs a git checkout to list the repository's files")
def test_no_paper_numbers_or_machine_paths():
    problems = find_problems(ROOT)
    assert not problems, (f"{len(problems)} line(s) cite a paper by its number or name a machine path; cite papers "
                          "by authors and year (docs/references.md):\n" + "\n".join(problems))


@pytest.mark.parametrize("line", [
    "Empirical mitigations of source 002 (section 4.4)",
    "sources 004 (ROUGE-1) and 003 (ROUGE-L)",
    "from source paper 004 (section 6.1)",
    "description = (\"Per-user data limit (002, 4.4): keep",
    "λ = 0.5, τ = 1 (003 A.6)",
    "(002,4.4)",
    "(001 Lemma 3.2)",
    "| 004 B.6; 001 §5.2 |",
    "``kd`` is 003's pure logit-KD ablation",
    "(003: 1000)",
    "Direction as in 000 Table 2",
    "value = the 99th percentile (000 Fig. 1(b), Table 4)",
    "Source files are named as in `" + "/wo" + "rk/shared/seeds/README.md`",
    "see /check/run.log",
    "002 finds that batch and per-example clipping and early stopping do not stop user inference",
    "\"documents kept per user (002 goes from 100 down to 10)\"",
    "| `secret` | all texts carrying one secret | `secrets` | 001 |",
    "## Deviations from 003",
])
def test_rules_catch(line):
    assert any(pattern.search(line) for pattern, _ in RULES), line


@pytest.mark.parametrize("line", [
    "Param(\"lr\", float, 0.001, \"learning rate\")",
    "fprs=(0.001, 0.01, 0.05),",
    "assert ids == [\"000\", \"001\", \"002\", \"003\", \"004\"]",
    "(ranks 50 001–150 000 by document frequency), 1.7 M abstracts / 100 000 secrets)",
    "m = 1 000 secrets, (the paper: 100 000 and ≈ 1.7 M)",
    "about 4,000 characters, 3,000,000 characters per source",
    "Marek et al. 2026, appendix B.6; Ganesh et al. 2025, §5.2",
    "GUARD (anonymous preprint, 2025), appendix A.6",
    "https://example.org/" + "wo" + "rk/paper.pdf and ~/" + "wo" + "rk/notes",
    "3.0 * 1.001)",
    "a 001.5 ratio, 1 000,000 and 000,000 rows",
])
def test_rules_spare(line):
    assert not any(pattern.search(line) for pattern, _ in RULES), line
