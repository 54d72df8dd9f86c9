"""Engine modes: named sets of `vllm serve` arguments and environment that a suite measures as a dimension of its
tests (``specdec(engine=["default", "eager"])``), and that an A/B session compares on one install
(``--specdec-base-engine NAME``).

Why a dimension of its own: the regressions vLLM's users report often live in one engine mode only (Model Runner
V2, async scheduling, a compilation mode), and a mode set only in the profile could not be measured beside another,
nor judged against it, in one session. A mode is defined once, in the profile's ``[engines.NAME]`` table or inline
in the marker (``{"name": ..., "args": [...], "env": {...}}``); its arguments come after the profile's ``[server]
args`` (argparse: the last occurrence wins) and its environment over ``[server.env]``, in both arms of a test, so
the speedup is always spec ÷ reference within one mode. ``default`` is the profile's server as it is."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_specdec.errors import ConfigError

if TYPE_CHECKING:
    from pytest_specdec.vllm.command import ServerSpec

#: The mode every test runs in unless its marker says otherwise: the profile's server, nothing added.
DEFAULT_ENGINE = "default"
#: A marker's ``engine="all"``: the default mode and each of the profile's, so one suite runs every mode each
#: hardware profile defines (a GPU profile's async scheduling, the CPU's none of it).
ALL_ENGINES = "all"
#: What a mode's name may be: it becomes part of test ids and baseline file names.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+]*")
_KEYS = frozenset({"args", "env"})


@dataclass(frozen=True, order=True)
class EngineMode:
    """One engine mode: its name and what it adds to every server of a test (both arms)."""

    name: str = DEFAULT_ENGINE
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    @property
    def is_default(self) -> bool:
        return self.name == DEFAULT_ENGINE

    def definition(self) -> dict[str, Any]:
        """What the mode adds, as results and baselines record it (``{"args": [...], "env": {...}}``)."""
        return {"args": list(self.args), "env": dict(self.env)}

    def to_json(self) -> str:
        """The definition as canonical JSON: what a test's case carries (its hash and order stay plain)."""
        return json.dumps(self.definition(), sort_keys=True)

    @classmethod
    def from_json(cls, name: str, text: str) -> EngineMode:
        """The mode `to_json` wrote, under its name."""
        d = json.loads(text)
        return cls(name, tuple(d["args"]), tuple(sorted(d["env"].items())))

    def apply(self, spec: ServerSpec) -> ServerSpec:
        """``spec`` in this mode: its args after the server's, its env over the server's."""
        if self.is_default:
            return spec
        import dataclasses

        env = {**dict(spec.env), **dict(self.env)}
        return dataclasses.replace(spec, args=(*spec.args, *self.args), env=tuple(sorted(env.items())))


def engine_mode(name: Any, value: Any, where: str) -> EngineMode:
    """A mode from its table (a profile's ``[engines.NAME]``) or a marker's dict; anything else is a ConfigError
    naming ``where`` and what to write instead."""
    from pytest_specdec.profiles.schema import check_server_args

    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(f"{where}: an engine mode's name must be letters, digits, '_', '.' or '+' (it names test "
                          f"ids and baseline files), got {name!r}")
    if name == ALL_ENGINES:
        raise ConfigError(f"{where}: {ALL_ENGINES!r} names every mode of the profile (engine={ALL_ENGINES!r}) and "
                          "cannot name one; give the mode another name")
    if name == DEFAULT_ENGINE and value:
        raise ConfigError(f"{where}: {DEFAULT_ENGINE!r} is the profile's server as it is and cannot be redefined; "
                          "give the mode another name")
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: engine mode {name!r} must be a table like "
                          f"{{ args = [\"--no-enable-prefix-caching\"], env = {{ VAR = \"1\" }} }}, got {value!r}")
    unknown = sorted(set(value) - _KEYS)
    if unknown:
        raise ConfigError(f"{where}: engine mode {name!r}: unknown key(s) {', '.join(unknown)}; allowed: args, env")
    args = value.get("args", [])
    check_server_args(args, f"{where}: engine mode {name!r} args")
    env = value.get("env", {})
    if not isinstance(env, Mapping) or not all(isinstance(k, str) and k for k in env):
        raise ConfigError(f"{where}: engine mode {name!r} env must be a table of environment variables, got {env!r}")
    for key, val in env.items():
        if isinstance(val, bool) or not isinstance(val, (str, int, float)):
            raise ConfigError(f"{where}: engine mode {name!r} env {key} must be a string or a number, got {val!r}")
    if name != DEFAULT_ENGINE and not args and not env:
        raise ConfigError(f"{where}: engine mode {name!r} adds neither args nor env, so it is the default mode under "
                          f"another name; give it args or env, or use {DEFAULT_ENGINE!r}")
    return EngineMode(name, tuple(str(a) for a in args), tuple(sorted((str(k), str(v)) for k, v in env.items())))


