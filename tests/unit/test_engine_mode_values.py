"""Engine modes as values (`profiles.engines`): read from a profile's `[engines.NAME]` or a marker's inline dict,
applied to both arms' server specs, expanded by the marker into ids, and recorded in the comparability only when
not the default mode (so the nights stored before modes existed stay comparable)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_specdec.errors import ConfigError
from pytest_specdec.markers import expand, varying_fields
from pytest_specdec.profiles import load_profile
from pytest_specdec.profiles.engines import DEFAULT_ENGINE, EngineMode, engine_mode, resolve_engine
from pytest_specdec.vllm.command import ServerSpec

PROFILE = """name = "p"
device = "cpu"
[target]
model = "m"
[server]
args = ["--seed", "0"]
[server.env]
A = "1"
[methods.ngram]
speculative_config = { method = "ngram", prompt_lookup_max = 4 }
[engines.nocache]
args = ["--no-enable-prefix-caching"]
env = { A = "2", B = 3 }
"""


def profile(tmp_path: Path, text: str = PROFILE) -> Any:
    path = tmp_path / "p.toml"
    path.write_text(text)
    return load_profile(str(path))


def test_a_profiles_mode_applies_to_both_arms_after_the_servers_args_and_over_its_env(tmp_path: Path) -> None:
    p = profile(tmp_path)
    mode = p.engines["nocache"]
    assert mode == EngineMode("nocache", ("--no-enable-prefix-caching",), (("A", "2"), ("B", "3")))
    spec = ServerSpec("m", None, ("--seed", "0"), (("A", "1"), ("C", "x")))
    applied = mode.apply(spec)
    assert applied.args == ("--seed", "0", "--no-enable-prefix-caching")
    assert dict(applied.env) == {"A": "2", "B": "3", "C": "x"}
    assert applied.key() != spec.key()
    assert EngineMode().apply(spec) is spec  # the default mode: the server as it is, the same key


def test_the_marker_expands_modes_into_ids_and_params(tmp_path: Path) -> None:
    p = profile(tmp_path)
    inline = {"name": "eager", "args": ["--enforce-eager"]}
    cases = expand({"method": "ngram", "k": 3, "engine": ["default", "nocache", inline]}, p)
    varying = varying_fields(cases)
    assert [c.id(varying) for c in cases] == ["ngram-k3-t0.0-c1-default", "ngram-k3-t0.0-c1-nocache",
                                              "ngram-k3-t0.0-c1-eager"]
    assert [c.engine_mode for c in cases] == [EngineMode(), p.engines["nocache"], EngineMode("eager",
                                                                                             ("--enforce-eager",))]
    assert cases[1].params()["engine_mode"] == {"args": ["--no-enable-prefix-caching"], "env": {"A": "2", "B": "3"}}
    assert cases[1].params()["engine"] == "nocache"
    assert "engine" not in cases[0].params() and "engine_mode" not in cases[0].params()  # as before modes existed
    assert cases[0].engine == DEFAULT_ENGINE
    assert len({c.server_key() for c in cases}) == 3
    # "all": the default mode and each of the profile's, whatever modes the active profile defines.
    assert [c.engine for c in expand({"method": "ngram", "k": 3, "engine": "all"}, p)] == ["default", "nocache"]
    # One mode alone: the default keeps the id it had before modes existed; another is named.
    (plain,) = expand({"method": "ngram", "k": 3}, p)
    (nocache,) = expand({"method": "ngram", "k": 3, "engine": "nocache"}, p)
    assert (plain.id(), nocache.id()) == ("ngram-k3-t0.0-c1", "ngram-k3-t0.0-c1-nocache")


@pytest.mark.parametrize(("value", "said"), [
    ("fast", "engine 'fast' is not an engine mode of the profile; allowed: default, nocache"),
    ({"args": ["--x"]}, "an inline engine mode needs a name"),
    ({"name": "nocache", "args": ["--enforce-eager"]}, "inline engine mode 'nocache' differs from the profile's"),
    ({"name": "x y", "args": ["--enforce-eager"]}, "an engine mode's name must be letters"),
    ({"name": "e", "args": "--enforce-eager"}, "engine mode 'e' args must be a list of `vllm serve` arguments"),
    ({"name": "e", "args": ["--port", "1"]}, "sets --port, but the plugin chooses each server's host"),
    ({"name": "e", "env": {"V": True}}, "engine mode 'e' env V must be a string or a number"),
    ({"name": "e", "argz": []}, "unknown key(s) argz; allowed: args, env"),
    ({"name": "e"}, "adds neither args nor env"),
    ({"name": "default", "args": ["--enforce-eager"]}, "'default' is the profile's server as it is"),
])
def test_a_bad_mode_names_what_to_fix(tmp_path: Path, value: Any, said: str) -> None:
    p = profile(tmp_path)
    with pytest.raises(ConfigError, match=None) as exc:
        resolve_engine(value, p.engines, "specdec marker: engine")
    assert said in str(exc.value), exc.value


def test_a_profiles_bad_mode_fails_when_the_file_is_read(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"p.toml \[engines.x\]: engine mode 'x': unknown key\(s\) arg"):
        profile(tmp_path, PROFILE + "[engines.x]\narg = []\n")
    with pytest.raises(ConfigError, match="engines must be a table of engine modes"):
        profile(tmp_path, "engines = 1\n" + PROFILE[:PROFILE.index("[engines.nocache]")])


def test_comparability_records_a_mode_other_than_the_default(tmp_path: Path) -> None:
    from pytest_specdec.gate.conditions import comparability
    from pytest_specdec.measure.types import Sampling

    p = profile(tmp_path)
    ref = ServerSpec("m", None, ("--seed", "0"))

    def comp(mode: EngineMode | None) -> dict[str, Any]:
        return comparability(p, {"hardware": "x"}, "ngram", {}, {}, ref, None, Sampling(0.0), mode)

    assert "engine" not in comp(None) and "engine" not in comp(EngineMode())
    assert comp(p.engines["nocache"])["engine"] == {"name": "nocache", "args": ["--no-enable-prefix-caching"],
                                                    "env": {"A": "2", "B": "3"}}
    assert engine_mode("x", {"env": {"V": 1}}, "w").definition() == {"args": [], "env": {"V": "1"}}
