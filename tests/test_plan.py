"""The job graph: content keys equal the artifacts' and the store's keys, dependencies are explicit and
ordered, and what the cache and database hold is marked done (so a rerun runs nothing)."""

from __future__ import annotations

from bench.artifacts import pretrained_key, tokenizer_key
from bench.game import Challenger
from bench.plan import ARTIFACT_KINDS, build_plan
from bench.runner import Runner
from bench.store import Store
from bench.suite import parse_suite

TINY = {
    "name": "tiny_plan",
    "seeds": [0, 1],
    "tasks": [{"name": "mini_pile", "params": {"max_chars_per_source": 400_000}}],
    "models": [{"name": "nano", "params": {"pretrain_tokens": 4000, "reference_tokens": 3000}}],
    "defenses": [{"name": "finetune", "params": {"epochs": 1}}],
    "attacks": ["loss", "reference"],
    "games": ["adapt", "null"],
    "world": {"n_per_group": 6, "n_null": 12, "adapt_background": 6},
    "reference": True,
    "metrics": {"n_boot": 20},
    "utility": {"n_heldout": 10},
}


def test_plan_graph_keys_and_done_marks(tmp_path):
    from bench.cache import ArtifactCache
    cache = ArtifactCache(tmp_path / "cache")  # its own: the session cache may already hold these models
    suite = parse_suite(TINY)
    store = Store(f"sqlite:///{tmp_path / 'p.db'}")
    runner = Runner(suite, store, cache, quiet=True)
    plan = build_plan(runner)
    jobs = list(plan.jobs.values())
    kinds = [j.kind for j in jobs]
    # 1 data, 1 tokenizer, 1 reference, its utility row (once per model, as stored); per seed: θ, θ', 3 signals,
    # 2 utility rows, 2 games × 2 attacks
    assert {k: kinds.count(k) for k in set(kinds)} == {
        "data": 1, "tokenizer": 1, "reference": 1, "pretrain": 2, "adapt": 2, "signals": 6, "utility": 5,
        "evaluate": 8}
    # topological: every dependency is planned before its dependant; keys are unique
    pos = {j.key: i for i, j in enumerate(jobs)}
    assert len(pos) == len(jobs)
    assert all(pos[d] < pos[j.key] for j in jobs for d in j.deps)
    # an evaluation waits for the signals of θ, θ' and the reference of its own world
    ev = next(j for j in jobs if j.kind == "evaluate" and j.params.seed == 1)
    assert sorted(plan.jobs[d].params.role for d in ev.deps) == ["adapted", "pretrained", "reference"]
    assert {plan.jobs[d].params.seed for d in ev.deps} == {1}
    # artifact jobs are named by the artifact's own cache key
    data = runner.worlds.data(0)
    spec = suite.models[0]
    tok = next(j for j in jobs if j.kind == "tokenizer")
    assert tok.key == tokenizer_key(spec, data)
    ch = Challenger(data, suite.world, 1)
    theta1 = next(j for j in jobs if j.kind == "pretrain" and j.params.seed == 1)
    assert theta1.key == pretrained_key(spec, data, tok.key, ch.pretraining_inserts(), 1)
    assert theta1.deps == (tok.key,)
    assert not any(j.done for j in jobs if j.kind != "data")  # empty cache (models) and database

    result = runner.run()
    assert result.new_evaluations == 8
    stored = {e["eval_key"] for e in store.evaluations(result.run_id)}
    runner.done_evals = stored
    again = build_plan(runner, result.run_id)
    assert all(j.done for j in again.jobs.values()), [j for j in again.jobs.values() if not j.done]
    # the plan's evaluation keys are exactly the keys the store holds
    assert {j.key for j in again.jobs.values() if j.kind == "evaluate"} == stored
    for j in again.jobs.values():
        if j.kind in ARTIFACT_KINDS:
            assert cache.is_valid(ARTIFACT_KINDS[j.kind], j.key)
    text = again.describe()
    assert f"{len(jobs)} jobs, {len(jobs)} done, 0 to run" in text and "evaluate 8 (8 done)" in text


def test_plan_command_prints_the_graph(tmp_path, monkeypatch):
    import yaml
    from typer.testing import CliRunner

    from bench.cli import app
    monkeypatch.setenv("PRIVBENCH_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**TINY, "seeds": [0]}))
    res = CliRunner().invoke(app, ["plan", "--suite", str(path), "--db", f"sqlite:///{tmp_path / 'x.db'}"])
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    assert lines[-1].startswith("15 jobs, 1 done, 14 to run")
    assert any("[todo] pretrain" in ln and "<- 1" in ln for ln in lines)


def test_plan_command_writes_no_database(tmp_path, monkeypatch):
    """plan only reads: with no database it plans against an empty one without creating a file, and an existing
    database (in SQLite's default rollback-journal mode) keeps every byte, its journal mode included."""
    import hashlib
    import sqlite3

    import yaml
    from typer.testing import CliRunner

    from bench.cli import app
    monkeypatch.setenv("PRIVBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**TINY, "seeds": [0]}))
    res = CliRunner().invoke(app, ["plan", "--suite", str(path), "--summary"])  # the default --db: ./results.db
    assert res.exit_code == 0, res.output
    assert res.output.strip().splitlines()[-1].startswith("15 jobs, 1 done, 14 to run")
    assert not (tmp_path / "results.db").exists()

    db = tmp_path / "kept.db"
    Store(f"sqlite:///{db}").close()
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA journal_mode = DELETE").fetchone()[0] == "delete"
    con.close()
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    res = CliRunner().invoke(app, ["plan", "--suite", str(path), "--summary", "--db", f"sqlite:///{db}"])
    assert res.exit_code == 0, res.output
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    assert sorted(x.name for x in tmp_path.iterdir()) == ["cache", "kept.db", "s.yaml"]


def test_released_aggregates_are_planned_under_the_keys_they_are_scored_and_stored_under(tmp_path):
    """A NAF aggregate is not one checkpoint: it is loaded by its release loader, yet the plan names its signals
    and evaluations by the same keys the run stores (nothing predicted), so after a run the plan is all done."""
    from bench.cache import ArtifactCache
    raw = dict(TINY, name="tiny_plan_naf", seeds=[0], attacks=["loss"], reference=False,
               defenses=[{"name": "naf", "params": {"variant": "cp_delta", "epochs": 1, "guarantee_texts": 0}}])
    cache = ArtifactCache(tmp_path / "cache")
    store = Store(f"sqlite:///{tmp_path / 'n.db'}")
    runner = Runner(parse_suite(raw), store, cache, quiet=True)
    result = runner.run()
    stored = {e["eval_key"] for e in store.evaluations(result.run_id)}
    runner.done_evals = stored
    again = build_plan(runner, result.run_id)
    assert {j.key for j in again.jobs.values() if j.kind == "evaluate"} == stored
    assert all(j.done for j in again.jobs.values()), [j for j in again.jobs.values() if not j.done]
    lm = runner.worlds.model_lm(0, 0, 0, "adapted", 0)
    _, key, _ = runner.worlds.adapted(0, 0, 0, 0)
    assert lm.fingerprint == runner.worlds.fingerprint(key, runner.suite.models[0])
