"""The pooled draw of tasks whose pretraining membership is given by the data (MIMIR, the Pile's train/validation
split): targets and D's background come from the task's members and non-members under the world's salt.

The threat: a defense rebuilds the task from the same public file and drops every record of D̃ that is on the task's
public target list (its members and its non-member target partition), or on its member list, then trains on the
rest. Under the task's own draw that finds every target (AUC 1) or every (1,1) target (AUC 0.75); under the pooled
draw with `background_in_pretraining: matched` neither rule beats chance (docs/submitting.md, "Channels of the
pools").
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bench.cache import ArtifactCache
from bench.errors import ConfigError, DataError
from bench.game import Challenger
from bench.metrics import roc_auc
from bench.suite import parse_suite
from tasks.hub import Mimir, known_membership

WORDS = ("harbour lantern copper meadow signal orchard ledger canvas summit thread marble violet engine quarry "
         "pepper saddle tunnel walnut").split()
MATCHED = {"n_per_group": 40, "n_null": 40, "adapt_background": 120, "n_validation": 30,
           "background_in_pretraining": "matched"}


def _texts(n: int, tag: str, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f"{tag} {i}: " + " ".join(rng.choice(WORDS, size=int(rng.integers(10, 18)))) for i in range(n)]


@pytest.fixture
def mimir_file(tmp_path, monkeypatch):
    """A MIMIR-schema file, named relative to tmp_path so the task's fingerprint (and every draw) is the same in
    every session."""
    monkeypatch.chdir(tmp_path)
    pd.DataFrame({"member": _texts(1400, "m", 1), "nonmember": _texts(1400, "n", 2)}).to_json(
        "mimir.jsonl", orient="records", lines=True)
    return "mimir.jsonl"


def _build(source: str, tmp_path):
    return Mimir(source=source).build(ArtifactCache(tmp_path / "cache"))


def _d_tilde(ch: Challenger) -> tuple[list[str], np.ndarray]:
    """D̃'s distinct texts and whether each is an inserted target (the label the defense must not find)."""
    inserted = set(ch.members("b"))
    texts = sorted(set(ch.adaptation_data().texts))
    return texts, np.array([t in inserted for t in texts], dtype=int)


def test_targets_and_background_come_from_members_and_non_members_of_both_partitions(mimir_file, tmp_path):
    data = _build(mimir_file, tmp_path)
    km = known_membership(data)
    member_texts = {t.text for t in data.targets if km[t.id] == 1}
    ch = Challenger(data, MATCHED, seed=0)
    assert ch.known_a and ch.known_a_pooled and ch.pool_docs == {"T1": 80, "T0": 120, "B1": 60, "B0": 60, "V": 30}
    # each group's a is the known one; the non-member targets come from both of the task's partitions
    for rid, (a, _) in ch._group.items():
        assert (ch._text[rid] in member_texts) == bool(a)
    zero = {ch._text[r] for r, (a, _) in ch._group.items() if a == 0}
    assert zero & set(data.adapt) and zero & {t.text for t in data.targets if km[t.id] == 0}
    # D's background: as large a share of members (60 of 120) as the (1,1) group is of the inserted units (40 of
    # 80); the validation records are non-members of neither side
    d = ch.adaptation_data()
    background = [t for t in d.texts if t not in set(ch.members("b"))]
    assert len(background) == 120 and sum(t in member_texts for t in background) == 60
    assert set(ch.background_in_pretraining()) == {t for t in background if t in member_texts}
    assert not ch.pretraining_inserts()  # S is the released model's: nothing is inserted
    validation = set(d.validation)
    assert len(validation) == 30 and not validation & (set(ch._text.values()) | set(background) | member_texts)
    # the paper's game keeps members out of the background; the task's own draw is the old one, keyed apart
    plain = Challenger(data, {**MATCHED, "background_in_pretraining": "none"}, seed=0)
    assert plain.pool_docs["B1"] == 0 and not plain.background_in_pretraining()
    old = Challenger(data, {**MATCHED, "background_in_pretraining": "none", "pool_draw": "partition"}, seed=0)
    assert not old.known_a_pooled and set(old.adaptation_data().texts) - set(old.members("b")) <= set(data.adapt)
    assert len({ch.world_key, plain.world_key, old.world_key}) == 3
    # the split is the world's: another seed or a secret draws other sides
    assert Challenger(data, MATCHED, seed=0).world_key == ch.world_key
    assert set(Challenger(data, MATCHED, seed=0, secret="s3cret")._text.values()) != set(ch._text.values())


