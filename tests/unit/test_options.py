"""The option table: one row per option or ini value, each filling one `Settings` field."""

from __future__ import annotations

import dataclasses

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
