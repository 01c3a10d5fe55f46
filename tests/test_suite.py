"""Tests for bench.suite: the bundled smoke suite, config hashing, and one clear ConfigError per mistake."""

from __future__ import annotations

import copy

import pytest
import yaml

from bench.errors import ConfigError
from bench.game import DEFAULT_GAMES, GAMES
from bench.suite import SUITE_DIR, bundled_suites, find_suite, load_suite, parse_suite

SMOKE_ATTACKS = ["loss", "zlib", "min_k", "min_k_pp", "reference"]


@pytest.fixture(scope="module")
def smoke_raw() -> dict:
    return yaml.safe_load((SUITE_DIR / "smoke.yaml").read_text())


def write(tmp_path, raw_or_text, name="suite.yaml"):
    p = tmp_path / name
    if isinstance(raw_or_text, bytes):
        p.write_bytes(raw_or_text)
    elif isinstance(raw_or_text, str):
        p.write_text(raw_or_text)
    else:
        p.write_text(yaml.safe_dump(raw_or_text, sort_keys=False))
    return str(p)


def variant(smoke_raw, **changes) -> dict:
    raw = copy.deepcopy(smoke_raw)
    for k, v in changes.items():
        raw[k] = v
    return raw


def load_error(tmp_path, content) -> str:
    with pytest.raises(ConfigError) as err:
        load_suite(write(tmp_path, content))
    return str(err.value)


# ---------------------------------------------------------------------------------------- the smoke suite

def test_smoke_suite_loads():
    s = load_suite("smoke")
    assert "smoke" in bundled_suites()
    assert s.name == "smoke" and s.path.endswith("smoke.yaml")
    assert [g.name for g in s.games] == list(DEFAULT_GAMES) and len(s.games) == 7
    assert [a.label for a in s.attacks] == SMOKE_ATTACKS
    assert [type(a.instance).name for a in s.attacks] == SMOKE_ATTACKS
    assert [d.label for d in s.defenses] == ["none", "finetune", "lora"]
    assert [t.name for t in s.tasks] == ["mini_pile"]
    assert [m.name for m in s.models] == ["nano"] and s.models[0].pretrain_tokens == 250000
    assert s.seeds == [0] and s.reference is True
    assert s.world == {"n_per_group": 60, "n_null": 400, "adapt_background": 60, "pretrain_target_repeats": 1,
                       "adapt_target_repeats": None, "n_validation": 100, "n_audit": 0, "n_audit_pretrain": 0,
                       "pool_draw": "pooled", "background_in_pretraining": "none"}
    assert s.metrics["n_boot"] == 500 and s.metrics["alpha"] == 0.05  # given, and a default filled in
    assert s.utility == {"n_heldout": 200, "n_generate": 24, "prompt_tokens": 32, "max_new_tokens": 32,
                         "retained": None}
    assert s.retained_anchor.label == "finetune"


def test_config_hash_is_stable_and_tracks_changes(smoke_raw, tmp_path):
    h = load_suite("smoke").config_hash
    assert load_suite("smoke").config_hash == h
    assert load_suite(str(SUITE_DIR / "smoke.yaml")).config_hash == h  # by path, same content
    # an explicit default is the same configuration
    same = variant(smoke_raw, attacks=["loss", "zlib", {"name": "min_k", "params": {"k": 0.2}}, "min_k_pp",
                                       "reference"])
    assert parse_suite(same).config_hash == h
    changed = [
        variant(smoke_raw, attacks=["loss", "zlib", {"name": "min_k", "params": {"k": 0.3}}, "min_k_pp",
                                    "reference"]),
        variant(smoke_raw, defenses=[{"name": "finetune", "params": {"lr": "1e-3"}}, "lora"]),
        variant(smoke_raw, world=dict(smoke_raw["world"], n_null=302)),
        variant(smoke_raw, seeds=[1]),
        variant(smoke_raw, games=["adapt"]),
    ]
    hashes = {parse_suite(r).config_hash for r in changed}
    assert h not in hashes and len(hashes) == len(changed)


