"""The values of the plugin's options: argparse types that reject a bad flag with the format expected, and
the readers that turn an option's (or ini value's) raw value into its setting. `options.py` declares the
options with them; nothing here reads `config.option` itself.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

N = TypeVar("N", int, float)


def _number(value: str, convert: Callable[[str], N], ok: Callable[[N], bool], expected: str) -> N:
    """Parse `value` with `convert` and check it; the argparse error says what was expected."""
    try:
        number = convert(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {value!r}") from None
    if not ok(number):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {value!r}")
    return number


def positive_int(value: str) -> int:
    """argparse type: an integer >= 1, with the accepted format in the error."""
    return _number(value, int, lambda n: n >= 1, "a whole number >= 1")


def positive_float(value: str) -> float:
    return _number(value, float, lambda n: n > 0, "a number > 0")


def non_negative_float(value: str) -> float:
    return _number(value, float, lambda n: n >= 0, "a number >= 0")


def endpoint_url(value: str) -> str:
    """argparse type: an http(s) base URL (no /v1 suffix needed)."""
    if not value.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"expected an http:// or https:// URL, got {value!r}")
    value = value.rstrip("/")
    return value[: -len("/v1")] if value.endswith("/v1") else value


UPDATE_MODES = ("all", "missing")


class UpdateBaselines(argparse.Action):
    """`--update-baselines [missing]`: the bare flag means all; `=missing` (or `missing` after a space)
    only creates missing baselines.

    The value is optional, so argparse hands this action whatever follows the bare flag, e.g. a test path
    in `pytest --update-baselines suites/`. Such a value is not a mode: the flag means all, and the path
    is kept (`specdec_update_paths`) for the plugin to give back to the command line's test paths.
    """

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        value = "all" if values is None else str(values)
        if value not in UPDATE_MODES:
            if not os.path.exists(value.split("::", 1)[0]):  # neither a mode nor a test path: a typo
                raise argparse.ArgumentError(self, f"expected --update-baselines (all) or "
                                                   f"--update-baselines=missing, got {value!r}")
            namespace.specdec_update_paths = [*getattr(namespace, "specdec_update_paths", []), value]
            value = "all"
        setattr(namespace, self.dest, value)


#: Where `renamed` notes each deprecated spelling given (on `config.option`), for the warning at configure.
RENAMED_DEST = "specdec_renamed"


def renamed(new_flag: str, new_dest: str) -> type[argparse.Action]:
    """The action of a deprecated spelling of ``new_flag``: its value (already typed and checked against the
    choices by argparse) goes to ``new_dest``, and the spelling is noted so the session warns about it."""

    class Renamed(argparse.Action):
        def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                     option_string: str | None = None) -> None:
            setattr(namespace, new_dest, values)
            used = getattr(namespace, RENAMED_DEST, None) or []
            setattr(namespace, RENAMED_DEST, [*used, (str(option_string), new_flag)])

    return Renamed


def alpha_value(value: str) -> float:
    """argparse type: a one-sided significance level (`gate.stats.alpha_ok`), for the options and the CLI."""
    from pytest_specdec.gate.stats import ALPHA_RANGE, alpha_ok

    return _number(value, float, alpha_ok, ALPHA_RANGE)


def threshold_item(value: str) -> str:
    """argparse type: METRIC=MAGNITUDE (kept as the string, checked again when the thresholds are built)."""
    from pytest_specdec.gate.thresholds import parse_threshold_items

    try:
        parse_threshold_items([value], "--specdec-threshold")
    except Exception as exc:  # ConfigError: its message names what is allowed
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def dataset_spec(value: str) -> str:
    """argparse type: builtin or [FORMAT:]PATH[#CATEGORY,...] (kept as the string; the file is read later)."""
    from pytest_specdec.errors import ConfigError
    from pytest_specdec.measure.datasets import DatasetSpec

    try:
        DatasetSpec.parse(value)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def gpu_list(value: str) -> str:
    """argparse type: comma-separated GPU ids (kept as the string; gpus.parse_gpu_list splits it)."""
    from pytest_specdec.servers.gpus import GpuLeaseError, parse_gpu_list

    try:
        parse_gpu_list(value, "--specdec-gpus")
    except GpuLeaseError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--specdec-gpus: ")) from None
    return value


def host_address(value: str) -> str:
    """argparse type: an IP address (127.0.0.1, ::1, 0.0.0.0) or a host name of this machine."""
    import ipaddress
    import re

    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    if re.fullmatch(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?", value):
        return value
    raise argparse.ArgumentTypeError(f"expected an IP address (e.g. 127.0.0.1) or a host name, got {value!r}")


def as_is(value: Any, config: pytest.Config) -> Any:
    return value


def as_bool(value: Any, config: pytest.Config) -> bool:
    return bool(value)


def rooted(value: str, config: pytest.Config) -> Path:
    """An output or input directory: a relative path is under the rootdir."""
    path = Path(value)
    return path if path.is_absolute() else Path(str(config.rootpath)) / path


def rooted_or_none(value: str | None, config: pytest.Config) -> Path | None:
    """An output path option: relative paths are under the rootdir, like --specdec-reports-dir."""
    return rooted(value, config) if value else None


def extra_path(module: str, flag: str) -> Callable[[str | None, pytest.Config], Path | None]:
    """An output path option whose file needs an optional dependency (`errors.EXTRAS`): given without it
    installed, a usage error naming the extra, before anything is measured."""

    def read(value: str | None, config: pytest.Config) -> Path | None:
        if value:
            import importlib.util

            from pytest_specdec.errors import EXTRAS

            try:
                missing = importlib.util.find_spec(module) is None
            except (ImportError, ValueError):  # a broken install, or one set aside (sys.modules[module] = None)
                missing = True
            if missing:
                dist, extra = EXTRAS[module]
                raise pytest.UsageError(f"{flag} needs {dist}, which is not installed: "
                                        f"pip install 'pytest-specdec[{extra}]'")
        return rooted_or_none(value, config)

    return read


def absolute_or_none(value: str | None, config: pytest.Config) -> str | None:
    """An input path from the invocation directory (`~` expanded), made absolute so servers started elsewhere
    find it."""
    return str((Path(config.invocation_params.dir) / Path(value).expanduser()).absolute()) if value else None


def path_or_none(value: str | None, config: pytest.Config) -> Path | None:
    return Path(value) if value else None


def strings(value: list[Any], config: pytest.Config) -> tuple[str, ...]:
    return tuple(str(x) for x in value)


def ini_keep_sessions(value: str, config: pytest.Config) -> int:
    try:
        return positive_int(str(value).strip())
    except argparse.ArgumentTypeError as exc:
        raise pytest.UsageError(f"ini specdec_keep_sessions: {exc}") from None


def ini_threshold_items(value: list[Any], config: pytest.Config) -> tuple[str, ...]:
    from pytest_specdec.errors import ConfigError
    from pytest_specdec.gate.thresholds import parse_threshold_items

    items = strings(value, config)
    try:
        parse_threshold_items(items, "ini specdec_thresholds")
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None
    return items


def ini_gate(value: list[Any], config: pytest.Config) -> tuple[str, ...]:
    from pytest_specdec.errors import ConfigError
    from pytest_specdec.gate.thresholds import check_gate

    try:
        return tuple(check_gate(list(strings(value, config)), "ini specdec_gate"))
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None


def dataset_path(value: str, config: pytest.Config) -> str:
    """--specdec-dataset with its path resolved where pytest was invoked; a missing file stops the session
    before any server starts."""
    from pytest_specdec.measure.datasets import DatasetSpec

    cwd = Path(str(config.invocation_params.dir))
    spec = DatasetSpec.parse(value)
    if spec.path == "builtin":
        return value
    path = Path(spec.path).expanduser()
    path = path if path.is_absolute() else cwd / path
    if not path.is_file():
        raise pytest.UsageError(f"--specdec-dataset {value!r}: no such file ({path})")
    return str(spec.with_path(str(path)))


def draft_models(values: list[str], config: pytest.Config, option: str = "--specdec-draft"
                 ) -> tuple[tuple[str, str], ...]:
    """Parse repeated `--specdec-draft METHOD=MODEL` (or `--specdec-base-draft`, the same shape); a method given
    twice is an error, not a silent override."""
    out: dict[str, str] = {}
    for v in values:
        method, sep, model = v.partition("=")
        if not sep or not method.strip() or not model.strip():
            raise pytest.UsageError(f"{option} expects METHOD=MODEL (e.g. eagle3=/path/to/head), got {v!r}")
        if method.strip() in out:
            raise pytest.UsageError(f"{option} names {method.strip()!r} twice")
        out[method.strip()] = model.strip()
    return tuple(sorted(out.items()))


def base_draft_models(values: list[str], config: pytest.Config) -> tuple[tuple[str, str], ...]:
    """`--specdec-base-draft METHOD=MODEL`: parsed as `--specdec-draft` is (one path), its errors naming this flag."""
    return draft_models(values, config, "--specdec-base-draft")