def profile_engines(raw: Mapping[str, Any], path: object) -> dict[str, EngineMode]:
    """A profile's ``[engines.NAME]`` tables, checked."""
    table = raw.get("engines", {})
    if not isinstance(table, Mapping):
        raise ConfigError(f"profile {path}: engines must be a table of engine modes ([engines.NAME]), got {table!r}")
    return {name: engine_mode(name, value, f"profile {path} [engines.{name}]") for name, value in table.items()}


def resolve_engine(value: Any, engines: Mapping[str, EngineMode], where: str) -> EngineMode:
    """A marker's ``engine=`` value: a mode's name (the profile's, or ``default``) or an inline definition
    ``{"name": ..., "args": [...], "env": {...}}`` (a suite's own mode, defined beside its tests)."""
    if isinstance(value, Mapping):
        if "name" not in value:
            raise ConfigError(f"{where}: an inline engine mode needs a name: {{\"name\": \"eager\", \"args\": [...]}}, "
                              f"got {dict(value)!r}")
        name = value["name"]
        mode = engine_mode(name, {k: v for k, v in value.items() if k != "name"}, where)
        known = engines.get(str(name))
        if known is not None and known != mode:
            raise ConfigError(f"{where}: inline engine mode {name!r} differs from the profile's [engines.{name}] "
                              f"({known.definition()}); one name, one mode: rename one of them")
        return mode
    if value == DEFAULT_ENGINE:
        return EngineMode()
    if isinstance(value, str) and value in engines:
        return engines[value]
    allowed = ", ".join([DEFAULT_ENGINE, *sorted(engines)])
    raise ConfigError(f"{where}: engine {value!r} is not an engine mode of the profile; allowed: {allowed} (define "
                      "one in the profile's [engines.NAME], or inline as {\"name\": ..., \"args\": [...]})")


def resolve_engines(values: list[Any], engines: Mapping[str, EngineMode], where: str) -> list[EngineMode]:
    """A marker's ``engine=`` list (`resolve_engine` each; ``all`` stands for the default mode and every one of the
    profile's, in the file's order), without repeats."""
    out: list[EngineMode] = []
    for value in values:
        out += [EngineMode(), *engines.values()] if value == ALL_ENGINES else [resolve_engine(value, engines, where)]
    return list(dict.fromkeys(out))


def check_with_vllm(modes: Mapping[str, EngineMode], model: str, server_args: tuple[str, ...]) -> None:
    """Each mode's command line through the installed vLLM's own `serve` parser (`vllm.check`), as the profiles'
    are checked: a flag vLLM does not know is a ConfigError naming the mode, before any server starts. Without
    vLLM installed (an endpoint session's client) nothing is checked here: the endpoint's server is someone else's."""
    from pytest_specdec.vllm.check import parse_serve, serve_parser
    from pytest_specdec.vllm.cli import vllm_distribution

    wanted = [m for m in modes.values() if m.args]
    if not wanted or vllm_distribution() is None:
        return
    parser = serve_parser()
    for mode in wanted:
        try:
            parse_serve(parser, ["serve", model, *server_args, *mode.args])
        except ConfigError as exc:
            raise ConfigError(f"engine mode {mode.name!r} (args {list(mode.args)}): {exc}") from None