def test_bundled_name_and_path_resolution(tmp_path):
    assert find_suite("smoke") == SUITE_DIR / "smoke.yaml"
    with pytest.raises(ConfigError, match="unknown suite 'smok': did you mean 'smoke'"):
        find_suite("smok")
    with pytest.raises(ConfigError, match="not found"):
        load_suite(str(tmp_path / "missing.yaml"))


# ---------------------------------------------------------------------------------------- file-level errors

def test_empty_file(tmp_path):
    assert "is empty" in load_error(tmp_path, "")
    assert "is empty" in load_error(tmp_path, "# only a comment\n")


def test_non_mapping_yaml(tmp_path):
    msg = load_error(tmp_path, "- loss\n- zlib\n")
    assert "must be a YAML mapping" in msg
    assert "must be a YAML mapping" in load_error(tmp_path, "just a string\n")


def test_invalid_yaml_names_the_line(tmp_path):
    msg = load_error(tmp_path, "name: x\nseeds: [0, 1\ntasks: [mini_pile]\n")
    assert "not valid YAML at line 3" in msg
    assert "suite.yaml" in msg
    msg = load_error(tmp_path, "name: x\nseeds: [0]\nattacks: [loss\n\n\n")
    assert "not valid YAML at line" in msg and "line 1 " not in msg


def test_missing_file_path(tmp_path):
    with pytest.raises(ConfigError, match="suite file .* not found"):
        load_suite(str(tmp_path / "nowhere" / "suite.yml"))
    with pytest.raises(ConfigError, match="is a directory"):
        load_suite(str(tmp_path))  # a directory is not a suite file


def test_non_utf8_file(tmp_path):
    msg = load_error(tmp_path, b"\xff\xfe\x00name: x\n")
    assert "not UTF-8" in msg


# ---------------------------------------------------------------------------------------- content errors

def test_unknown_top_level_key_suggests(smoke_raw, tmp_path):
    raw = variant(smoke_raw)
    raw["seed"] = raw.pop("seeds")
    msg = load_error(tmp_path, raw)
    assert "unknown key 'seed'" in msg and "did you mean 'seeds'" in msg
    raw = variant(smoke_raw, zzzz=1)
    assert "known keys" in load_error(tmp_path, raw)


def test_unknown_attack_suggests(smoke_raw, tmp_path):
    msg = load_error(tmp_path, variant(smoke_raw, attacks=["los", "zlib"]))
    assert "unknown attack 'los'" in msg and "did you mean 'loss'" in msg


def test_unknown_defense_and_task(smoke_raw, tmp_path):
    assert "unknown defense 'lroa'" in load_error(tmp_path, variant(smoke_raw, defenses=["lroa"]))
    assert "unknown task" in load_error(tmp_path, variant(smoke_raw, tasks=["mini_pil"]))


def test_wrong_param_type_for_a_defense(smoke_raw, tmp_path):
    msg = load_error(tmp_path, variant(smoke_raw, defenses=[{"name": "finetune", "params": {"batch_size": "big"}}]))
    assert "finetune" in msg and "batch_size" in msg and "integer" in msg
    msg = load_error(tmp_path, variant(smoke_raw, defenses=[{"name": "finetune", "params": {"batchsize": 4}}]))
    assert "did you mean 'batch_size'" in msg
    msg = load_error(tmp_path, variant(smoke_raw, defenses=[{"name": "finetune", "params": [1, 2]}]))
    assert "must be a mapping" in msg
    msg = load_error(tmp_path, variant(smoke_raw, defenses=[{"name": "finetune", "parms": {}}]))
    assert "unknown keys ['parms']" in msg


