"""The option table: one row per option or ini value, each filling one `Settings` field."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import cast

import pytest

from pytest_specdec.options import OPTIONS, Option, Settings


def test_every_setting_is_filled_by_exactly_one_option() -> None:
    settings = [o.setting for o in OPTIONS]
    assert sorted(settings) == sorted(f.name for f in dataclasses.fields(Settings))
    flags = [o.flag for o in OPTIONS if o.flag is not None]
    inis = [o.ini for o in OPTIONS if o.ini is not None]
    assert len(set(flags)) == len(flags) and len(set(inis)) == len(inis)


def test_a_setting_is_named_after_its_flag_or_ini_value_unless_said() -> None:
    assert Option("--specdec-max-runs", help="h").setting == "max_runs"
    assert Option("--gpu", help="h").setting == "gpu"
    assert Option(ini="specdec_keep_sessions", help="h").setting == "keep_sessions"
    assert Option("--specdec-json", setting="json_path", help="h").setting == "json_path"
    with pytest.raises(ValueError, match="neither a flag nor an ini value"):
        Option(setting="x", help="h")


@pytest.mark.parametrize("module", ["pytest_benchmark", "ruptures", "openai"])
def test_a_missing_optional_dependency_names_its_extra(module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest-benchmark, ruptures and openai are extras: the plugin starts without them, and the feature that
    needs one says which extra to install, at configure for --specdec-benchmark-json, else where it is used."""
    import types

    from pytest_specdec.errors import EXTRAS, ConfigError, import_extra
    from pytest_specdec.option_values import extra_path

    monkeypatch.setitem(sys.modules, module, None)  # an import of it raises ImportError, as when not installed
    dist, extra = EXTRAS[module]
    with pytest.raises(ConfigError, match=rf"^the feature needs {dist}, which is not installed .*: pip install "
                                          rf"'pytest-specdec\[{extra}\]'$"):
        import_extra(module, "the feature")
    config = cast(pytest.Config, types.SimpleNamespace(rootpath="/root"))  # what extra_path reads of a Config
    with pytest.raises(pytest.UsageError, match=rf"--flag needs {dist}, .*'pytest-specdec\[{extra}\]'"):
        extra_path(module, "--flag")("out.json", config)
    assert extra_path(module, "--flag")(None, config) is None  # not asked for


def test_the_plugin_starts_without_its_optional_dependencies(monkeypatch: pytest.MonkeyPatch,
                                                               request: pytest.FixtureRequest) -> None:
    """No module imports an extra's package at its top: the plugin, the session, the fixture and the command
    import with them set aside (the modules imported here are dropped again, the earlier ones put back)."""
    import importlib

    before = set(sys.modules)
    request.addfinalizer(lambda: [sys.modules.pop(n) for n in set(sys.modules) - before])
    for module in ("pytest_benchmark", "ruptures", "openai"):
        monkeypatch.setitem(sys.modules, module, None)
    for name in [n for n in sys.modules if n.startswith("pytest_specdec")]:
        monkeypatch.delitem(sys.modules, name)
    for name in ("pytest_specdec.plugin", "pytest_specdec.session", "pytest_specdec.fixture", "pytest_specdec.cli",
                 "pytest_specdec.output.results", "pytest_specdec.output.history", "pytest_specdec.gate.trend",
                 "pytest_specdec.app.compare", "pytest_specdec.app.ab_compare", "pytest_specdec.app.history",
                 "pytest_specdec.app.calibrate"):
        importlib.import_module(name)


def test_compare_fdr_is_now_multiplicity_and_the_former_spelling_warns(tmp_path: Path) -> None:
    """`pytest-specdec compare --fdr` (Holm controls the FWER, not the FDR) is `--multiplicity`; the former
    spelling still sets it, with a deprecation warning."""
    from pytest_specdec.cli import main, parser
    from pytest_specdec.errors import SpecDecDeprecationWarning

    assert parser().parse_args(["compare", "a.json", "b.json", "--fdr", "holm"]).multiplicity == "holm"
    assert parser().parse_args(["compare", "a.json", "b.json", "--multiplicity", "holm"]).multiplicity == "holm"
    with pytest.warns(SpecDecDeprecationWarning, match="^--fdr is deprecated and goes in the next release: use "
                                                       "--multiplicity$"):
        main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--fdr", "holm"])


def test_every_option_and_former_spelling_is_in_the_options_page() -> None:
    """docs/options.md names every flag and ini value (it once lacked --specdec-base-python), and each renamed
    option's former spelling."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "options.md").read_text()
    names = [n for o in OPTIONS for n in (o.flag, o.old, o.ini) if n is not None]
    assert [n for n in names if f"`{n}" not in page and f"ini `{n}`" not in page] == []
