"""Results databases for the leaderboard tests: a two-seed run written row by row, and runs on tracks.

Shared by tests/test_leaderboard.py and tests/test_leaderboard_e2e.py (no test module imports another). Every
number written here is known, so the tests check what the page shows against an independent computation.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from bench.metrics import MetricRow
from bench.store import Store

HOSTILE = "<script>alert(1)</script> **bold**"
PARAMS = {"finetune": {"lr": 0.002}, "dp": {"epsilon": 8.0}, HOSTILE: {"note": HOSTILE}}
BASE_AUC = {"finetune": 0.8, "dp": 0.6, HOSTILE: 0.7}
GAME_OFFSET = {"pretrain": -0.1, "adapt": 0.0, "null": -0.3}
ATTACK_SEED = {"loss": (0.1, -0.1), "zlib": (0.05, 0.05)}  # loss wins on seed 0, zlib on the mean
PRETRAINED_LOSS = {0: 4.0, 1: 4.2}
ADAPTED_LOSS = {"finetune": (3.0, 3.1), "dp": (3.5, 3.7), HOSTILE: (3.2, 3.3)}
EPSILON = {0: 7.5, 1: 8.5}
N = 40


def auc_value(defense: str, game: str, attack: str, seed: int) -> float:
    return BASE_AUC[defense] + GAME_OFFSET[game] + ATTACK_SEED[attack][seed]


def populate_demo(path: Path) -> dict[int, tuple[list[int], list[float]]]:
    """A two-seed run: 2 tasks, 3 defenses (one hostile), 3 games, 2 MIAs + one exposure attack."""
    store = Store(str(path))
    run_id, _ = store.begin_run(run_key="k1", suite="demo", config={"x": 1}, config_hash="h1", code_version="v1.2",
                                plugin_versions={"attack:loss": "0.1"}, seeds=[0, 1], hardware={"cpu": 2},
                                command="privbench run --suite demo")
    rng = np.random.default_rng(0)
    written: dict[str, tuple[list[int], list[float]]] = {}
    worlds = [("mini_pile", d) for d in PARAMS] + [("names", "finetune")]
    for (task, defense), seed in itertools.product(worlds, (0, 1)):
        common = dict(task=task, model="nano", seed=seed)
        for game, attack in itertools.product(GAME_OFFSET, ATTACK_SEED):
            labels = [1] * (N // 2) + [0] * (N // 2)
            scores = (rng.normal(size=N) + np.array(labels) * BASE_AUC[defense]).round(3).tolist()
            auc = auc_value(defense, game, attack, seed)
            tpr = abs(auc - 0.5)
            key = f"{task}-{defense}-{seed}-{game}-{attack}"
            store.write_evaluation(run_id, key, defense=defense, defense_params=PARAMS[defense], game=game,
                                   attack=attack, attack_params={}, world_key=f"w{seed}",
                                   target_ids=[f"t{i}" for i in range(N)], labels=labels, scores=scores,
                                   metrics=[MetricRow("auc", auc, auc - 0.05, auc + 0.05, N // 2, N // 2),
                                            MetricRow("tpr@1%fpr", tpr, 0.0, tpr + 0.1, N // 2, N // 2)],
                                   duration_s=0.5, **common)
            written[key] = (labels, scores)
        if defense == "finetune" and task == "mini_pile":
            exp = [5.0 + seed, 4.0, 1.0, 1.5]
            store.write_evaluation(run_id, f"exp-{seed}", defense=defense, defense_params=PARAMS[defense],
                                   game="adapt", attack="exposure", attack_params={}, world_key=f"w{seed}",
                                   target_ids=["c0", "c1", "c2", "c3"], labels=[1, 1, 0, 0], scores=exp,
                                   metrics=[MetricRow("auc", 1.0, 1.0, 1.0, 2, 2),
                                            MetricRow("exposure_mean_pos", 4.5 + seed / 2, None, None, 2, 2)],
                                   duration_s=0.5, **common)
        store.write_utility(run_id, f"p-{task}-{defense}-{seed}", defense="-", role="pretrained", dataset="heldout",
                            values={"loss": PRETRAINED_LOSS[seed]}, n_tokens=100, **common)
        store.write_utility(run_id, f"a-{task}-{defense}-{seed}", defense=defense, role="adapted", dataset="heldout",
                            values={"loss": ADAPTED_LOSS[defense][seed], "train_seconds": 10.0 + seed},
                            n_tokens=100, **common)
        if defense == "dp":
            store.write_guarantee(run_id, defense=defense, name="epsilon", value=EPSILON[seed],
                                  details={"delta": 1e-5}, **common)
    store.finish_run(run_id, status="complete", duration_s=1.0)
    store.close()  # checkpoint the WAL so the file bytes are final before the read-only check
    return written


TRACK_AUC = {"none": 0.50, "finetune": 0.95, "lora": 0.80, "dp-eps8": 0.60, "twin": 0.55, "weak": 0.70,
             "nout": 0.65, HOSTILE: 0.62}
TRACK_TPR = {"none": 0.02, "finetune": 0.90, "lora": 0.30, "dp-eps8": 0.05, "twin": 0.05, "weak": 0.35,
             "nout": 0.10, HOSTILE: 0.40}
TRACK_RETAINED = {"none": 0.0, "finetune": 1.0, "lora": 0.8, "dp-eps8": 0.4, "twin": 0.4, "weak": 0.3,
                  "nout": None, HOSTILE: 0.35}
TRACK_PARAMS = {"none": {}, "finetune": {"lr": 0.002, "epochs": 4.0, "batch_size": 16},
                "lora": {"lr": 0.003, "epochs": 4.0, "r": 8, "target_modules": ["dense"]},
                "dp-eps8": {"epsilon": 8.0, "clip": 0.1, "method": "full", "lr": None, "delta": None},
                "twin": {"lr": 0.001}, "weak": {"lr": 0.0001}, "nout": {"lr": 0.01}, HOSTILE: {"note": HOSTILE}}
TRACK_PLUGIN = {"none": ("none", "1.0.0"), "dp-eps8": ("dp_adapt", "0.2.0"), "twin": ("finetune", "0.1.0"),
                HOSTILE: ("hostile", "9")}
# the order the ranking rule gives (see test_track_ranking_follows_the_rule for the derivation)
TRACK_ORDER = ["finetune", "lora", "twin", "dp-eps8", "none", HOSTILE, "weak", "nout"]
TRACK_RANKS = ["anchor", "1", "2", "3", "anchor", "4", "5", "—"]
SEED_D = {0: -0.01, 1: 0.01}


def write_track_run(store: Store, key: str, *, track: dict | None, suite: str, defenses: list[str], task: str,
                     seeds=(0, 1), status: str = "complete", code_version: str = "v2.0",
                     duration_s: float = 0.25) -> int:
    entries = [{"label": d, "name": TRACK_PLUGIN.get(d, (d, ""))[0], "params": TRACK_PARAMS[d],
                "version": TRACK_PLUGIN.get(d, (d, "0.1.0"))[1]} for d in defenses]
    config = {"name": suite, "defenses": entries, "seeds": list(seeds)}
    if track is not None:
        config["track"] = track
    run_id, _ = store.begin_run(run_key=key, suite=suite, config=config, config_hash=f"h-{key}",
                                code_version=code_version,
                                plugin_versions={"defense:finetune": "0.1.0", "defense:none": "1.0.0",
                                                 "defense:lora": "0.1.0"},
                                seeds=list(seeds), hardware={}, command=f"privbench run --suite {suite}")
    labels = [1] * 10 + [0] * 10
    for d, seed in itertools.product(defenses, seeds):
        common = dict(task=task, model="nano", defense=d, seed=seed)
        for game, attack in itertools.product(("adapt", "null"), ("loss", "zlib")):
            lose = 0.0 if attack == "loss" else -0.02  # loss is the worst case of both metrics
            base_auc, base_tpr = (TRACK_AUC[d], TRACK_TPR[d]) if game == "adapt" else (0.5, 0.03)  # null: chance
            auc = base_auc + lose + SEED_D[seed]
            tpr = base_tpr + lose + SEED_D[seed]
            store.write_evaluation(run_id, f"{d}-{seed}-{game}-{attack}", defense_params=TRACK_PARAMS[d], game=game,
                                   attack=attack, attack_params={}, world_key=f"w{seed}",
                                   target_ids=[f"t{i}" for i in range(20)], labels=labels,
                                   scores=[float((i * 7 + seed) % 11) + (i < 10) for i in range(20)],
                                   metrics=[MetricRow("auc", auc, auc - 0.05, auc + 0.05, 10, 10),
                                            MetricRow("tpr@1%fpr", tpr, max(tpr - 0.1, 0), tpr + 0.1, 10, 10)],
                                   duration_s=duration_s, **common)
        store.write_utility(run_id, f"a-{d}-{seed}", role="adapted", dataset="heldout",
                            values={"loss": 3.0, "adapt_seconds": 10.0 * (1 + seed),  # measured by privbench
                                    "train_seconds": 0.5 * (1 + seed)},  # the defense's own report
                            n_tokens=100, **common)
        if TRACK_RETAINED[d] is not None:
            store.write_utility(run_id, f"r-{d}-{seed}", role="adapted", dataset="retained",
                                values={"utility_retained": TRACK_RETAINED[d] + 2 * SEED_D[seed] * (d not in
                                                                                                    ANCHORS),
                                        "gain_nats": 0.5, "finetune_gain_nats": 0.8}, n_tokens=100, **common)
        if d == "dp-eps8":
            store.write_guarantee(run_id, name="epsilon", value=7.5 + seed, details={"delta": 1e-5}, **common)
    store.finish_run(run_id, status=status, duration_s=1.0)
    return run_id


ANCHORS = ("none", "finetune")


def populate_tracks(path: Path) -> None:
    """Runs on tracks: an older version of `quick` (other hash), `quick` itself with anchors, five defenses (one
    without utility retained, one hostile), `canaries` with its anchors, a suite without a track, and two runs
    that never finished (one of a newer version of `quick`)."""
    store = Store(str(path))
    write_track_run(store, "quick-old", track={"name": "quick", "hash": "q-old", "headline_game": "adapt"},
                     suite="quick", defenses=["none", "finetune"], task="wiki")
    write_track_run(store, "quick", track={"name": "quick", "hash": "q-new", "headline_game": "adapt"},
                     suite="quick", defenses=["none", "finetune", "lora", "dp-eps8", "twin", "weak", "nout", HOSTILE],
                     task="wiki")
    write_track_run(store, "canaries", track={"name": "canaries", "hash": "c1", "headline_game": "adapt"},
                     suite="canaries_suite", defenses=["none", "finetune", "lora"], task="canaries-x3")
    write_track_run(store, "adhoc", track=None, suite="adhoc", defenses=["finetune", "weak"], task="wiki", seeds=(0,))
    write_track_run(store, "broken", track={"name": "users", "hash": "u1", "headline_game": "adapt"},
                     suite="users", defenses=["none"], task="users", status="failed")
    write_track_run(store, "quick-next", track={"name": "quick", "hash": "q-next", "headline_game": "adapt"},
                     suite="quick", defenses=["none"], task="wiki", status="failed")
    store.close()


def board_of(path: Path):
    from leaderboard.board import load_board
    from leaderboard.queries import read_only_engine
    engine = read_only_engine(str(path))
    try:
        return load_board(engine)
    finally:
        engine.dispose()
