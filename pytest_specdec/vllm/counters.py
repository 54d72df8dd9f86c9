"""vLLM's spec-decode counters from its Prometheus text: summed over engines, one delta per run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from pytest_specdec.errors import SpecDecError

PER_POS_NAME = "vllm:spec_decode_num_accepted_tokens_per_pos"


def _counter(family: str) -> Any:
    """A summed counter field, read from vLLM's family `family` (prometheus_client's parser strips the
    `_total` suffix)."""
    return field(default=0.0, metadata={"family": family})


@dataclass(frozen=True)
class Counters:
    """vLLM's cumulative counters at one moment, summed over engines (and every label but ``position``).

    ``spec_decode`` tells whether the server exports spec-decode counters at all (it registers them
    only when started with a speculative config), so "no drafts" can be told from "no speculation".
    """

    # Names from vllm/v1/spec_decode/metrics.py (SpecDecodingProm) and vllm/v1/metrics/loggers.py.
    drafts: float = _counter("vllm:spec_decode_num_drafts")
    draft_tokens: float = _counter("vllm:spec_decode_num_draft_tokens")
    accepted_tokens: float = _counter("vllm:spec_decode_num_accepted_tokens")
    accepted_per_pos: tuple[float, ...] = ()  # PER_POS_NAME, by its `position` label
    generation_tokens: float = _counter("vllm:generation_tokens")
    prompt_tokens: float = _counter("vllm:prompt_tokens")
    preemptions: float = _counter("vllm:num_preemptions")
    prefix_cache_queries: float = _counter("vllm:prefix_cache_queries")
    prefix_cache_hits: float = _counter("vllm:prefix_cache_hits")
    spec_decode: bool = False

    def __sub__(self, before: Counters) -> Counters:
        """``after - before``; a counter that went down means the server restarted between the two."""
        vals: dict[str, Any] = {}
        for name, metric in COUNTER_NAMES.items():
            d = getattr(self, name) - getattr(before, name)
            if d < 0:
                raise SpecDecError(_reset_msg(metric, getattr(before, name), getattr(self, name)))
            vals[name] = d
        n = max(len(self.accepted_per_pos), len(before.accepted_per_pos))
        a = self.accepted_per_pos + (0.0,) * (n - len(self.accepted_per_pos))
        b = before.accepted_per_pos + (0.0,) * (n - len(before.accepted_per_pos))
        per_pos = []
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x - y < 0:
                raise SpecDecError(_reset_msg(f'{PER_POS_NAME}{{position="{i}"}}', y, x))
            per_pos.append(x - y)
        return Counters(accepted_per_pos=tuple(per_pos), spec_decode=self.spec_decode, **vals)


#: Counters.<field> -> the vLLM family it sums.
COUNTER_NAMES: dict[str, str] = {f.name: f.metadata["family"] for f in dataclasses.fields(Counters) if f.metadata}


def _reset_msg(metric: str, before: float, after: float) -> str:
    return (f"counter {metric} went down from {before:g} to {after:g} during the run: the server restarted "
            "or was replaced mid-run, so this run's counter delta is meaningless; rerun it")


def delta(before: Counters, after: Counters) -> Counters:
    """Counter increase over a run; raises SpecDecError naming the counter if one went down."""
    return after - before


def _families(text: str) -> list[Any]:
    """A /metrics body's metric families (`prometheus_client.parser`); a body that is not Prometheus text is an
    error naming it, for the counters and the in-flight gauges alike."""
    try:
        return list(text_string_to_metric_families(text))
    except ValueError as e:
        raise SpecDecError(f"/metrics text is not Prometheus exposition format: {e}") from e


def parse_counters(text: str) -> Counters:
    """Read the counters this plugin uses from a Prometheus text exposition (a /metrics body)."""
    wanted = {v: k for k, v in COUNTER_NAMES.items()}
    sums: dict[str, float] = dict.fromkeys(COUNTER_NAMES, 0.0)
    per_pos: dict[int, float] = {}
    spec = False
    for fam in _families(text):
        key = wanted.get(fam.name)
        if key is None and fam.name != PER_POS_NAME:
            continue
        if fam.name.startswith("vllm:spec_decode"):
            spec = True
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue  # creation timestamps, not counts
            if key is not None:
                sums[key] += s.value
            else:
                pos = int(s.labels["position"])
                per_pos[pos] = per_pos.get(pos, 0.0) + s.value
    n = max(per_pos) + 1 if per_pos else 0
    return Counters(accepted_per_pos=tuple(per_pos.get(i, 0.0) for i in range(n)), spec_decode=spec, **sums)


#: vLLM's gauges of the requests an engine holds (vllm/v1/metrics/loggers.py): scheduled, and queued.
IN_FLIGHT_NAMES = ("vllm:num_requests_running", "vllm:num_requests_waiting")


def in_flight(text: str) -> int:
    """The requests running or waiting, summed over engines, from a /metrics body: a server that still holds a
    run's requests is busy, whatever its CPU use reads. A body that is not Prometheus text is an error."""
    return round(sum(s.value for f in _families(text) if f.name in IN_FLIGHT_NAMES for s in f.samples))
