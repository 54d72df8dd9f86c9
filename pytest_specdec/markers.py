"""The `specdec` marker: validation, expansion to the test matrix, readable ids, server grouping.

Every field takes a value or a list; lists expand to their cross product.  Methods are presets of
the active profile; `speculative_config` passes raw vLLM JSON through.  Anything unknown or
impossible is a collection error that says what is allowed.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_specdec.errors import ConfigError
from pytest_specdec.measure.types import GOODPUT_SLOS, Api
from pytest_specdec.profiles import VLLM_METHODS
from pytest_specdec.profiles.engines import DEFAULT_ENGINE, EngineMode, resolve_engines

if TYPE_CHECKING:
    from pytest_specdec.gate.protocol import TestOptions
    from pytest_specdec.measure.types import Sampling
    from pytest_specdec.profiles import Profile

MARKER = "specdec"
MARKER_SIGNATURE = (
    "specdec(method=..., k=..., temperature=..., concurrency=..., dataset=..., max_tokens=..., "
    "num_prompts=..., speculative_config=..., api=..., request_rate=..., ignore_eos=..., burstiness=..., "
    "input_len=..., output_len=..., range_ratio=..., goodput=..., rate_sweep=..., engine=...): measure the spec "
    "config(s) against the no-spec reference on a vLLM server; each field takes a value or a list (cross product)"
)
FIELDS = (
    "method", "k", "temperature", "concurrency", "dataset", "max_tokens", "num_prompts", "speculative_config",
    "api", "request_rate", "ignore_eos", "burstiness", "input_len", "output_len", "range_ratio", "goodput",
    "rate_sweep", "engine",
)
#: The goodput SLOs a request must meet, as `vllm bench serve --goodput` names them (milliseconds).
GOODPUT_KEYS = GOODPUT_SLOS
#: What a synthetic dataset is called in ids and results (vllm bench serve's ``--dataset-name random``).
SYNTHETIC = "random"
APIS = ("chat", "completions")
VERDICTS_MARKER_SIGNATURE = (
    "specdec_verdicts(check=True, thresholds={metric or kind: magnitude}, gate=[metric, ...]): check=False "
    "lets a specdec test opt out of the baseline assertion (verdicts are still recorded); thresholds override "
    "the practical thresholds (% for rates and latencies, points for acceptance) for this test; gate adds "
    "metrics to the gated family that fails the test (speedup, acceptance_rate, e2e_p95_ratio always are), "
    "acceptance_drift and step_time_drift gate the test's drift within the session"
)
VERDICTS_FIELDS = ("check", "thresholds", "gate")
#: The name the matrix is parametrized under; the `specdec` fixture reads it.
PARAM = "_specdec_case"
#: The most draft tokens per step vLLM verifies: its rejection sampler asserts `max_spec_len <= MAX_SPEC_LEN`
#: (vllm/v1/sample/rejection_sampler.py), so a larger k fails at the first request; SpeculativeConfig itself
#: only asks for k > 0.
MAX_K = 128
MAX_K_SOURCE = "vLLM verifies at most 128 draft tokens per step (MAX_SPEC_LEN of its rejection sampler)"


@dataclass(frozen=True, order=True)
class Case:
    """One point of the matrix: what one test measures."""

    method: str
    k: int | None
    temperature: float
    concurrency: int
    dataset: str = "builtin"
    max_tokens: int | None = None
    num_prompts: int | None = None
    speculative_config_json: str | None = None  # raw vLLM JSON, when given instead of a preset
    api: Api = "chat"  # or "completions"
    request_rate: float | None = None  # requests/s, open loop (Poisson); None = closed loop
    #: generate max_tokens whatever the model says (vLLM's ignore_eos); off by default, as in production
    ignore_eos: bool = False
    #: the gamma shape of open-loop inter-arrival times (vllm bench serve's --burstiness): 1 is Poisson, < 1
    #: burstier, > 1 more even, inf constant intervals
    burstiness: float = 1.0
    #: synthetic prompts of exact token lengths (vllm bench serve's random dataset: --random-input-len,
    #: --random-output-len, --random-range-ratio), made with the target's tokenizer; None: the dataset's prompts
    input_len: int | None = None
    output_len: int | None = None
    range_ratio: float = 0.0
    #: the SLOs (ms) of goodput, vllm bench serve's --goodput: ((name, ms), ...) sorted by name; () = none
    goodput: tuple[tuple[str, float], ...] = ()
    #: a rate sweep of ``rate_sweep`` points (docs/suites.md#rate-sweeps): this test's open-loop rate is
    #: ``rate_fraction`` × the reference's saturation, measured at run time (`measure.saturation`); None: not one
    rate_sweep: int | None = None
    rate_fraction: float | None = None
    #: the engine mode both arms' servers run in (`profiles.engines`): its name, and what it adds as canonical
    #: JSON (None for the default mode, the profile's server as it is)
    engine: str = DEFAULT_ENGINE
    engine_json: str | None = None

    @property
    def engine_mode(self) -> EngineMode:
        """The mode's value: what both arms' servers add."""
        return EngineMode() if self.engine_json is None else EngineMode.from_json(self.engine, self.engine_json)

    @property
    def speculative_config(self) -> dict[str, Any] | None:
        return json.loads(self.speculative_config_json) if self.speculative_config_json else None

    def id(self, varying: frozenset[str] = frozenset()) -> str:
        """`eagle3-k3-t0.0-c8`; k is left out for `none`; other fields only when they vary."""
        parts = [self.method]
        if self.method != "none" and self.k is not None:
            parts.append(f"k{self.k}")
        parts += [f"t{self.temperature}", f"c{self.concurrency}"]
        if "dataset" in varying:
            parts.append(self.dataset.rsplit("/", 1)[-1])
        if "max_tokens" in varying:
            parts.append(f"m{self.max_tokens}")
        if "num_prompts" in varying:
            parts.append(f"n{self.num_prompts}")
        if self.api != "chat" or "api" in varying:
            parts.append(self.api)
        if self.request_rate is not None:
            parts.append(f"r{self.request_rate:g}")
        if self.rate_fraction is not None:  # `gate.crossover_gate.id_part` names the same
            parts.append(f"sat{round(100 * self.rate_fraction)}")
        if self.burstiness != 1.0:
            parts.append(f"b{self.burstiness:g}")
        if self.input_len is not None:
            parts.append(f"in{self.input_len}-out{self.output_len}")
            if self.range_ratio:
                parts.append(f"rr{self.range_ratio:g}")
        if self.ignore_eos and self.output_len is None:
            parts.append("noeos")
        if self.goodput and "goodput" in varying:
            parts.append("slo-" + "-".join(f"{k}{v:g}" for k, v in self.goodput))
        if self.engine != DEFAULT_ENGINE or "engine" in varying:
            parts.append(self.engine)
        return "-".join(parts)

    def params(self) -> dict[str, Any]:
        """What results carry as `params`."""
        out = asdict(self)
        out.pop("speculative_config_json")
        out["speculative_config"] = self.speculative_config
        out.pop("engine_json")
        if self.engine_json is None:  # the default mode: the params a test had before modes existed
            out.pop("engine")
        else:
            out["engine_mode"] = self.engine_mode.definition()
        out["goodput"] = dict(self.goodput) or None
        return out

    @property
    def synthetic(self) -> bool:
        """Synthetic prompts of exact token lengths instead of a dataset's."""
        return self.input_len is not None

    @property
    def synthetic_lengths(self) -> tuple[int, int, float] | None:
        """A synthetic case's (input_len, output_len, range_ratio), typed: the marker sets both lengths or
        neither; None for a dataset's case."""
        if self.input_len is None or self.output_len is None:
            return None
        return self.input_len, self.output_len, self.range_ratio

    def workload(self) -> dict[str, Any]:
        """The workload fields a stored baseline must share with tonight to be comparable."""
        out: dict[str, Any] = {"concurrency": self.concurrency, "max_tokens": self.max_tokens,
                               "num_prompts": self.num_prompts, "rate": self.request_rate, "api": self.api}
        # only where set: a stored night without them then still reads as the same workload
        if self.burstiness != 1.0:
            out["burstiness"] = self.burstiness
        if self.synthetic:
            out.update(input_len=self.input_len, output_len=self.output_len, range_ratio=self.range_ratio)
        if self.goodput:
            out["goodput"] = dict(self.goodput)
        if self.rate_fraction is not None:  # the rate as a fraction of saturation: raw req/s follow the machine
            out.update(rate_sweep=self.rate_sweep, rate_fraction=self.rate_fraction)
        return out

    def sampling(self) -> Sampling:
        """Every sampling parameter of the case's requests (all sent explicitly, all recorded)."""
        from pytest_specdec.measure.types import Sampling

        return Sampling(temperature=self.temperature, ignore_eos=self.ignore_eos)

    def server_key(self) -> tuple[str, str, str]:
        """Tests with equal keys share a server: ordering by it keeps them together."""
        return (self.method, self.speculative_config_json or str(self.k), self.engine)


