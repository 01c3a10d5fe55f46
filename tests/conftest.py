import os

import pytest

# Tests never touch the user's cache or the repo's results.db unless they say so.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    """One content-addressed artifact cache for the session: equal builds are shared, never stale."""
    from bench.cache import ArtifactCache
    return ArtifactCache(tmp_path_factory.mktemp("cache"))