def test_a_defense_may_not_train_past_the_models_context(smoke_raw):
    """Scores read a model's first context_length tokens: training on longer records is refused with both fixes."""
    raw = variant(smoke_raw, defenses=[{"name": "lora", "params": {"chunk_length": 192}}])
    with pytest.raises(ConfigError, match=r"'lora' trains on records of up to 192 tokens .* model 'nano' is scored "
                                          r"on its first 128 .* chunk_length to at most 128, or give the model "
                                          r"context_length: 192"):
        parse_suite(raw)
    raw["models"] = [{"name": "nano", "params": {"context_length": 192}}]
    assert parse_suite(raw).models[0].context_length == 192
    # a matched-utility grid over chunk_length trains at every value it lists
    matched = {"name": "finetune", "match": {"param": "chunk_length", "grid": [64, 256], "target_loss": 5.0}}
    with pytest.raises(ConfigError, match=r"'finetune' trains on records of up to 256 tokens .* context_length: 256"):
        parse_suite(variant(smoke_raw, defenses=[matched]))
    matched["match"]["grid"] = [64, 128]
    assert parse_suite(variant(smoke_raw, defenses=[matched])).defenses[0].match["grid"] == [64, 128]


def test_duplicate_defense_needs_a_label(smoke_raw, tmp_path):
    msg = load_error(tmp_path, variant(smoke_raw, defenses=["finetune", {"name": "finetune",
                                                                         "params": {"lr": 1e-3}}]))
    assert "'finetune' appears twice" in msg and "label" in msg
    s = parse_suite(variant(smoke_raw, defenses=["finetune", {"name": "finetune", "label": "ft_slow",
                                                              "params": {"lr": 1e-3}}]))
    assert [d.label for d in s.defenses] == ["finetune", "ft_slow"]
    assert [d.name for d in s.defenses] == ["finetune", "finetune"]


@pytest.mark.parametrize("seeds,words", [
    ("0, 1", "non-empty list of non-negative integers"),
    ([0, "1"], "non-empty list of non-negative integers"),
    ([0, 1.5], "non-empty list of non-negative integers"),
    ([True], "non-empty list of non-negative integers"),
    ([], "non-empty list of non-negative integers"),
    ([-1], "non-empty list of non-negative integers"),
    ([3, 1, 3], "repeat a value"),
])
def test_bad_seeds(smoke_raw, tmp_path, seeds, words):
    assert words in load_error(tmp_path, variant(smoke_raw, seeds=seeds))


def test_single_int_seed_is_a_list(smoke_raw):
    assert parse_suite(variant(smoke_raw, seeds=7)).seeds == [7]


def test_unknown_game(smoke_raw, tmp_path):
    msg = load_error(tmp_path, variant(smoke_raw, games=["adapt", "pretrian"]))
    assert "unknown game 'pretrian'" in msg and "did you mean 'pretrain'" in msg


def test_bare_null_in_games_is_the_null_game(smoke_raw, tmp_path):
    text = (SUITE_DIR / "smoke.yaml").read_text().replace("games: all", "games: [adapt, null]")
    assert "games: [adapt, null]" in text
    s = load_suite(write(tmp_path, text))
    assert [g.name for g in s.games] == ["adapt", "null"]
    assert s.games[1] is GAMES["null"]
    assert [g.name for g in parse_suite(variant(smoke_raw, games="joint/seen")).games] == ["joint/seen"]


def test_hf_model_rejects_games_with_unknown_pretraining(smoke_raw, tmp_path):
    hf = [{"name": "gpt2", "params": {"hf_id": "gpt2"}}]
    msg = load_error(tmp_path, variant(smoke_raw, models=hf, games=["adapt", "pretrain"]))
    assert "released checkpoint" in msg and "pretrain" in msg
    assert "released checkpoint" in load_error(tmp_path, variant(smoke_raw, models=hf))  # games: all
    s = parse_suite(variant(smoke_raw, models=hf, games=["adapt", "joint/fresh", "null"]))
    assert s.models[0].source == "hf" and s.models[0].hf_id == "gpt2"


