"""What flows from the workload to the metrics: prompts, sampling, per-request samples, a run's load.

Kept apart from the HTTP client so datasets and metrics do not import it.
"""

from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from pytest_specdec.errors import ConfigError
from pytest_specdec.vllm.request_metrics import RequestSpecDecode

Api = Literal["chat", "completions"]
#: The SLOs goodput counts against, in ms, as ``vllm bench serve --goodput`` names them: the marker's
#: ``goodput`` keys and what `metrics.good_requests` judges.
GOODPUT_SLOS: tuple[str, ...] = ("ttft", "tpot", "e2el")
#: How a request not sent (its run stopped at an idle timeout) is named in its error (`client.py` writes it).
NOT_SENT = "not sent"


@dataclass(frozen=True, kw_only=True)
class Prompt:
    """One request to send: either chat ``messages`` or a completions ``prompt``, never both."""

    id: str
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    max_tokens: int
    category: str = ""
    #: completions only: False when `prompt` was rendered from a chat template that holds BOS already
    add_special_tokens: bool | None = None
    #: the prompt's tokens as the server will count them (the target's tokenizer; a synthetic prompt's exact
    #: length), None: not counted
    input_tokens: int | None = None

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.prompt is None):
            raise ConfigError(f"prompt {self.id!r}: give exactly one of `messages` (chat) or `prompt` (completions)")
        if self.max_tokens < 1:
            raise ConfigError(f"prompt {self.id!r}: max_tokens must be >= 1, got {self.max_tokens}")


@dataclass(frozen=True)
class Sampling:
    """Sampling settings, all sent explicitly so a server default can never change what is measured.

    ``temperature`` has no default on purpose: recent vLLM takes the model's generation_config default
    (often not 0), and acceptance depends strongly on temperature. ``top_k=0`` is vLLM's "disabled"
    (``SamplingParams._verify_args`` accepts -1 too, but prefers 0).
    """

    temperature: float
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False

    def to_request(self) -> dict[str, Any]:
        """The request-body fields; every one is present even when it equals vLLM's default."""
        return dataclasses.asdict(self)


@dataclass
class RequestSample:
    """What one request did, with times relative to its own ``start`` (``time.perf_counter``).

    ``chunks`` holds only chunks that carried tokens (the chat role chunk and the final usage chunk carry
    none), as ``(arrival_s, n_tokens)``.
    """

    prompt_id: str
    start: float
    category: str = ""
    ttft_s: float | None = None
    e2e_s: float | None = None
    chunks: list[tuple[float, int]] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int | None = None
    text: str = ""
    finish_reason: str | None = None
    queue_s: float = 0.0  # open loop only: how long the request waited for a free slot after its arrival
    error: str | None = None
    #: its acceptance as vLLM counted it (`metrics.speculative_decoding` of a server started with
    #: --per-request-spec-decode-metrics); None: the server sent none (no speculation, an older vLLM, the flag off)
    spec_decode: RequestSpecDecode | None = None

    @property
    def ok(self) -> bool:
        """Whether the request streamed to the end without any error."""
        return self.error is None

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first, as ``vllm bench serve`` defines TPOT."""
        if self.ttft_s is None or self.e2e_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    @property
    def itls_chunk_s(self) -> list[float]:
        """Gaps between token-carrying chunks: what ``vllm bench serve`` reports as ITL."""
        c = self.chunks
        return [c[i][0] - c[i - 1][0] for i in range(1, len(c))]

    @property
    def itls_token_s(self) -> list[float]:
        """Per-token ITL: each chunk gap split evenly over the tokens it carried, once per token.

        Extra tokens in the first chunk have no gap of their own and are left out.
        """
        out: list[float] = []
        c = self.chunks
        for i in range(1, len(c)):
            n = c[i][1]
            out.extend([(c[i][0] - c[i - 1][0]) / n] * n)
        return out


@dataclass(repr=False)
class LoadResult:
    """One measured run: the samples plus what is needed to judge whether the client kept up."""

    samples: list[RequestSample]
    t_start: float
    t_end: float
    max_in_flight: int
    loop_lag_max_s: float
    loop_lag_mean_s: float
    sampling: Sampling
    base_url: str
    model: str
    api: Api
    concurrency: int
    rate: float | None
    seed: int
    cache_salt: str | None
    warmup: int
    timeout_s: float
    warmup_failed: int = 0
    metrics_before: str | None = None  # /metrics text taken after warm-up, just before t_start
    metrics_after: str | None = None  # /metrics text taken just after t_end
    metrics_error: str | None = None
    burstiness: float = 1.0  # open loop: the gamma shape of the arrivals (1: Poisson)
    #: open loop: each request's scheduled arrival, seconds after t_start (prompt order); None: closed loop
    arrivals_s: list[float] | None = None

    @property
    def duration_s(self) -> float:
        """Wall time of the measured phase (warm-up excluded)."""
        return self.t_end - self.t_start

    def arrivals(self) -> dict[str, list[float | None]] | None:
        """Open loop: each request's scheduled arrival and when it was sent (seconds after t_start, prompt
        order; sent is later where the concurrency cap held it, None where the run stopped before it)."""
        if self.arrivals_s is None:
            return None
        sent = [None if s.error is not None and s.error.startswith(NOT_SENT) else round(s.start - self.t_start, 6)
                for s in self.samples]
        return {"scheduled_s": [round(a, 6) for a in self.arrivals_s], "sent_s": sent}

    @property
    def n_failed(self) -> int:
        """How many measured requests ended with an error."""
        return sum(1 for s in self.samples if s.error is not None)

    @property
    def all_failed(self) -> bool:
        """True when no request succeeded: usually a server that is down or rejects every request."""
        return bool(self.samples) and self.n_failed == len(self.samples)

    @property
    def reached_concurrency(self) -> bool:
        """Whether the requested number of requests were ever in flight at once."""
        return self.max_in_flight >= min(self.concurrency, len(self.samples))

    def __repr__(self) -> str:
        # Short on purpose: asyncio.run reprs the finished task (signal handler restore on 3.11), and
        # pytest shows reprs in failures; thousands of samples would cost time and bury the message.
        return (f"LoadResult({len(self.samples)} samples, {self.n_failed} failed, {self.duration_s:.3f} s, "
                f"concurrency {self.concurrency}, max in flight {self.max_in_flight}, {self.base_url})")

    def error_counts(self) -> dict[str, int]:
        """Distinct error messages with their counts, most frequent first, for a failure report."""
        c = collections.Counter(s.error for s in self.samples if s.error is not None)
        return dict(c.most_common())
