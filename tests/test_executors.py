"""The local and Ray executors run the same jobs and store the same rows, to the last bit.

Each executor runs a tiny world of the smoke suite's structure from an empty
cache (so Ray workers build every artifact themselves, concurrently, in the
shared cache directory) into its own database; every score, metric, utility
row and guarantee must be equal. About two minutes on one thread.
"""

from __future__ import annotations

import pytest
import yaml

from bench.cache import ArtifactCache
from bench.errors import ConfigError
from bench.executors import LocalExecutor, RayExecutor, make_executor
from bench.runner import Runner
from bench.store import Store
from bench.suite import parse_suite
from db_snapshot import integrity_problems, snapshot, tiny_world_yaml

ray = pytest.importorskip("ray")


def _run(tmp_path, name, executor):
    suite = parse_suite(yaml.safe_load(tiny_world_yaml("[pretrain, adapt, joint/both, null]")))
    store = Store(f"sqlite:///{tmp_path / name}.db")
    result = Runner(suite, store, ArtifactCache(tmp_path / f"cache-{name}"), quiet=True, executor=executor).run()
    store.close()
    return result, tmp_path / f"{name}.db"


def test_local_and_ray_store_identical_rows(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIVBENCH_THREADS", "1")  # same thread count in driver and workers: same float sums
    local, local_db = _run(tmp_path, "local", LocalExecutor())
    try:
        ray_result, ray_db = _run(tmp_path, "ray", RayExecutor(num_cpus=2))
    finally:
        ray.shutdown()
    assert local.status == ray_result.status == "complete"
    assert local.new_evaluations == ray_result.new_evaluations == 2 * 4 * 5
    a, b = snapshot(local_db), snapshot(ray_db)
    assert len(a["evaluations"]) == 40 and a["metrics"] and a["utility"]
    assert a["evaluations"] == b["evaluations"]  # every target id, label and score, exactly
    assert a["metrics"] == b["metrics"]
    assert a["utility"] == b["utility"]
    assert a["guarantees"] == b["guarantees"]
    assert integrity_problems(local_db) == [] and integrity_problems(ray_db) == []
    # every artifact the workers built verifies against its manifest; no temporary directory is left
    built = ArtifactCache(tmp_path / "cache-ray").verify_all()
    assert built["invalid"] == [] and len(built["valid"]) >= 5
    assert not [p for p in (tmp_path / "cache-ray").rglob(".*") if p.is_dir()]


def test_make_executor_rejects_unknown_names_and_stray_addresses():
    assert isinstance(make_executor("local"), LocalExecutor)
    assert make_executor("ray", ray_address="auto").address == "auto"
    with pytest.raises(ConfigError, match="use one of local, ray"):
        make_executor("dask")
    with pytest.raises(ConfigError, match="--executor ray"):
        make_executor("local", ray_address="auto")