def test_other_content_errors(smoke_raw, tmp_path):
    assert "'models' must be a non-empty list" in load_error(tmp_path, variant(smoke_raw, models=[]))
    assert "unknown model 'nanoo'" in load_error(tmp_path, variant(smoke_raw, models=["nanoo"]))
    assert "'attacks' is missing" in load_error(tmp_path, {k: v for k, v in smoke_raw.items() if k != "attacks"})
    assert "'reference' must be true or false" in load_error(tmp_path, variant(smoke_raw, reference="yes"))
    assert "n_null" in load_error(tmp_path, variant(smoke_raw, world={"n_null": 2}))
    assert "did you mean 'n_null'" in load_error(tmp_path, variant(smoke_raw, world={"nnull": 20}))
    assert "fprs" in load_error(tmp_path, variant(smoke_raw, metrics={"fprs": [0.01, "low"]}))
    assert "'metrics' must be a mapping" in load_error(tmp_path, variant(smoke_raw, metrics=[1]))


# ---------------------------------------------------------------------------------------- known bugs

@pytest.mark.parametrize("key,value", [("world", [1, 2]), ("utility", "abc")])
def test_non_mapping_world_is_a_config_error(smoke_raw, key, value):
    with pytest.raises(ConfigError):
        parse_suite(variant(smoke_raw, **{key: value}))


@pytest.mark.parametrize("value", [None, 5])
def test_non_list_games_is_a_config_error(smoke_raw, value):
    with pytest.raises(ConfigError):
        parse_suite(variant(smoke_raw, games=value))


def test_empty_games_list_is_a_config_error(smoke_raw):
    with pytest.raises(ConfigError):
        parse_suite(variant(smoke_raw, games=[]))


def test_non_string_top_level_key_is_a_config_error(smoke_raw):
    raw = variant(smoke_raw)
    raw[1] = "x"
    with pytest.raises(ConfigError):
        parse_suite(raw)


# ---------------------------------------------------------------------------------------- parameter sweeps

def test_sweep_expands_into_labelled_validated_entries(smoke_raw):
    raw = variant(smoke_raw, attacks=["loss", {"name": "min_k", "sweep": {"k": [0.05, 0.1, 0.2, 0.5]}},
                                      {"name": "min_k_pp", "label": "mkpp", "sweep": {"k": [0.5, 1]}}])
    s = parse_suite(raw)
    labels = [a.label for a in s.attacks]
    assert labels == ["loss", "min_k(k=0.05)", "min_k(k=0.1)", "min_k(k=0.2)", "min_k(k=0.5)",
                      "mkpp(k=0.5)", "mkpp(k=1.0)"]          # the integer 1 is validated to the float 1.0
    assert [a.instance.k for a in s.attacks[1:5]] == [0.05, 0.1, 0.2, 0.5]
    assert all(type(a.instance).name == "min_k" for a in s.attacks[1:5])
    # each point is its own configured plugin: distinct keys, recorded in the resolved config (and its hash)
    assert len({a.instance.key for a in s.attacks}) == len(s.attacks)
    assert [e["label"] for e in s.config["attacks"]] == labels
    assert s.config_hash != parse_suite(variant(smoke_raw, attacks=["loss", "min_k"])).config_hash


def test_sweep_is_a_cartesian_product_with_fixed_params(smoke_raw):
    raw = variant(smoke_raw, attacks=[{"name": "rmia", "params": {"alpha": 0.3},
                                       "sweep": {"gamma": [1.0, 2.0], "tie_break": [True, False]}}])
    s = parse_suite(raw)
    assert [a.label for a in s.attacks] == ["rmia(gamma=1.0, tie_break=True)", "rmia(gamma=1.0, tie_break=False)",
                                            "rmia(gamma=2.0, tie_break=True)", "rmia(gamma=2.0, tie_break=False)"]
    assert {a.instance.alpha for a in s.attacks} == {0.3}
    assert [(a.instance.gamma, a.instance.tie_break) for a in s.attacks] == [(1.0, True), (1.0, False),
                                                                          (2.0, True), (2.0, False)]


