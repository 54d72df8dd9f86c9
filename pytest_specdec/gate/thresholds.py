"""Practical thresholds: parsed and checked where they are given (profile, ini, command line, marker), then
layered into one `Thresholds` (later layers win). Errors name where the bad value came from.

A results file records the thresholds each test was judged with (written by its module,
`output.schema.thresholds_entry`; read back by `from_dict`), so that `pytest-specdec compare` re-judges it with the
same ones.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from pytest_specdec.errors import ConfigError
from pytest_specdec.gate.registry import KINDS
from pytest_specdec.gate.registry import VERDICT_METRICS as METRICS

if TYPE_CHECKING:
    from pytest_specdec.gate.stats import Thresholds


def check_name(name: str, where: str) -> str:
    base = name.split("[", 1)[0]
    if name in KINDS or base in METRICS:
        if "[" in name and not (base == "per_position_acceptance" and name[len(base) + 1:-1].isdigit()
                                and name.endswith("]")):
            raise ConfigError(f"{where}: {name!r} is not a metric; per-position thresholds are "
                              "per_position_acceptance (all positions) or per_position_acceptance[i]")
        return name
    raise ConfigError(f"{where}: unknown metric {name!r}; allowed: {', '.join(KINDS + METRICS)}")


def _magnitude(name: str, value: Any, where: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if isinstance(value, bool) or not (math.isfinite(number) and number > 0):
        raise ConfigError(f"{where}: threshold of {name} must be a positive number (% for rates and "
                          f"latencies, points for acceptance), got {value!r}")
    from pytest_specdec.gate.scale import kind_of

    kind = name if name in KINDS else kind_of(name.split("[", 1)[0])
    if kind in ("rate", "acceptance") and number >= 100:  # a drop of 100 % (or 100 points) leaves nothing
        raise ConfigError(f"{where}: threshold of {name} must be below 100 ({'%' if kind == 'rate' else 'points'}: "
                          f"a drop that large leaves nothing to measure), got {value!r}")
    return number


def check_gate(names: Any, where: str) -> list[str]:
    """Metric names to add to the gated family, validated (a kind name is not a metric here)."""
    if isinstance(names, (str, bytes)) or not isinstance(names, Iterable):
        raise ConfigError(f"{where}: gate must be a list of metric names like ['output_tok_s'], got {names!r}")
    from pytest_specdec.gate.crossover import NAME as CROSSOVER
    from pytest_specdec.gate.drift import DRIFT_METRICS

    out = []
    for name in names:
        name = str(name).strip()
        # a sweep's metric, judged once per concurrency sweep; a drift, judged within tonight's runs (gate/drift.py)
        if name == CROSSOVER or name in DRIFT_METRICS:
            out.append(name)
            continue
        if name not in KINDS and name.split("[", 1)[0] not in METRICS:
            raise ConfigError(f"{where}: unknown metric {name!r} in gate; allowed: "
                              f"{', '.join((*METRICS, CROSSOVER, *DRIFT_METRICS))}")
        if name in KINDS or check_name(name, where) != name:
            raise ConfigError(f"{where}: gate takes metric names, not the kind {name!r}; allowed: "
                              f"{', '.join((*METRICS, CROSSOVER, *DRIFT_METRICS))}")
        out.append(name)
    return out


def parse_threshold_items(items: Iterable[str], where: str) -> dict[str, float]:
    """``["speedup=8", "latency=20"]`` → ``{"speedup": 8.0, "latency": 20.0}``, with errors that name the fix."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = str(item).partition("=")
        name = name.strip()
        if not sep or not name:
            raise ConfigError(f"{where}: expected METRIC=VALUE like speedup=8 or latency=20, got {item!r}")
        checked = check_name(name, where)  # the name first: its kind bounds the value
        out[checked] = _magnitude(name, value.strip(), where)
    return out


def check_mapping(mapping: Any, where: str) -> dict[str, float]:
    """A marker's or profile's ``{metric or kind: magnitude}`` table, validated."""
    if not isinstance(mapping, Mapping):
        raise ConfigError(f"{where}: thresholds must be a mapping like {{'speedup': 8}}, got {mapping!r}")
    return {check_name(str(k), where): _magnitude(str(k), v, where) for k, v in mapping.items()}


def layers(profile_layer: Any, where: str, ini: Iterable[str] = (), cli: Iterable[str] = (),
           cli_flag: str = "--specdec-threshold") -> list[dict[str, float]]:
    """The session's threshold layers, each checked where it was given: the profile's table (``where`` names it),
    the ini's ``specdec_thresholds``, the command line's (``cli_flag``). The one layering: the stored nights' gate,
    the A/B's (over its own defaults and table) and `pytest-specdec compare` build their thresholds from it, a
    marker's on top (`build_thresholds`: a later layer wins)."""
    return [check_mapping(profile_layer, where), parse_threshold_items(ini, "ini specdec_thresholds"),
            parse_threshold_items(cli, cli_flag)]


def build_thresholds(*layers: Mapping[str, float]) -> Thresholds:
    """Defaults overridden layer by layer (profile, ini, CLI, marker: later wins)."""
    from pytest_specdec.gate.scale import THRESHOLD_FIELD, kind_of
    from pytest_specdec.gate.stats import Thresholds

    kinds: dict[str, float] = {}
    per_metric: dict[str, float] = {}
    for layer in layers:
        # Within a layer a metric beats its kind whatever the order: `speedup=15 rate=40` keeps 15.
        for name, value in sorted(layer.items(), key=lambda item: item[0] not in KINDS):
            if name in KINDS:
                kinds[THRESHOLD_FIELD[name]] = value
                # a kind set by a later layer beats an earlier per-metric value of that kind
                for m in [m for m in per_metric if kind_of(m) == name]:
                    del per_metric[m]
            else:
                per_metric[name] = value
    return Thresholds(per_metric=per_metric, **kinds)




def from_dict(d: Any, where: str) -> Thresholds:
    """A results file's thresholds as `output.schema.thresholds_entry` wrote them (the kinds' magnitudes and
    `per_metric`), every value checked as a threshold given on the command line would be."""
    if not isinstance(d, Mapping) or not isinstance(d.get("per_metric", {}), Mapping):
        raise ConfigError(f"{where}: thresholds must be a mapping of kinds and `per_metric`, got {d!r}")
    kinds = check_mapping({k: v for k, v in d.items() if k != "per_metric"}, where)
    return build_thresholds(kinds, check_mapping(d.get("per_metric", {}), f"{where}.per_metric"))


def on_top(base: Thresholds, layer: Mapping[str, float]) -> Thresholds:
    """``base`` with one more layer over it (a later layer wins, as in `build_thresholds`)."""
    from pytest_specdec.gate.scale import THRESHOLD_FIELD

    return build_thresholds({kind: getattr(base, THRESHOLD_FIELD[kind]) for kind in KINDS}, dict(base.per_metric),
                            layer)
