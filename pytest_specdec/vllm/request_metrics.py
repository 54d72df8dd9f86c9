"""vLLM's per-request speculative-decoding figures: the flag that turns them on, whether an install's `vllm serve`
knows it, and the one reader of what a response carries (`metrics.speculative_decoding`).

vLLM >= 0.32 has `--per-request-spec-decode-metrics none|summary|detailed` (vllm/config/observability.py). With
`summary`, each response of an n == 1 request carries its own acceptance: the draft tokens, the accepted ones, the
verify steps and the histogram of steps by accepted draft tokens (the protocol's `SpeculativeDecodingMetrics`,
vllm/entrypoints/generate/base/protocol.py, filled by `RequestSpecDecodeMetrics.to_dict`, vllm/v1/metrics/stats.py).
In a stream it rides on the final usage chunk (chat_completion/serving.py and completion/serving.py: "metrics ride
on this final usage chunk"). The scheduler counts it at the same place, with the same numbers, as the Prometheus
counters (vllm/v1/core/sched/scheduler.py: `make_spec_decoding_stats` and `spec_decode_metrics.observe` side by
side), so the requests' sums equal the counters' deltas over a run: that equality is checked, never assumed.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The flag (vllm/engine/arg_utils.py, `EngineArgs.add_cli_args`) and the level the plugin asks for: `summary` has
#: every count the check and the statistics need; `detailed` adds per-step arrays the plugin does not read.
FLAG = "--per-request-spec-decode-metrics"
LEVEL = "summary"
#: vLLM's parser accepts a flag with underscores too (FlexibleArgumentParser turns them into dashes).
_SPELLINGS = (FLAG, "--per_request_spec_decode_metrics")
#: Where vLLM registers the flag: its literal is in this module of the `vllm` package exactly when `vllm serve`'s
#: parser knows it (tests/unit/test_request_metrics.py holds the two to each other with vLLM's own parser).
_ARG_UTILS = ("engine", "arg_utils.py")
#: The same look-up, run by another install's interpreter (an upgrade A/B's base).
_PROBE = ("import importlib.util as u, pathlib, sys\n"
          "s = u.find_spec('vllm')\n"
          "p = pathlib.Path(s.origin).parent.joinpath('engine', 'arg_utils.py') if s and s.origin else None\n"
          f"sys.exit(0 if p and p.is_file() and {FLAG!r} in p.read_text(errors='replace') else 1)\n")


@functools.cache
def knows_flag(python: str | None = None) -> bool:
    """Whether `vllm serve` of this interpreter (or of ``python``, another install's) accepts `FLAG`.

    Why read the source: building vLLM's parser imports torch (7 s and 650 MB on the 2-core host, docs/measurement.md),
    in every session that starts a server; the flag's literal in vLLM's own argument module is what its parser is
    built from. No vLLM, or a vLLM without the module, knows nothing."""
    if python is not None:
        try:
            return subprocess.run([python, "-c", _PROBE], capture_output=True, timeout=60).returncode == 0
        except (OSError, subprocess.SubprocessError):
            return False
    try:
        found = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return False
    if found is None or not found.origin:
        return False
    path = Path(found.origin).parent.joinpath(*_ARG_UTILS)
    try:
        return FLAG in path.read_text(errors="replace")
    except OSError:
        return False


def given(args: Sequence[str]) -> bool:
    """Whether a command's own args set the flag (a profile's `[server] args`): then they win."""
    return any(a in _SPELLINGS or a.startswith(tuple(f"{s}=" for s in _SPELLINGS)) for a in args)


def without_flag(args: Sequence[str]) -> list[str]:
    """``args`` without the flag and its value: vLLM refuses to start a server without speculation that has it
    (vllm/config/vllm.py: "requires speculative decoding to be enabled"), and a profile's args go to both arms."""
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a in _SPELLINGS:
            skip = True
        elif not a.startswith(tuple(f"{s}=" for s in _SPELLINGS)):
            out.append(a)
    return out


@dataclass(frozen=True)
class RequestSpecDecode:
    """One request's acceptance, as vLLM counted it: its verify steps (`drafts`, the counter's
    `spec_decode_num_drafts`), the draft tokens proposed and the ones accepted, and ``histogram[j]``: the steps that
    accepted exactly j draft tokens (j = 0 .. k; the bonus token left out, as vLLM's histogram leaves it out)."""

    drafts: int
    draft_tokens: int
    accepted_tokens: int
    histogram: tuple[int, ...]

    @property
    def k(self) -> int:
        """The most draft tokens a step could propose (vLLM's `num_spec_tokens`)."""
        return len(self.histogram) - 1


#: The fields of vLLM 0.32's `SpeculativeDecodingMetrics` that a `summary` payload always has.
_COUNTS = ("num_spec_steps", "num_accepted_draft_tokens", "num_draft_tokens", "num_spec_tokens")
_RATES = ("mean_acceptance_length", "draft_acceptance_rate")
WHERE = "metrics.speculative_decoding"


def _count(payload: Mapping[str, Any], key: str) -> int:
    value = payload.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{WHERE}.{key} is {value!r}, not a count (an integer >= 0)")
    return value


def read_request_spec_decode(payload: Any) -> RequestSpecDecode:
    """What vLLM's `metrics.speculative_decoding` says of one request, checked against its own arithmetic
    (`RequestSpecDecodeMetrics.to_dict`): a malformed payload is a ValueError naming the field and what is wrong,
    so the request fails with it instead of its figures being dropped or guessed."""
    if not isinstance(payload, Mapping):
        raise ValueError(f"{WHERE} is {payload!r}, not an object")
    missing = [key for key in (*_COUNTS, *_RATES, "acceptance_histogram") if key not in payload]
    if missing:
        raise ValueError(f"{WHERE} has no `{missing[0]}` (vLLM 0.32's SpeculativeDecodingMetrics has "
                         f"{', '.join((*_RATES, 'acceptance_histogram', *_COUNTS))})")
    steps, accepted, drafted, k = (_count(payload, key) for key in _COUNTS)
    hist = payload["acceptance_histogram"]
    if not isinstance(hist, list) or len(hist) != k + 1:
        raise ValueError(f"{WHERE}.acceptance_histogram is {hist!r}, not a list of num_spec_tokens + 1 = {k + 1} "
                         "counts")
    for j, n in enumerate(hist):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"{WHERE}.acceptance_histogram[{j}] is {n!r}, not a count (an integer >= 0)")
    if sum(hist) != steps:
        raise ValueError(f"{WHERE}.num_spec_steps is {steps}, but its acceptance_histogram counts {sum(hist)} steps")
    by_hist = sum(j * n for j, n in enumerate(hist))
    if by_hist != accepted:
        raise ValueError(f"{WHERE}.num_accepted_draft_tokens is {accepted}, but its acceptance_histogram accepts "
                         f"{by_hist}")
    if accepted > drafted or drafted > k * steps:
        raise ValueError(f"{WHERE}: {accepted} accepted of {drafted} draft tokens in {steps} steps of at most {k}: "
                         "impossible counts")
    for key, expected in (("draft_acceptance_rate", accepted / drafted if drafted else 0.0),
                          ("mean_acceptance_length", 1.0 + accepted / steps if steps else 1.0)):
        value = payload[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isclose(
                value, expected, rel_tol=1e-9, abs_tol=1e-12):
            raise ValueError(f"{WHERE}.{key} is {value!r}, but its counts make it {expected!r}")
    return RequestSpecDecode(drafts=steps, draft_tokens=drafted, accepted_tokens=accepted, histogram=tuple(hist))
