"""Tracks: frozen settings with a content hash, anchors added, frozen keys refused, utility retained by definition."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from bench.errors import ConfigError
from bench.suite import load_suite, parse_suite
from bench.tracks import ANCHOR_LABELS, FROZEN_KEYS, bundled_tracks, load_track, utility_retained

REQUIRED = {"quick", "canaries", "pii", "users", "secrets"}


def test_bundled_tracks_load_with_anchors_and_distinct_hashes():
    names = bundled_tracks()
    assert REQUIRED <= set(names)
    hashes = {load_track(n).hash for n in names}
    assert len(hashes) == len(names)
    for n in names:
        t = load_track(n)
        suite = parse_suite(t.suite_raw(), path=t.path)
        assert [d.label for d in suite.defenses][:2] == list(ANCHOR_LABELS)
        assert suite.utility["retained"] is True
        assert t.headline_game in {g.name for g in suite.games}
        null = suite.world["n_null"] // 2
        assert "null" not in {g.name for g in suite.games} or null >= 200, n   # null controls with power


def test_tracks_that_pretrain_theta_put_a_matched_share_of_the_background_in_s():
    """The leaderboard ranks defenses where θ's memory of S marks no target of D̃ (docs/submitting.md): every track
    whose θ privbench pretrains sets ``background_in_pretraining: matched``; a track on a released model cannot."""
    for n in bundled_tracks():
        suite = parse_suite(load_track(n).suite_raw())
        scratch = all(m.source == "scratch" for m in suite.models)
        assert suite.world["background_in_pretraining"] == ("matched" if scratch else "none"), n


def test_a_suite_naming_a_track_inherits_it_and_records_its_hash():
    s = parse_suite({"track": "quick", "name": "mine", "defenses": ["lora", {"name": "finetune", "label": "ft2",
                                                                            "params": {"epochs": 2}}]})
    t = load_track("quick")
    assert [d.label for d in s.defenses] == ["none", "finetune", "lora", "ft2"]
    assert s.track == {"name": "quick", "hash": t.hash, "headline_game": "adapt"}
    assert s.config["track"]["hash"] == t.hash and s.world == parse_suite(t.suite_raw()).world
    assert load_suite("quick").track["hash"] == t.hash      # the README's main job runs on the quick track


def test_track_hash_changes_with_any_frozen_setting():
    t = load_track("quick")
    base = t.hash
    raw = dict(t.raw, world=dict(t.raw["world"], n_per_group=99))
    other = type(t)(t.name, t.description, t.headline_game, raw, t.path)
    assert other.hash != base and load_track("quick").hash == base


@pytest.mark.parametrize("key", FROZEN_KEYS)
def test_overriding_a_frozen_setting_is_refused_with_the_fix(key):
    with pytest.raises(ConfigError, match=f"freezes {key}: remove it from the suite") as err:
        parse_suite({"track": "quick", "defenses": ["lora"], key: {}})
    assert "\n" not in str(err.value)


def test_unknown_track_and_redefined_anchor_are_refused():
    with pytest.raises(ConfigError, match="unknown track 'quik': did you mean 'quick'"):
        parse_suite({"track": "quik", "defenses": ["lora"]})
    with pytest.raises(ConfigError, match="'finetune' is an anchor of track 'quick'"):
        parse_suite({"track": "quick", "defenses": [{"name": "finetune", "params": {"epochs": 1}}]})


def test_utility_retained_needs_a_finetune_anchor():
    raw = {"name": "x", "tasks": ["mini_pile"], "models": ["nano"], "defenses": ["lora"], "attacks": ["loss"],
           "utility": {"retained": True}}
    with pytest.raises(ConfigError, match="utility retained needs a `finetune` anchor"):
        parse_suite(raw)
    assert parse_suite(dict(raw, defenses=["finetune", "lora"])).retained_anchor.label == "finetune"
    assert parse_suite(dict(raw, utility={"retained": False}, defenses=["finetune"])).retained_anchor is None


def test_utility_retained_by_definition():
    assert utility_retained(6.0, 5.0, 6.0) == 0.0          # releasing θ keeps nothing
    assert utility_retained(6.0, 5.0, 5.0) == 1.0          # as much as fine-tuning
    assert utility_retained(6.0, 5.0, 5.75) == pytest.approx(0.25)
    assert utility_retained(6.0, 5.0, 6.5) == pytest.approx(-0.5)   # worse than not adapting
    assert utility_retained(6.0, 6.1, 5.9) is None          # fine-tuning gained nothing: undefined


def test_tracks_command_lists_names_and_hashes():
    from bench.cli import app
    out = CliRunner().invoke(app, ["tracks", "--format", "json"])
    assert out.exit_code == 0, out.output
    rows = {r["name"]: r for r in json.loads(out.output)}
    assert REQUIRED <= set(rows) and rows["quick"]["hash"] == load_track("quick").hash
    assert rows["quick"]["anchors"] == list(ANCHOR_LABELS)