@pytest.mark.parametrize("sweep,words", [
    ({"kk": [0.1]}, ["unknown parameter 'kk'", "did you mean 'k'"]),
    ({"k": [0.0, 0.1]}, ["parameter 'k'", "> 0.0"]),              # validated like any parameter
    ({"k": [1.5]}, ["parameter 'k'", "<= 1.0"]),
    ({"k": ["x"]}, ["parameter 'k'", "use a number"]),
    ({"k": []}, ["at least one value"]),
    ({"k": 0.1}, ["at least one value"]),
    ({"k": [0.1, 0.1]}, ["repeats a value"]),
    ([0.1, 0.2], ["mapping of parameter"]),
    ({}, ["mapping of parameter"]),
])
def test_bad_sweeps_are_config_errors(smoke_raw, tmp_path, sweep, words):
    msg = load_error(tmp_path, variant(smoke_raw, attacks=[{"name": "min_k", "sweep": sweep}]))
    assert "min_k" in msg
    for w in words:
        assert w in msg, msg


def test_sweep_conflicts_and_duplicates(smoke_raw, tmp_path):
    msg = load_error(tmp_path, variant(smoke_raw, attacks=[{"name": "min_k", "params": {"k": 0.2},
                                                            "sweep": {"k": [0.1]}}]))
    assert "both in params and swept" in msg
    msg = load_error(tmp_path, variant(smoke_raw, attacks=[{"name": "min_k", "sweep": {"k": [0.1]}},
                                                           {"name": "min_k", "sweep": {"k": [0.1, 0.2]}}]))
    assert "'min_k(k=0.1)' appears twice" in msg
    # only attacks sweep; a sweep key on a defense is an unknown key, named with the allowed ones
    msg = load_error(tmp_path, variant(smoke_raw, defenses=[{"name": "finetune", "sweep": {"epochs": [1, 2]}}]))
    assert "unknown keys ['sweep']" in msg and "use label, match, name, params" in msg


def test_report_shows_swept_k(smoke_raw):
    from bench.report import split_label, summarize, sweep_summary

    labels = [a.label for a in parse_suite(variant(smoke_raw, attacks=[
        {"name": "min_k", "sweep": {"k": [0.5, 0.05, 0.2, 0.1]}}])).attacks]
    assert [split_label(lab) for lab in labels] == [("min_k", {"k": v}) for v in ("0.5", "0.05", "0.2", "0.1")]
    assert split_label("loss") == ("loss", {})
    aucs = {"0.5": 0.61, "0.05": 0.72, "0.2": 0.66, "0.1": 0.70}
    rows = [{"run": 1, "suite": "s", "task": "t", "model": "m", "defense": "d", "seed": 0, "game": "adapt",
             "attack": lab, "metric": "auc", "value": aucs[split_label(lab)[1]["k"]], "ci_low": None,
             "ci_high": None, "flag": None} for lab in labels]
    rows.append(dict(rows[0], attack="loss", value=0.55))
    text = summarize(rows)
    header = next(line for line in text.splitlines() if line.startswith("defense / game"))
    # columns ordered by K numerically (0.05 < 0.1 < 0.2 < 0.5), not as strings or in suite order
    positions = [header.index(f"min_k(k={k})") for k in ("0.05", "0.1", "0.2", "0.5")]
    assert positions == sorted(positions) and header.index("loss") < positions[0]
    sweep = sweep_summary(rows)
    assert sweep.splitlines()[0] == "AUC by swept parameter"
    assert "min_k  k=0.05: 0.720  k=0.1: 0.700  k=0.2: 0.660  k=0.5: 0.610" in sweep
    assert sweep in text
    assert sweep_summary([r for r in rows if r["attack"] == "loss"]) == ""   # nothing swept: no section


