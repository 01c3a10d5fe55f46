import os

import pytest

# Tests never touch the user's cache or the repo's results.db unless they say so.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Under pytest-xdist (`-n auto`, pyproject.toml) the workers share the cores: each worker's torch, and every
# process its tests start, gets its share of the threads instead of all of them (oversubscribed threads spin).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
if _WORKERS > 1:
    os.environ.setdefault("PRIVBENCH_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))

MAX_WORKERS = 4


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker per core, at most MAX_WORKERS (each e2e test starts processes and servers of its own)."""
    return max(1, min(os.cpu_count() or 1, MAX_WORKERS))


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    """One content-addressed artifact cache for the session: equal builds are shared, never stale."""
    from bench.cache import ArtifactCache
    return ArtifactCache(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="session")
def pg_server():
    """A real PostgreSQL server for the session (tests/pg_server.py); skipped without the binaries unless CI."""
    from tests.pg_server import PostgresServer, require_binaries
    server = PostgresServer(require_binaries())
    try:
        server.start()
    except Exception:
        server.stop()
        raise
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """An empty results database: a SQLite file, and a database on the real PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'results.db'}"
    return request.getfixturevalue("pg_server").new_database()


# Test tiers, by module: `pytest -m unit` (no model trained, seconds), `-m integration` (tiny models trained in
# process), `-m e2e` (the CLI in subprocesses, the sandbox, a browser, Ray). A module not listed is a unit module.
E2E = {"test_smoke_suite", "test_leaderboard_e2e", "test_submit", "test_fault_injection", "test_executors",
       "test_bad_inputs", "test_cli_errors", "test_validate", "test_data_cli", "test_distance", "test_ray_cluster",
       "test_benchmark_scripts", "test_plugin_worker", "test_fork_server"}
INTEGRATION = {"test_runner", "test_dp", "test_naf", "test_guard", "test_hush", "test_mitigations", "test_prefix",
               "test_self_prompt", "test_fair_game", "test_dishonest_attack", "test_utility", "test_matching",
               "test_plan", "test_library_api", "test_conformance", "test_rmia", "test_lm_eval_adapter",
               "test_device", "test_users_secrets", "test_units", "test_canaries", "test_names2ids",
               "test_extraction", "test_leaderboard", "test_compare", "test_report", "test_user_files",
               "test_hub_loaders", "test_pile_subsets", "test_corpus", "test_exposure", "test_hush_world",
               "test_generation_batched", "test_gguf_cache", "test_audit_canaries", "test_scoring_host", "test_pools",
               "test_secret_audit", "test_audit_claims", "test_audit_game", "test_identical_release"}


TIER_ORDER = {"e2e": 0, "integration": 1, "unit": 2}


def _tier(item) -> str:
    module = item.module.__name__.rpartition(".")[2]
    return "e2e" if module in E2E else "integration" if module in INTEGRATION else "unit"


def pytest_collection_modifyitems(config, items):
    """Mark each test with its tier, and run the slow tiers first (stable within a tier).

    Under xdist (`--dist loadfile --no-loadscope-reorder`) a module is one unit of work, handed out in this
    order: the long e2e modules start first and the many short unit modules fill the end, so no worker is left
    alone with a long module while the others idle.
    """
    for item in items:
        item.add_marker(getattr(pytest.mark, _tier(item)))
    items.sort(key=lambda item: TIER_ORDER[_tier(item)])