@dataclass
class VerdictOptions:
    """What the `specdec_verdicts` marker says for one test."""

    check: bool = True
    thresholds: dict[str, float] = field(default_factory=dict)
    gate: tuple[str, ...] = ()  # metrics added to the gated family for this test

    def for_gate(self) -> TestOptions:
        """The options as the session's gate reads them (`gate.protocol.TestOptions`); the drift metrics are not
        the gate's (judged within tonight's runs, `gate.drift`), so they stay out."""
        from pytest_specdec.gate.drift import DRIFT_METRICS
        from pytest_specdec.gate.protocol import TestOptions

        return TestOptions(self.check, dict(self.thresholds), tuple(m for m in self.gate if m not in DRIFT_METRICS))


def _as_list(name: str, value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        if not value:
            raise ConfigError(f"specdec marker: {name}=[] is empty; give a value or a non-empty list")
        return list(value)
    return [value]


def _int(name: str, value: Any, minimum: int = 1, maximum: tuple[int, str] | None = None) -> int:
    """A whole-number field; ``maximum`` is (the limit, where it comes from)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"specdec marker: {name} must be a whole number >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum[0]:
        raise ConfigError(f"specdec marker: {name}={value} is above {maximum[0]}: {maximum[1]}; "
                          f"lower {name} to at most {maximum[0]}")
    return value


def _optional_int(name: str, value: Any, maximum: tuple[int, str] | None = None) -> int | None:
    """A whole-number field that may be left out (None)."""
    return None if value is None else _int(name, value, maximum=maximum)


def expand(kwargs: dict[str, Any], profile: Profile, args: tuple[Any, ...] = (),
           defaults: dict[str, Any] | None = None) -> list[Case]:
    """The cross product of the marker's fields, validated against `profile`, without duplicates.

    ``defaults`` (from the command line: api, request_rate, dataset) apply where the marker does not set a
    field; k, temperature, concurrency, num_prompts and max_tokens left out take the profile's ``[matrix]``
    values, so one suite sweeps what each hardware profile can afford.
    """
    defaults = defaults or {}
    if args:
        raise ConfigError(f"specdec marker takes keyword arguments only ({', '.join(FIELDS)}), got {args!r}")
    unknown = sorted(set(kwargs) - set(FIELDS))
    if unknown:
        raise ConfigError(
            f"specdec marker: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(FIELDS)}"
        )
    if "method" not in kwargs and "speculative_config" not in kwargs:
        raise ConfigError(
            f"specdec marker needs method= (one of {', '.join(profile.method_names())}) or speculative_config="
        )
    default_k = profile.matrix.get("k", [3])
    lists = {
        "method": _as_list("method", kwargs.get("method", [None])),
        "k": _as_list("k", kwargs.get("k", default_k)),
        "temperature": _as_list("temperature", kwargs.get("temperature", profile.matrix.get("temperature", 0.0))),
        "concurrency": _as_list("concurrency", kwargs.get("concurrency", profile.matrix.get("concurrency", 1))),
        "dataset": _as_list("dataset", kwargs.get("dataset", defaults.get("dataset", "builtin"))),
        "max_tokens": _as_list("max_tokens", kwargs.get("max_tokens", profile.matrix.get("max_tokens"))),
        "num_prompts": _as_list("num_prompts", kwargs.get("num_prompts", profile.matrix.get("num_prompts"))),
        "speculative_config": _as_list("speculative_config", kwargs.get("speculative_config", None)),
        "api": _as_list("api", kwargs.get("api", defaults.get("api", "chat"))),
        # a rate sweep finds its rates at run time: the command line's default rate is not one of them
        "request_rate": _as_list("request_rate", kwargs.get("request_rate", None if "rate_sweep" in kwargs
                                                            else defaults.get("request_rate"))),
        "ignore_eos": _as_list("ignore_eos", kwargs.get("ignore_eos", False)),
        "burstiness": _as_list("burstiness", kwargs.get("burstiness", 1.0)),
        "input_len": _as_list("input_len", kwargs.get("input_len", None)),
        "output_len": _as_list("output_len", kwargs.get("output_len", None)),
        "range_ratio": _as_list("range_ratio", kwargs.get("range_ratio", 0.0)),
        "goodput": _as_list("goodput", kwargs.get("goodput", None)),
        "rate_sweep": _as_list("rate_sweep", kwargs.get("rate_sweep", None)),
        "engine": resolve_engines(_as_list("engine", kwargs.get("engine", DEFAULT_ENGINE)), profile.engines,
                                  "specdec marker: engine"),
    }
    _check_synthetic(kwargs)
    if len(lists["rate_sweep"]) > 1:
        raise ConfigError(f"specdec marker: rate_sweep={kwargs['rate_sweep']!r}: give one number of points; two sweeps "
                          "of one test would name their points alike (sat100 in both)")
    from pytest_specdec.measure.datasets.formats import MAX_GIVEN_TOKENS

    max_given = (MAX_GIVEN_TOKENS, "above any served context length, the bound of a dataset record's own max_tokens")
    cases: list[Case] = []
    for (method, k, temperature, concurrency, dataset, max_tokens, num_prompts, raw, api,
         rate, ignore_eos, burstiness, input_len, output_len, range_ratio, goodput,
         rate_sweep, engine) in itertools.product(*lists.values()):
        raw_json, k_field = None, "k"
        if raw is not None:
            if not isinstance(raw, dict) or "method" not in raw:
                raise ConfigError(
                    f"specdec marker: speculative_config must be a dict with a 'method' key (vLLM's "
                    f"--speculative-config JSON), got {raw!r}"
                )
            if method is not None:
                raise ConfigError("specdec marker: give method= or speculative_config=, not both")
            method = str(raw["method"])
            if method not in VLLM_METHODS:
                raise ConfigError(
                    f"specdec marker: speculative_config method {method!r} is not one vLLM knows; allowed: "
                    f"{', '.join(VLLM_METHODS)}"
                )
            if "num_speculative_tokens" in raw:
                k, k_field = raw["num_speculative_tokens"], "speculative_config num_speculative_tokens"
            raw = {**raw, "num_speculative_tokens": k}
            raw_json = json.dumps(raw, sort_keys=True)
        elif method not in profile.method_names():
            raise ConfigError(
                f"specdec marker: method {method!r} is not a preset of profile {profile.name!r}; "
                f"allowed: {', '.join(profile.method_names())} (or pass speculative_config=)"
            )
        if method == "none":
            k = None
        else:
            k = _int(k_field, k, maximum=(MAX_K, MAX_K_SOURCE))
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2:
            raise ConfigError(f"specdec marker: temperature must be a number in [0, 2], got {temperature!r}")
        if not isinstance(dataset, str) or not dataset:
            raise ConfigError(f"specdec marker: dataset must be 'builtin' or a file path, got {dataset!r}")
        if api not in APIS:
            raise ConfigError(f"specdec marker: api must be one of {', '.join(APIS)}, got {api!r}")
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0
                                 or not math.isfinite(rate)):
            raise ConfigError(
                f"specdec marker: request_rate must be a finite number of requests/s > 0 (open loop) or None "
                f"(closed loop), got {rate!r}"
            )
        if not isinstance(ignore_eos, bool):
            raise ConfigError(f"specdec marker: ignore_eos must be True or False, got {ignore_eos!r}")
        fractions = _rate_sweep(rate_sweep, rate)
        burstiness = _burstiness(burstiness, rate if rate_sweep is None else rate_sweep)
        if "input_len" in kwargs:
            input_len = _int("input_len", input_len)
            output_len = _int("output_len", output_len)
            range_ratio = _range_ratio(range_ratio)
            dataset, max_tokens, ignore_eos = SYNTHETIC, output_len, True
            if "api" not in kwargs:
                api = "completions"
            elif api != "completions":
                raise ConfigError(
                    f"specdec marker: input_len makes prompts of exact token lengths, sent as text over "
                    f"api='completions' as vllm bench serve's random dataset is; api={api!r} would wrap them in the "
                    f"chat template's tokens: leave api out or set api='completions'")
        goodput_slos = _goodput(goodput)
        cases.extend(
            Case(
                method=method,
                k=k,
                temperature=float(temperature),
                concurrency=_int("concurrency", concurrency),
                dataset=dataset,
                max_tokens=_optional_int("max_tokens", max_tokens, maximum=max_given),
                num_prompts=_optional_int("num_prompts", num_prompts),
                speculative_config_json=raw_json,
                api=api,
                request_rate=None if rate is None else float(rate),
                ignore_eos=ignore_eos,
                burstiness=burstiness,
                input_len=input_len,
                output_len=output_len,
                range_ratio=float(range_ratio),
                goodput=goodput_slos,
                rate_sweep=rate_sweep,
                rate_fraction=fraction,
                engine=engine.name,
                engine_json=None if engine.is_default else engine.to_json(),
            )
            for fraction in fractions
        )
    return list(dict.fromkeys(cases))  # `none` at several k collapses to one case


def _burstiness(value: Any, rate: Any) -> float:
    """vllm bench serve's gamma shape: a number > 0 (inf: constant intervals), only with an open loop."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or not value > 0:
        raise ConfigError(f"specdec marker: burstiness must be a number > 0 (the gamma shape of the arrivals: 1 is "
                          f"Poisson, below 1 burstier, above 1 more even, inf constant), got {value!r}")
    if value != 1 and rate is None:
        raise ConfigError(f"specdec marker: burstiness={value!r} shapes open-loop arrivals, but this test is a closed "
                          f"loop: set request_rate= too")
    return float(value)


def _rate_sweep(value: Any, rate: Any) -> list[float | None]:
    """A rate sweep's fractions of the reference's saturation (`measure.saturation.fractions`), [None] without
    one; its rates are found at run time, so it cannot go with a request_rate."""
    from pytest_specdec.measure.saturation import MAX_POINTS, fractions

    if value is None:
        return [None]
    n = _int("rate_sweep", value, minimum=3, maximum=(MAX_POINTS, "its ids name each point in whole % of saturation"))
    assert n is not None  # None only where allow_none
    if rate is not None:
        raise ConfigError(f"specdec marker: rate_sweep={value} finds its request rates at run time (fractions of the "
                          f"reference's saturation), but request_rate={rate!r} is set too: leave request_rate out")
    out: list[float | None] = list(fractions(n))
    return out


def _range_ratio(value: Any) -> float:
    """vllm bench serve's --random-range-ratio: lengths drawn uniformly within +- ratio of the given ones."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ConfigError(f"specdec marker: range_ratio must be a number in [0, 1) (lengths drawn uniformly in "
                          f"[len * (1 - ratio), len * (1 + ratio)]), got {value!r}")
    return float(value)


def _check_synthetic(kwargs: dict[str, Any]) -> None:
    """input_len and output_len come together, and replace what the dataset, max_tokens and ignore_eos say."""
    has_in, has_out = "input_len" in kwargs, "output_len" in kwargs
    if has_in != has_out:
        given, missing = ("input_len", "output_len") if has_in else ("output_len", "input_len")
        raise ConfigError(f"specdec marker: {given} needs {missing} too: the two make synthetic prompts of exact "
                          f"token lengths (vllm bench serve's random dataset)")
    if "range_ratio" in kwargs and not has_in:
        raise ConfigError("specdec marker: range_ratio varies synthetic prompt lengths: set input_len and "
                          "output_len too")
    if has_in:
        for name, why in (("dataset", "the prompts are synthetic"), ("max_tokens", "output_len is every "
                          "request's max_tokens"), ("ignore_eos", "output_len always generates its tokens "
                          "(ignore_eos, as in vllm bench serve)")):
            if name in kwargs:
                raise ConfigError(f"specdec marker: {name}= cannot go with input_len/output_len: {why}; "
                                  f"leave {name} out")


def _goodput(value: Any) -> tuple[tuple[str, float], ...]:
    """vllm bench serve's --goodput: {"ttft": ms, "tpot": ms, "e2el": ms}, any non-empty subset."""
    if value is None:
        return ()
    if not isinstance(value, dict) or not value:
        raise ConfigError(f"specdec marker: goodput must be a non-empty dict of SLOs in ms with keys from "
                          f"{', '.join(GOODPUT_KEYS)} (e.g. {{'ttft': 500, 'tpot': 50}}), got {value!r}")
    unknown = sorted(set(map(str, value)) - set(GOODPUT_KEYS))
    if unknown:
        raise ConfigError(f"specdec marker: goodput key(s) {', '.join(unknown)} unknown; allowed: "
                          f"{', '.join(GOODPUT_KEYS)} (milliseconds, as vllm bench serve's --goodput)")
    for k, v in value.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not v > 0:
            raise ConfigError(f"specdec marker: goodput {k} must be a finite number of milliseconds > 0, got {v!r}")
    return tuple(sorted((str(k), float(v)) for k, v in value.items()))


def varying_fields(cases: list[Case]) -> frozenset[str]:
    """Fields that take more than one value across `cases` (they go into the ids)."""
    return frozenset(
        name for name in ("dataset", "max_tokens", "num_prompts", "api", "goodput", "engine")
        if len({getattr(c, name) for c in cases}) > 1
    )


def verdict_options(marker: Any) -> Any:
    """The `specdec_verdicts` marker → VerdictOptions; unknown keys and bad values name what is allowed."""
    from pytest_specdec.gate.thresholds import check_gate, check_mapping

    if marker is None:
        return VerdictOptions()
    if marker.args:
        raise ConfigError(f"specdec_verdicts marker takes keyword arguments only ({', '.join(VERDICTS_FIELDS)}), "
                          f"got {marker.args!r}")
    unknown = sorted(set(marker.kwargs) - set(VERDICTS_FIELDS))
    if unknown:
        raise ConfigError(f"specdec_verdicts marker: unknown key(s) {', '.join(unknown)}; allowed: "
                          f"{', '.join(VERDICTS_FIELDS)}")
    check = marker.kwargs.get("check", True)
    if not isinstance(check, bool):
        raise ConfigError(f"specdec_verdicts marker: check must be True or False, got {check!r}")
    thresholds = check_mapping(marker.kwargs.get("thresholds", {}), "specdec_verdicts marker")
    gate = check_gate(marker.kwargs.get("gate", []), "specdec_verdicts marker")
    return VerdictOptions(check=check, thresholds=thresholds, gate=tuple(gate))