def test_audit_settings_default_validate_and_key_only_when_changed(smoke_raw):
    base = parse_suite(smoke_raw)
    assert base.audit == {"delta": 1e-5, "confidence": 0.95}
    assert "audit" not in base.config  # defaults: run keys of earlier suites unchanged
    assert parse_suite(variant(smoke_raw, audit={"delta": 1e-5})).config_hash == base.config_hash
    other = parse_suite(variant(smoke_raw, audit={"delta": 1e-6, "confidence": 0.99}))
    assert other.audit == {"delta": 1e-6, "confidence": 0.99} and other.config_hash != base.config_hash
    for bad in ({"delta": 1.5}, {"confidence": 1.0}, {"confidence": 0.0}, {"epsilon": 1.0}):
        with pytest.raises(ConfigError, match="audit"):
            parse_suite(variant(smoke_raw, audit=bad))


@pytest.mark.parametrize("name", bundled_suites())
def test_every_bundled_suite_loads(name):
    """A bundled suite that fails to parse (a renamed parameter, a removed plugin) is found here, not by a user."""
    s = load_suite(name)
    assert s.name == name and s.defenses and s.attacks and s.games
    labels = [d.label for d in s.defenses]
    assert len(labels) == len(set(labels)), labels


def _baselines_on(suite: str, track: str) -> tuple:
    """A baselines suite on ``track``: the frozen track (name and content hash), the track's own world, its anchors
    none and finetune first. Returns the suite and its defense entries by label."""
    from bench.tracks import load_track
    s = load_suite(suite)
    assert s.config["track"]["name"] == track and s.config["track"]["hash"] == load_track(track).hash
    assert s.world == parse_suite({"track": track, "defenses": []}).world
    by_label = {d.label: d for d in s.defenses}
    assert list(by_label)[:2] == ["none", "finetune"]
    return s, by_label


def test_quick_baselines_run_on_the_quick_track_beside_its_anchors():
    """The field of built-in defenses ranked on the main track: the track's frozen world, its anchors, one
    configuration per paper recipe."""
    s, by_label = _baselines_on("quick_baselines", "quick")
    assert s.world == load_suite("quick").world and s.seeds == [0, 1]
    assert {"dp-full-eps8", "dp-full-eps1", "dp-lora-eps8", "clip-example", "early_stop", "kd", "guard",
            "finetune-1ep"} <= set(by_label)


def test_realistic_baselines_train_in_the_anchors_recipe():
    """The field on SmolLM2-135M: the realistic track's world and anchors; every configuration that trains all
    weights (early stopping, both distillations' teachers and students, the short fine-tune) at the anchor's
    learning rate and batch, and DP-LoRA on the attention projections the LoRA suite adapts."""
    s, by_label = _baselines_on("realistic_baselines", "realistic")
    assert s.world == load_suite("realistic").world and s.seeds == [0]
    anchor = by_label["finetune"].params
    assert {"dp-lora-eps8", "early_stop", "kd", "guard", "finetune-1ep"} <= set(by_label)
    for label in ("early_stop", "finetune-1ep"):
        assert (by_label[label].params["lr"], by_label[label].params["batch_size"]) == (anchor["lr"],
                                                                                         anchor["batch_size"])
    assert by_label["early_stop"].params["epochs"] == anchor["epochs"]
    for label in ("kd", "guard"):
        p = by_label[label].params
        assert (p["teacher_lr"], p["teacher_epochs"], p["teacher_batch_size"], p["lr"]) == (
            anchor["lr"], anchor["epochs"], anchor["batch_size"], anchor["lr"])
    lora = {d.label: d for d in load_suite("realistic").defenses}["lora"].params
    assert by_label["dp-lora-eps8"].params["target_modules"] == lora["target_modules"]


