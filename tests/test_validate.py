"""`privbench validate`: registration problems are named with their fix; good plugins pass on a tiny world."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from bench.cli import main
from bench.sandbox import Limits
from bench.validate import TINY_SUITE, registration_checks, validate

PLUGINS = Path(__file__).parent / "plugins"
LIMITS = Limits(wall_s=300, memory_bytes=3 << 30)


def test_tiny_suite_matches_the_test_fixture():
    """validate's tiny world and tests/plugins/tiny.yaml are one world, so they share cached models."""
    assert yaml.safe_load((PLUGINS / "tiny.yaml").read_text()) == TINY_SUITE


def test_registration_problems_each_name_a_fix(cache, capsys):
    env_before = dict(os.environ)
    rc = main(["validate", str(PLUGINS / "bad_registration.py"), "--cache", str(cache.root), "--timeout", "120"])
    out, err = capsys.readouterr()
    assert os.environ == env_before
    assert rc == 1
    failed = {line.split(":")[0].removeprefix("FAIL  ") for line in out.splitlines() if line.startswith("FAIL")}
    assert failed == {"name", "version", "docstring", "description", "parameter help", "defaults validate", "adapt"}
    line = next(x for x in out.splitlines() if x.startswith("FAIL  defaults validate"))
    assert "'lr'" in line and "make every default satisfy" in line
    assert "ok    import" in out and "ok    kind" in out and "tiny world" not in out  # stops before training
    assert err.startswith("error: 7 of") and len(err.strip().splitlines()) == 1


def test_registration_checks_pass_for_a_builtin():
    from defenses.finetune import FineTune
    checks = registration_checks("defense", "finetune", FineTune)
    assert [c.name for c in checks if not c.ok] == []   # its module's docstring documents the one class in it

    class Undocumented(FineTune):
        __doc__ = None
        __module__ = "nowhere"            # a module that is not imported: no module docstring either
    checks = registration_checks("defense", "undocumented", Undocumented)
    assert [c.name for c in checks if not c.ok] == ["docstring"]


def test_import_error_is_reported(tmp_path, cache):
    bad = tmp_path / "broken.py"
    bad.write_text("import this_module_does_not_exist\n")
    checks = validate(str(bad), cache=str(cache.root), limits=LIMITS)
    assert not checks[0].ok and checks[0].name == "import" and "this_module_does_not_exist" in checks[0].problem


@pytest.mark.parametrize("ending", ["import sys\nsys.exit(0)\n", "import os\nos._exit(0)\n"])
def test_a_plugin_that_ends_the_process_is_named(tmp_path, cache, ending):
    """Exit code 0 and no check reported: the child ended before its first check, which the line says (it used to
    read as an unexplained "did not finish (exit 0)")."""
    quitter = tmp_path / "quitter.py"
    quitter.write_text('"""Ends the validating process at import."""\n' + ending)
    checks = validate(str(quitter), cache=str(cache.root), limits=LIMITS)
    assert [c.name for c in checks] == ["child"] and not checks[0].ok
    assert "exit 0, before its first check" in checks[0].problem and "sys.exit, os._exit" in checks[0].problem


def test_missing_plugin_file(capsys):
    rc = main(["validate", "no/such/plugin.py"])
    err = capsys.readouterr().err
    assert rc == 2 and "not found" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("plugin,what", [("good_defense.py", "trains and releases a model"),
                                         ("good_attack.py", "scores every target")])
def test_good_plugins_pass_on_the_tiny_world(cache, plugin, what):
    checks = validate(str(PLUGINS / plugin), cache=str(cache.root), limits=LIMITS)
    assert all(c.ok for c in checks), [c.line() for c in checks if not c.ok]
    assert f"tiny world: {what}" in {c.name for c in checks}