def test_a_defense_that_rebuilds_the_task_finds_the_targets_only_under_the_tasks_own_draw(mimir_file, tmp_path):
    """The exploits: score each record of D̃ by the rebuilt task's public target list, or by its member list."""
    data = _build(mimir_file, tmp_path)
    rebuilt = _build(mimir_file, tmp_path)  # what the dishonest defense computes from the public file
    km = known_membership(rebuilt)
    target_list = {t.text for t in rebuilt.targets}
    member_list = {t.text for t in rebuilt.targets if km[t.id] == 1}
    rules = {"target list": target_list, "member list": member_list}
    worlds = {"own draw": {**MATCHED, "background_in_pretraining": "none", "pool_draw": "partition"},
              "pooled, paper's game": {**MATCHED, "background_in_pretraining": "none"},
              "pooled, matched": MATCHED}
    auc = {(w, r): [] for w in worlds for r in rules}
    for seed in range(8):
        for w, world in worlds.items():
            texts, y = _d_tilde(Challenger(data, world, seed=seed))
            for r, listed in rules.items():
                auc[(w, r)].append(roc_auc(y, np.array([t in listed for t in texts], dtype=float)))
    mean = {k: float(np.mean(v)) for k, v in auc.items()}
    assert mean[("own draw", "target list")] == 1.0
    assert mean[("own draw", "member list")] == pytest.approx(0.75)  # every (1,1) target, no background
    # pooled, paper's game: the partition says nothing, but the members on either list are all targets (the
    # background holds none), so the member list finds the (1,1) group and lends the target list its members' edge
    # (0.93 of the targets on it against 0.86 of the background: AUC about 0.54)
    assert 0.5 < mean[("pooled, paper's game", "target list")] < 0.6
    assert mean[("pooled, paper's game", "member list")] == pytest.approx(0.75)
    for r in rules:
        assert abs(mean[("pooled, matched", r)] - 0.5) < 0.03, (r, auc[("pooled, matched", r)])
        assert max(abs(a - 0.5) for a in auc[("pooled, matched", r)]) < 0.12


def test_too_few_members_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pd.DataFrame({"member": _texts(100, "m", 1), "nonmember": _texts(100, "n", 2)}).to_json(
        "small.jsonl", orient="records", lines=True)
    data = _build("small.jsonl", tmp_path)
    with pytest.raises(DataError, match=r"100 member records \(known a=1\) but the world needs 120: 80 for its "
                                        r"units with a=1 and 40 for D's background.*give the task more rows"):
        Challenger(data, {**MATCHED, "adapt_background": 80}, seed=0)


def test_matched_on_a_known_split_needs_the_pooled_draw(mimir_file, tmp_path):
    data = _build(mimir_file, tmp_path)
    with pytest.raises(ConfigError, match="set world pool_draw: pooled"):
        Challenger(data, {**MATCHED, "pool_draw": "partition"}, seed=0)


def test_a_released_model_takes_matched_on_a_known_split_only():
    suite = {"name": "known-matched", "tasks": [{"name": "mimir", "params": {"source": "mimir.jsonl"}}],
             "models": [{"name": "pythia-tiny", "params": {"hf_id": "EleutherAI/pythia-14m"}}],
             "defenses": ["finetune"], "attacks": ["loss"], "games": ["adapt", "pretrain"],
             "world": {"background_in_pretraining": "matched"}}
    assert parse_suite(suite).world["background_in_pretraining"] == "matched"
    with pytest.raises(ConfigError, match="a task with the model's known pretraining split"):
        parse_suite({**suite, "tasks": ["mini_pile"], "games": ["adapt"]})


def test_the_real_scale_example_suite_parses_and_fits_mimir():
    """examples/suites/pythia_mimir.yaml: Pythia on MIMIR with every game and a matched background; its world fits
    MIMIR's 1,000 members and 700 non-members of the target and adaptation pools (the default weights)."""
    from pathlib import Path

    from bench.suite import load_suite
    suite = load_suite(str(Path(__file__).parent.parent / "examples/suites/pythia_mimir.yaml"))
    w = suite.world
    assert suite.models[0].source == "hf" and w["background_in_pretraining"] == "matched"
    assert {g.name for g in suite.games} >= {"pretrain", "adapt", "joint/seen", "post_adapt", "null"}
    members = 2 * w["n_per_group"] + round(w["adapt_background"] * w["n_per_group"] / (2 * w["n_per_group"]))
    non_members = 2 * w["n_per_group"] + w["n_null"] + w["adapt_background"] - (members - 2 * w["n_per_group"])
    assert members <= 1000 and non_members + w["n_validation"] <= 700


def test_a_text_in_the_adaptation_partition_twice_or_also_listed_counts_once():
    """Non-members are deduplicated by the tasks, but a text repeated in the adaptation partition, or also on the
    member list, must not become two records of the split (a target and its own copy in D's background)."""
    from bench.task import TargetRecord, TaskData
    from bench.pools import split_known_pool
    targets = tuple(TargetRecord(f"r{i}", f"text {i}") for i in range(40))
    data = TaskData(name="fake", pretrain=(), heldout=("h",), population=("q",), fingerprint="fake-known",
                    adapt=("text 0", "extra", "extra", "text 7") + tuple(f"adapt {i}" for i in range(10)),
                    targets=targets, target_meta={f"r{i}": {"a": i % 2} for i in range(40)})
    sides = split_known_pool(data, n_units={1: 10, 0: 20}, n_background=10, n_background_members=5, n_validation=50,
                             rng=np.random.default_rng(0))
    texts = [t.text for t in sides.targets] + list(sides.background) + list(sides.validation)
    assert len(texts) == len(set(texts)) and len({t.id for t in sides.targets}) == len(sides.targets)
    # the non-members: 20 listed and 11 new texts ("extra" once, the 10 others), less T0's 20 and B0's 5
    assert len(sides.validation) == 20 + 11 - 20 - 5
