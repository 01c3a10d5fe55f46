"""Tests for bench.registry and bench.params: built-ins, lookups, parameter validation, entry-point discovery."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from bench.errors import ConfigError, RegistryError
from bench.params import Param, validate_params
from bench.registry import ATTACKS, DEFENSES, REGISTRIES, TASKS, Registry

BUILTIN_ATTACKS = {"loss", "zlib", "min_k", "min_k_pp", "reference"}


# ---------------------------------------------------------------------------------------- built-ins

def test_builtins_are_registered():
    assert BUILTIN_ATTACKS <= set(ATTACKS.names())
    assert {"finetune", "lora"} <= set(DEFENSES.names())
    assert "mini_pile" in TASKS.names()
    assert set(REGISTRIES) == {"attacks", "defenses", "tasks"}
    for name in BUILTIN_ATTACKS:
        cls = ATTACKS.get(name)
        assert cls.name == name and cls.kind == "attack"
        assert ATTACKS.origin(name) == "builtin"
        assert "token_logprobs" in cls.info()["requires"]
    assert "reference_model" in ATTACKS.get("reference").requires
    assert DEFENSES.get("lora").kind == "defense" and TASKS.get("mini_pile").kind == "task"


def test_unknown_name_suggests_near_miss():
    with pytest.raises(RegistryError, match="did you mean 'loss'") as err:
        ATTACKS.get("los")
    assert "unknown attack 'los'" in str(err.value)
    with pytest.raises(RegistryError, match="did you mean 'lora'"):
        DEFENSES.create("lorra")
    with pytest.raises(RegistryError) as err:
        ATTACKS.get("qqqqqqqq")
    assert "did you mean" not in str(err.value)
    assert all(n in str(err.value) for n in BUILTIN_ATTACKS)  # lists what is known instead


def test_registering_a_different_class_under_a_taken_name_fails():
    reg = Registry("attack")
    reg._loaded = True  # no built-ins, no entry points: an isolated registry

    class A:
        pass

    class B:
        pass

    reg.register("x")(A)
    reg.register("x")(A)  # the same class again is fine (module reloads)
    with pytest.raises(RegistryError, match="registered twice"):
        reg.register("x")(B)
    with pytest.raises(RegistryError, match="no name"):
        reg.register("")(B)
    assert reg.names() == ["x"] and reg.get("x") is A


# ---------------------------------------------------------------------------------------- params

def test_param_wrong_type_is_rejected():
    with pytest.raises(ConfigError, match=r"parameter 'batch_size' is '16' \(str\): use an integer"):
        DEFENSES.create("finetune", {"batch_size": "16"})
    with pytest.raises(ConfigError, match="batch_size.*use an integer"):
        DEFENSES.create("finetune", {"batch_size": True})  # bool is not an int here
    with pytest.raises(ConfigError, match="batch_size"):
        DEFENSES.create("finetune", {"batch_size": 2.5})
    with pytest.raises(ConfigError, match="k.*use a number"):
        ATTACKS.create("min_k", {"k": "a fifth"})
    with pytest.raises(ConfigError, match="mode.*one of"):
        ATTACKS.create("reference", {"mode": "product"})
    with pytest.raises(ConfigError, match="must not be null"):
        ATTACKS.create("min_k", {"k": None})


def test_param_out_of_range_is_rejected():
    with pytest.raises(ConfigError, match=r"k' is 1.5: it must be <= 1.0"):
        ATTACKS.create("min_k", {"k": 1.5})
    with pytest.raises(ConfigError, match=r"it must be > 0.0"):
        ATTACKS.create("min_k", {"k": 0.0})  # low is exclusive
    assert ATTACKS.create("min_k", {"k": 1.0}).k == 1.0  # high is inclusive
    with pytest.raises(ConfigError, match="batch_size.*>= 1"):
        DEFENSES.create("finetune", {"batch_size": 0})
    with pytest.raises(ConfigError, match="finite"):
        DEFENSES.create("finetune", {"lr": float("nan")})


def test_unknown_param_gets_a_suggestion():
    with pytest.raises(ConfigError, match="unknown parameter 'kk': did you mean 'k'"):
        ATTACKS.create("min_k", {"kk": 0.3})
    with pytest.raises(ConfigError, match="unknown parameter 'learning_rate'"):
        DEFENSES.create("finetune", {"learning_rate": 0.1})
    with pytest.raises(ConfigError, match="known parameters: none"):
        ATTACKS.create("loss", {"k": 0.1})


def test_param_coercions():
    d = DEFENSES.create("finetune", {"lr": "1e-3", "epochs": 2, "batch_size": 8.0})
    assert d.lr == 0.001 and isinstance(d.lr, float)  # YAML reads 1e-3 as a string
    assert d.epochs == 2.0 and isinstance(d.epochs, float)
    assert d.batch_size == 8 and type(d.batch_size) is int
    assert d.config["lr"] == 0.001
    # defaults fill in everything not given
    assert set(d.config) == {p.name for p in type(d).params}
    p = Param("names", list, [], item_type=str)
    assert p.validate(("a", "b"), "o") == ["a", "b"]
    with pytest.raises(ConfigError, match="use a string"):
        p.validate(["a", 1], "o")
    with pytest.raises(ConfigError, match="use true or false"):
        Param("flag", bool, False).validate("yes", "o")
    assert Param("x", int, None, nullable=True).validate(None, "o") is None


def test_validate_params_fills_defaults_and_checks():
    specs = (Param("a", int, 1, low=0), Param("b", str, "x", choices=("x", "y")))
    assert validate_params("o", specs, None) == {"a": 1, "b": "x"}
    assert validate_params("o", specs, {"b": "y"}) == {"a": 1, "b": "y"}
    with pytest.raises(ConfigError, match="^o: unknown parameter 'c'"):
        validate_params("o", specs, {"c": 1})


def test_plugin_key_tracks_params():
    base = ATTACKS.create("min_k")
    assert base.key == ATTACKS.create("min_k", {"k": 0.2}).key  # an explicit default is the same config
    assert base.key == ATTACKS.create("min_k").key  # stable
    assert ATTACKS.create("min_k", {"k": 0.3}).key != base.key
    assert ATTACKS.create("min_k_pp").key != base.key  # same params, different plugin
    assert ATTACKS.create("loss").key != ATTACKS.create("zlib").key
    ft = DEFENSES.create("finetune")
    assert DEFENSES.create("finetune", {"lr": "2e-3"}).key == ft.key  # 2e-3 is the default, given as a string
    assert DEFENSES.create("finetune", {"lr": 1e-3}).key != ft.key
    assert repr(ATTACKS.create("min_k", {"k": 0.5})) == "MinKAttack(k=0.5)"


def test_info_lists_version_and_params():
    info = ATTACKS.get("min_k").info()
    assert info["name"] == "min_k" and info["version"] and info["kind"] == "attack"
    assert [p["name"] for p in info["params"]] == ["k"]
    assert info["params"][0]["type"] == "float" and info["params"][0]["default"] == 0.2


# ---------------------------------------------------------------------------------------- entry points

DEMO = '''
from bench.attack import Attack
from bench.params import Param


class DemoAttack(Attack):
    name = "demo_attack"
    version = "9.9"
    description = "A demo attack installed through an entry point."
    params = (Param("alpha", float, 0.5, "a demo knob", low=0.0, high=1.0),)

    def score(self, view):
        return [0.0] * len(view.targets)
'''


def _dist(root, pkg: str, dist_name: str, code: str, entry_points: str) -> None:
    (root / pkg).mkdir()
    (root / pkg / "__init__.py").write_text(textwrap.dedent(code))
    info = root / f"{pkg}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)


@pytest.fixture
def plugin_dir(tmp_path):
    _dist(tmp_path, "pbext_demo", "pbext-demo", DEMO, "[privbench.attacks]\ndemo_attack = pbext_demo:DemoAttack\n")
    yield tmp_path
    for mod in ("pbext_demo", "pbext_broken"):
        sys.modules.pop(mod, None)


@pytest.fixture
def broken_plugin_dir(plugin_dir):
    _dist(plugin_dir, "pbext_broken", "pbext-broken", 'raise ImportError("simulated broken plugin")\n',
          "[privbench.attacks]\nbroken_attack = pbext_broken:Broken\n")
    return plugin_dir


def test_entry_point_plugin_is_discovered(plugin_dir, monkeypatch):
    monkeypatch.syspath_prepend(str(plugin_dir))
    reg = Registry("attack")
    assert "demo_attack" in reg.names()
    cls = reg.get("demo_attack")
    assert cls.version == "9.9" and cls.kind == "attack"
    assert "entry point" in reg.origin("demo_attack") and "pbext-demo" in reg.origin("demo_attack")
    assert reg.load_errors == []
    # an installed plugin gets the same parameter validation as a built-in
    assert reg.create("demo_attack", {"alpha": "0.25"}).alpha == 0.25
    with pytest.raises(ConfigError, match="alpha"):
        reg.create("demo_attack", {"alpha": 2})
    with pytest.raises(RegistryError, match="did you mean 'demo_attack'"):
        reg.get("demo_atack")


def test_broken_entry_point_is_reported_not_raised(broken_plugin_dir, monkeypatch):
    monkeypatch.syspath_prepend(str(broken_plugin_dir))
    reg = Registry("attack")
    names = reg.names()  # must not raise
    assert "demo_attack" in names and "broken_attack" not in names
    assert len(reg.load_errors) == 1
    assert "broken_attack" in reg.load_errors[0] and "ImportError" in reg.load_errors[0]
    assert "simulated broken plugin" in reg.load_errors[0]


def test_cli_lists_entry_point_plugins_and_survives_a_broken_one(broken_plugin_dir):
    """One subprocess (the CLI imports torch, seconds per call): a good and a broken plugin side by side."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(broken_plugin_dir)] + [p for p in [env.get("PYTHONPATH")] if p])
    proc = subprocess.run([sys.executable, "-m", "bench", "list", "attacks", "--format", "json"],
                          cwd=broken_plugin_dir, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    listed = {a["name"]: a for a in json.loads(proc.stdout)["attacks"]}
    assert listed["demo_attack"]["version"] == "9.9"
    assert "pbext-demo" in listed["demo_attack"]["origin"]
    assert [p["name"] for p in listed["demo_attack"]["params"]] == ["alpha"]
    assert BUILTIN_ATTACKS <= set(listed)
    assert "broken_attack" not in listed
    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert err and all(line.startswith("warning: could not load") for line in err), proc.stderr
    assert "broken_attack" in proc.stderr and "Traceback" not in proc.stderr


def test_cli_table_shows_entry_point_plugin(plugin_dir, monkeypatch, capsys):
    """The table format, in process: the CLI reads the module-level registries, so swap in a fresh one."""
    import bench.registry
    from bench.cli import main

    monkeypatch.syspath_prepend(str(plugin_dir))
    monkeypatch.setitem(bench.registry.REGISTRIES, "attacks", Registry("attack"))
    assert main(["list", "attacks"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "demo_attack" in ln)
    assert "v9.9" in line and "entry point pbext-demo" in line
    assert "alpha (float, default 0.5)" in out


@pytest.mark.parametrize("param", ["reference", "score", "name", "config", "requires"])
def test_a_parameter_may_not_shadow_the_plugin_api(param):
    from bench.attack import Attack
    from bench.errors import RegistryError
    from bench.params import Param
    from bench.registry import Registry

    class Shadowing(Attack):
        params = (Param(param, float, 1.0, "shadows the API"),)

        def score(self, view):
            return [0.0] * len(view.targets)

    with pytest.raises(RegistryError, match=rf"parameter\(s\) \['{param}'\] would shadow the plugin API"):
        Registry("attack").register("shadowing")(Shadowing)


def test_every_builtin_parameter_name_is_free():
    from bench.registry import REGISTRIES, reserved_param_names
    for reg in REGISTRIES.values():
        for name in reg.names():
            cls = reg.get(name)
            assert not reserved_param_names(cls) & {p.name for p in cls.params}, name