def test_pii_baselines_train_the_anchors_epochs():
    """The field on Names2IDs: the pii track's world and anchors; every trained configuration but the short
    fine-tune runs the anchor's 24 epochs, so the board compares defenses and not training lengths."""
    s, by_label = _baselines_on("pii_baselines", "pii")
    assert s.seeds == [0, 1]
    assert {"scp_delta_r_b", "dp-full-eps8", "lora", "early_stop", "finetune-4ep"} <= set(by_label)
    for label in ("scp_delta_r_b", "dp-full-eps8", "lora", "early_stop"):
        assert by_label[label].params["epochs"] == by_label["finetune"].params["epochs"] == 24, label
    assert by_label["finetune-4ep"].params["epochs"] == 4


@pytest.mark.parametrize("suite,track,labels", [
    ("canaries_baselines", "canaries", {"scp_delta_r_b", "goldfish", "dedup", "dp-full-eps8", "early_stop"}),
    ("secrets_baselines", "secrets", {"hush-full", "dp-full-eps8", "lora", "goldfish", "early_stop"})])
def test_canaries_and_secrets_baselines_train_the_anchors_epochs(suite, track, labels):
    """The fields on canary exposure and secret-level membership: the track's world and anchors; every trained
    configuration but the short fine-tune runs the anchor's epochs, and the Goldfish loss applies to fine-tuning
    too, since the inserted targets are in the adaptation data and its pretraining loss alone would not reach them."""
    s, by_label = _baselines_on(suite, track)
    assert s.world == load_suite(track).world and s.seeds == [0, 1]
    assert labels | {"finetune-1ep"} <= set(by_label)
    config = {label: d.instance.config for label, d in by_label.items()}  # with the plugins' defaults
    for label in labels:
        assert config[label]["epochs"] == config["finetune"]["epochs"] == 4, label
    assert config["goldfish"]["adapt_goldfish"] is True
    if "dedup" in config:  # canaries: the repeats go from the adaptation data, not only from pretraining
        assert config["dedup"]["adapt_dedup"] is True
    assert config["finetune-1ep"]["epochs"] == 1


def test_users_baselines_run_in_the_users_tracks_recipe():
    """Kandpal et al.'s mitigations on user inference: the users track's world and anchors, and every trained
    configuration in the anchor's recipe (10 epochs, 192-token chunks) but the shortened fine-tune."""
    s, by_label = _baselines_on("users_baselines", "users")
    assert s.world == load_suite("users").world
    assert {"clip-example", "clip-batch", "early_stop", "finetune-3ep"} <= set(by_label)
    for label in ("clip-example", "clip-batch", "early_stop"):
        assert by_label[label].params["epochs"] == by_label["finetune"].params["epochs"] == 10
        assert by_label[label].params["chunk_length"] == 192
    assert by_label["finetune-3ep"].params["epochs"] == 3


@pytest.mark.parametrize("suite,track,unit_label,unit,twin", [
    ("users_unit_dp", "users", "dp-user-eps8", "user", ("users_unit_dp", "dp-record-eps8")),
    ("secrets_unit_dp", "secrets", "dp-secret-eps8", "secret", ("secrets_baselines", "dp-full-eps8")),
    ("canaries_unit_dp", "canaries", "dp-text-eps8", "text", ("canaries_baselines", "dp-full-eps8"))])
def test_unit_level_dp_suites_differ_from_record_level_dp_only_in_the_unit(suite, track, unit_label, unit, twin):
    """Each track's unit-level DP-SGD is compared with a record-level DP-SGD of the same recipe on the same worlds:
    the two configurations differ in ``unit`` alone, so the board shows what the unit buys."""
    s, by_label = _baselines_on(suite, track)
    assert s.world == load_suite(track).world and s.seeds == [0, 1]
    _, twins = _baselines_on(twin[0], track)
    got, ref = by_label[unit_label].instance.config, twins[twin[1]].instance.config
    assert got["unit"] == unit and ref["unit"] == "record"
    assert {k: v for k, v in got.items() if k != "unit"} == {k: v for k, v in ref.items() if k != "unit"}
    assert got["epochs"] == by_label["finetune"].instance.config["epochs"]  # the anchor's recipe
