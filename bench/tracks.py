"""Tracks: frozen benchmark settings that every leaderboard result is scored on.

A track fixes everything that decides what a number means — task, model, world sizes, the adaptation regime of
its anchors, games, attack battery, seeds, metric and utility settings — and leaves one thing open: the defenses.
Results of different tracks are never ranked together. Each track has a content hash of its frozen settings
(the resolved configuration, plugin versions included, and the game version), so a result names exactly what it
was measured on.

Every track carries two **anchors** (issue "Tracks"): ``none`` releases θ unchanged (0 % utility retained, no
adaptation leakage) and ``finetune`` is the undefended full-utility point. Utility retained,
(L(θ) − L(θ′)) / (L(θ) − L(θ′_finetune)) on the track's held-out split, is computed for every defense of every
world against them (:func:`utility_retained`).

A suite names a track with ``track: <name>`` and lists its defenses; it may also set ``name``, ``description``
and ``device``. Setting any frozen key is refused with the fix. Tracks live in ``bench/tracks/<name>.yaml``.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.errors import ConfigError
from bench.hashing import content_hash

TRACK_DIR = Path(__file__).resolve().parent / "tracks"
#: what a track freezes: a suite naming the track may not set these
FROZEN_KEYS = ("seeds", "tasks", "models", "attacks", "games", "world", "reference", "metrics", "utility", "shadows",
               "audit")
#: what a suite naming a track may set
OPEN_KEYS = ("track", "name", "description", "defenses", "device")
#: the anchors every track adds ahead of the suite's defenses
ANCHOR_LABELS = ("none", "finetune")


@dataclass(frozen=True)
class Track:
    name: str
    description: str
    headline_game: str
    raw: dict[str, Any]          # the track file: frozen keys, anchors, headline game
    path: str

    @property
    def anchors(self) -> list[Any]:
        return list(self.raw["anchors"])

    def suite_raw(self, defenses: list[Any] | None = None, **open_keys: Any) -> dict[str, Any]:
        """The suite a track run is: the frozen settings, the anchors, then ``defenses``."""
        raw = {k: self.raw[k] for k in FROZEN_KEYS if k in self.raw}
        raw.update(name=open_keys.get("name") or self.name,
                   description=open_keys.get("description") or self.description)
        if open_keys.get("device") is not None:
            raw["device"] = open_keys["device"]
        raw["defenses"] = self.anchors + [d for d in (defenses or []) if not _is_anchor_entry(d, self.anchors)]
        return raw

    @property
    def hash(self) -> str:
        """Content hash of what the track freezes: its settings as written, the resolved parameters and versions of
        every task, attack and anchor plugin (defaults included), the resolved world, and the game version.

        Models enter as written (name and parameters), not resolved: a released checkpoint resolves to a local
        path, which must not make the same track hash differently on two machines."""
        from bench.game import GAME_VERSION, WORLD_PARAMS, keyed_world
        from bench.params import validate_params
        from bench.registry import ATTACKS, DEFENSES, TASKS

        def resolved(entries: list[Any], registry) -> list[dict]:
            out = []
            for e in entries:
                e = {"name": e} if isinstance(e, str) else dict(e)
                inst = registry.create(e["name"], e.get("params") or {})
                out.append({"label": e.get("label", e["name"]), "name": e["name"], "version": inst.version,
                            "params": inst.config})
            return out

        frozen = {k: self.raw[k] for k in FROZEN_KEYS if k in self.raw}
        frozen.update(tasks=resolved(self.raw["tasks"], TASKS), attacks=resolved(self.raw["attacks"], ATTACKS),
                      world=keyed_world(validate_params("world", WORLD_PARAMS, self.raw.get("world"))))
        return content_hash("track", self.name, frozen, resolved(self.anchors, DEFENSES), self.headline_game,
                            GAME_VERSION, length=12)


def _is_anchor_entry(entry: Any, anchors: list[Any]) -> bool:
    """A suite may list an anchor again exactly as the track has it; it is then counted once."""
    return entry in anchors


def bundled_tracks() -> list[str]:
    return sorted(p.stem for p in TRACK_DIR.glob("*.yaml"))


def load_track(name: str) -> Track:
    """The bundled track ``name``; an unknown name gets the list of tracks and a suggestion."""
    path = TRACK_DIR / f"{name}.yaml"
    if not isinstance(name, str) or not path.is_file():
        close = difflib.get_close_matches(str(name), bundled_tracks(), n=1)
        raise ConfigError(f"unknown track '{name}': " + (f"did you mean '{close[0]}'? " if close else "") +
                          f"tracks are {', '.join(bundled_tracks())} (`privbench tracks` lists them)")
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    missing = [k for k in ("track", "headline_game", "anchors", "tasks", "models", "attacks", "seeds") if k not in raw]
    if missing:  # pragma: no cover - a bundled file is checked by the tests
        raise ConfigError(f"track file {path.name} lacks {missing}")
    labels = [a if isinstance(a, str) else a.get("label", a["name"]) for a in raw["anchors"]]
    if tuple(labels) != ANCHOR_LABELS:  # pragma: no cover - a bundled file is checked by the tests
        raise ConfigError(f"track file {path.name}: anchors must be {ANCHOR_LABELS}, got {labels}")
    return Track(name=str(raw["track"]), description=str(raw.get("description", "")),
                 headline_game=str(raw["headline_game"]), raw=raw, path=str(path))


def suite_from_track(raw: dict[str, Any], where: str) -> tuple[dict[str, Any], Track]:
    """A suite mapping that names ``track`` → the full suite mapping; frozen keys set by the suite are refused."""
    track = load_track(raw["track"])
    frozen = [k for k in raw if k in FROZEN_KEYS]
    if frozen:
        raise ConfigError(f"suite '{where}' names track '{track.name}', which freezes {', '.join(sorted(frozen))}: "
                          f"remove {'it' if len(frozen) == 1 else 'them'} from the suite (or drop `track` and write a "
                          f"suite of your own, whose results are not ranked on the track)")
    unknown = [k for k in raw if k not in OPEN_KEYS and k not in FROZEN_KEYS]
    if unknown:
        raise ConfigError(f"suite '{where}': unknown key '{sorted(map(str, unknown))[0]}': a suite naming a track may "
                          f"set {', '.join(OPEN_KEYS)}")
    defenses = raw.get("defenses") or []
    if not isinstance(defenses, list):
        raise ConfigError(f"suite '{where}': 'defenses' must be a list of names or {{name, params}} mappings")
    for d in defenses:
        label = d if isinstance(d, str) else (d.get("label") or d.get("name")) if isinstance(d, dict) else None
        if label in ANCHOR_LABELS and not _is_anchor_entry(d, track.anchors):
            raise ConfigError(f"suite '{where}': '{label}' is an anchor of track '{track.name}' with frozen "
                              f"settings: remove it from defenses (the track adds it) or give your entry another "
                              f"label")
    return track.suite_raw(defenses, name=raw.get("name"), description=raw.get("description"),
                           device=raw.get("device")), track


def utility_retained(base_loss: float, finetune_loss: float, loss: float) -> float | None:
    """(L(θ) − L(θ′)) / (L(θ) − L(θ′_finetune)): the share of fine-tuning's held-out gain a release keeps.

    None when fine-tuning gained nothing (the ratio has no meaning: the world does not measure utility)."""
    gain = base_loss - finetune_loss
    if not gain > 0:
        return None
    return float((base_loss - loss) / gain)
