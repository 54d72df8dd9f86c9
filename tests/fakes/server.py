"""The simulated vLLM OpenAI-compatible server: its behaviour (``FakeConfig``), the aiohttp app, and two ways
to run it from a test (in this process, or as a child process through the ``vllm serve`` stand-in).

It streams SSE chunks in vLLM's format (``vllm/entrypoints/openai/chat_completion/serving.py`` and
``completion/serving.py``: a role chunk first for chat, continuous usage on every chunk when asked, a
final ``choices: []`` usage chunk, then ``data: [DONE]``) and keeps vLLM's Prometheus counters
(``vllm/v1/metrics/loggers.py``, ``vllm/v1/spec_decode/metrics.py``) consistent with what it streamed.

Speculation model: the prefill step emits one token without a draft; every later step is one chunk.
With probability ``draft_share`` a step carries a draft of ``k`` tokens; one uniform draw ``u`` then
accepts positions ``i`` with ``u < acceptance[i]``, so ``acceptance`` (non-increasing) is exactly the
expected per-position acceptance rate ``accepted_per_pos[i] / drafts`` that vLLM reports. Like vLLM,
accepted tokens are counted before the output is cut at ``max_tokens`` or EOS. With ``capacity`` a decode
step costs more when more tokens are in flight (``step_s * max(1, active_requests * (1 + k) / capacity)``),
so the speedup falls with concurrency like on a GPU; ``spec_cost_per_request`` makes a spec server's step
cost grow with the requests in flight (its verification cost rising with the batch: the crossover
concurrency moves with it); ``temperature_decay`` lowers acceptance with the
request's temperature (``acceptance * exp(-decay * T)``).

Non-streamed requests (``stream`` false, for ``specdec.distribution_check``) are answered from a toy language
model instead: ``vocab`` tokens (0 = EOS, 1 = BOS, words of the prompt hashed onto the rest), next-token
log-probs a seeded function of the previous token (``lm_seed``, the same on every server, like one target
model). They honour ``n``, ``return_token_ids``, the sampling fields and, on completions, token-id prompts and
``prompt_logprobs`` in vLLM's format, so a score is the toy model's exact log-prob. ``sampler_bias`` (spec servers
only) breaks the sampler: with that probability a token is the argmax instead of a draw.

Use it in-process (``with FakeServer(FakeConfig(k=3, acceptance=(.8, .6, .4))) as url: ...``, or the
``fake_server`` fixture of tests/conftest.py), or in a child process (``FakeServerProcess``, so its CPU is not
the caller's), which runs ``fakes.serve`` (``python tests/fakes serve MODEL --port 0 --fake-config JSON``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import math
import random
import selectors
import socket
import subprocess
import sys
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

_DUMPS = json.JSONEncoder(separators=(",", ":")).encode  # compact, like pydantic's model_dump_json


def _drift(cfg: FakeConfig) -> float:
    """This moment's speed multiplier of a drifting machine (1.0 without drift)."""
    if not cfg.drift_sd:
        return 1.0
    window = int(time.monotonic() / cfg.drift_period_s)
    return math.exp(random.Random(cfg.seed * 7919 + window).gauss(0.0, cfg.drift_sd))


def _load(st: _State, cfg: FakeConfig) -> float:
    """How much longer a decode step takes with this many tokens in flight (1.0 without ``capacity`` and
    ``spec_cost_per_request``)."""
    verify = 1.0 + cfg.spec_cost_per_request * st.active if cfg.k else 1.0
    if not cfg.capacity:
        return verify
    return verify * max(1.0, st.active * (1 + cfg.k) / cfg.capacity)


@dataclass(frozen=True)
class FakeConfig:
    """How the fake server behaves; the stand-in's ``--fake-config`` / ``FAKE_VLLM_CONFIG`` take these fields
    as JSON."""

    model: str = "fake-model"
    ttft_s: float = 0.0  # delay before the first token
    step_s: float = 0.0  # delay per decode step (one chunk = 1 + accepted tokens)
    k: int = 0  # speculative tokens per draft; 0 = no speculation (no spec-decode counters, like vLLM)
    acceptance: tuple[float, ...] = ()  # P(position i accepted), non-increasing, one per draft position
    draft_share: float = 1.0  # share of decode steps that carry a draft (ngram finds no match otherwise)
    output_tokens: int | None = None  # tokens per request; None = the request's max tokens
    eos_prob: float = 0.0  # per-token chance of stopping early (ignored when the request sets ignore_eos)
    error_share: float = 0.0  # share of requests answered with HTTP 500
    abort_share: float = 0.0  # share of requests whose stream is cut before data: [DONE]
    continuous_usage: bool = True  # False: ignore continuous_usage_stats, like servers that lack it
    engines: int = 1  # requests round-robin over this many `engine` label values
    seed: int = 0
    # JSON of the speculative config to show, verbatim, in a vLLM-shaped /server_info (``vllm_server_info``),
    # like vLLM with VLLM_SERVER_DEV_MODE=1 ("null": no speculation); "" = no /server_info (404), vLLM's default.
    server_info: str = ""
    vocab: int = 64  # toy language model of the non-streamed path: vocabulary size
    lm_seed: int = 0  # and its seed (the "target model": keep it equal on the spec and reference server)
    sampler_bias: float = 0.0  # spec servers: P(a sampled token is the argmax instead): a broken rejection sampler
    return_token_ids: bool = True  # False: ignore return_token_ids, like servers that lack it
    # A machine whose speed wanders: step_s is multiplied by exp(N(0, drift_sd)), drawn anew every
    # drift_period_s of wall time (seeded by the window), so runs differ as on a shared host.
    drift_sd: float = 0.0
    drift_period_s: float = 0.3
    # A stream held back and released in bursts: `merge_steps` steps' tokens go out as one event (vLLM's
    # API server merging deltas when it falls behind the engine); `batch_events` events go out in one write
    # (what a client that is late to read finds in its socket). 1 = every step streamed as it ends.
    merge_steps: int = 1
    batch_events: int = 1
    # A GPU-like server: a decode step takes step_s * max(1, active requests * (1 + k) / capacity) (0 = never
    # slower under load), and acceptance falls with the request's temperature T to acceptance * exp(-decay * T).
    capacity: int = 0
    temperature_decay: float = 0.0
    # A spec server whose verification cost grows with the batch: a decode step takes (1 + this × active
    # requests) times longer (k > 0 only), so the speedup falls below 1.0 near c = (speedup at c≈0 − 1) / this.
    spec_cost_per_request: float = 0.0
    fail_request: int = 0  # the Nth completion request (counting from 1) is answered with HTTP 500; 0 = none
    hang_after: int = 0  # after N completion requests, later ones get their headers and then nothing; 0 = never
    # A disturbed stretch: completion requests FIRST..LAST (counting from 1) step slow_factor times slower, as
    # when something else on the machine takes the cores for one run; (0, 0) = none.
    slow_posts: tuple[int, int] = (0, 0)
    slow_factor: float = 1.0
    # A TTFT tail: every Nth completion request (counting from 1) waits ttft_tail_s more before its first token,
    # its decode steps unchanged (a draft's prefill or a longer schedule delaying some requests); 0 = none.
    ttft_tail_every: int = 0
    ttft_tail_s: float = 0.0
    # A spec step's fixed part (k > 0 only): seconds added to every decode step that do not scale with the
    # machine's speed (a test scales step_s for that), like a draft's per-step overhead on a small CPU host,
    # so the speedup moves with the machine's speed.
    draft_overhead_s: float = 0.0
    # A finished request stays in vllm:num_requests_running this long after its stream ended, as in an engine
    # that still holds a run's requests (the plugin's wait before the next run must see it); 0 = none.
    linger_s: float = 0.0
    # vLLM's --per-request-spec-decode-metrics (none, summary, detailed): with speculation, a stream's final usage
    # chunk carries the request's `metrics.speculative_decoding` (`spec_decoding_metrics`), counted where the counters
    # are. spec_metrics_extra_steps makes the two disagree: each request's figures claim that many more verify steps
    # (k draft tokens each, none accepted) than the counters saw.
    spec_decode_metrics: str = "none"
    spec_metrics_extra_steps: int = 0

    def __post_init__(self) -> None:
        if self.spec_decode_metrics not in ("none", "summary", "detailed"):
            raise ValueError(f"spec_decode_metrics is none, summary or detailed, got {self.spec_decode_metrics!r}")
        if self.spec_decode_metrics != "none" and not self.k:
            # vllm/config/vllm.py raises the same for a server without speculation
            raise ValueError("--per-request-spec-decode-metrics requires speculative decoding to be enabled "
                             "(via --speculative-config).")
        if self.merge_steps < 1 or self.batch_events < 1:
            raise ValueError(f"merge_steps and batch_events must be >= 1, got {self.merge_steps}, {self.batch_events}")
        if self.sampler_bias and not self.k:
            raise ValueError("sampler_bias breaks a spec server's sampler; this server has k=0 (no speculation)")
        if self.spec_cost_per_request < 0:
            raise ValueError(f"spec_cost_per_request must be >= 0, got {self.spec_cost_per_request}")
        if self.vocab < 3:
            raise ValueError(f"vocab needs EOS, BOS and at least one word token, got {self.vocab}")
        if self.k and len(self.acceptance) != self.k:
            raise ValueError(f"acceptance needs k={self.k} values, got {self.acceptance}")
        if any(b > a for a, b in zip(self.acceptance, self.acceptance[1:], strict=False)):
            raise ValueError(f"acceptance must be non-increasing by position, got {self.acceptance}")

    def to_json(self) -> str:
        """The fields as JSON, for ``--fake-config`` (what rebuilds this config in a child process)."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> FakeConfig:
        """A config from JSON-decoded fields (``acceptance`` as a list); an unknown field is an error."""
        unknown = set(fields) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown FakeConfig field(s) {sorted(unknown)}")
        if "acceptance" in fields:
            fields = {**fields, "acceptance": tuple(float(a) for a in fields["acceptance"])}
        if "slow_posts" in fields:
            fields = {**fields, "slow_posts": tuple(int(a) for a in fields["slow_posts"])}
        return cls(**fields)


class _State:
    """Counters and the request log of one server instance (its own Prometheus registry)."""

    def __init__(self, cfg: FakeConfig) -> None:
        self.cfg = cfg
        self.requests: list[dict[str, Any]] = []
        self.n = 0
        self.posts = 0  # completion requests received, valid or not (for fail_request)
        self.active = 0  # requests streaming right now, and the most ever at once
        self.peak_active = 0
        self.seen_prefixes: set[tuple[str | None, str]] = set()
        self.asked: dict[str, int] = {}  # non-streamed prompts: how often each was asked (seeds its samples)
        self.registry = CollectorRegistry()
        r, lab = self.registry, ["model_name", "engine"]

        def counter(name: str, extra: list[str] | None = None) -> Counter:
            return Counter(name, name, lab + (extra or []), registry=r)

        self.generation = counter("vllm:generation_tokens")
        self.prompt = counter("vllm:prompt_tokens")
        self.preemptions = counter("vllm:num_preemptions")
        self.pc_queries = counter("vllm:prefix_cache_queries")
        self.pc_hits = counter("vllm:prefix_cache_hits")
        self.success = counter("vllm:request_success", ["finished_reason"])
        self.running = Gauge("vllm:num_requests_running", "running", lab, registry=r)
        engines = [str(e) for e in range(cfg.engines)]
        for e in engines:  # vLLM creates every labelled child up front, so zeros are exported
            for c in (self.generation, self.prompt, self.preemptions, self.pc_queries, self.pc_hits, self.running):
                c.labels(cfg.model, e)
        if cfg.k:
            self.drafts = counter("vllm:spec_decode_num_drafts")
            self.draft_tokens = counter("vllm:spec_decode_num_draft_tokens")
            self.accepted = counter("vllm:spec_decode_num_accepted_tokens")
            self.per_pos = counter("vllm:spec_decode_num_accepted_tokens_per_pos", ["position"])
            for e in engines:
                for c in (self.drafts, self.draft_tokens, self.accepted):
                    c.labels(cfg.model, e)
                for p in range(cfg.k):
                    self.per_pos.labels(cfg.model, e, str(p))


def _error(status: int, message: str) -> web.Response:
    """An error body shaped like vLLM's ``ErrorResponse``."""
    return web.json_response({"error": {"message": message, "type": "BadRequestError", "param": None,
                                        "code": status}}, status=status)


def _prompt_text(body: dict[str, Any], chat: bool) -> str | None:
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            return None
        return "\n".join(m["content"] if isinstance(m.get("content"), str) else json.dumps(m.get("content"))
                         for m in msgs)
    p = body.get("prompt")
    return p if isinstance(p, str) else None


EOS, BOS = 0, 1


class ToyLM:
    """A Markov "target model": the next token's log-probs depend only on the previous token."""

    def __init__(self, vocab: int, seed: int) -> None:
        self.vocab = vocab
        self.table: list[list[float]] = []
        for prev in range(vocab):
            rng = random.Random(seed * 1_000_003 + prev)
            logits = [rng.gauss(0.0, 2.0) for _ in range(vocab)]
            logits[EOS] -= 3.0  # answers of a few dozen tokens, not of one or two
            logits[BOS] = -1e9  # never generated
            top = max(logits)
            lse = top + math.log(sum(math.exp(x - top) for x in logits))
            self.table.append([x - lse for x in logits])

    def tokenize(self, text: str, bos: bool = True) -> list[int]:
        return [BOS] * bos + [2 + zlib.crc32(w.encode()) % (self.vocab - 2) for w in text.split()]

    def logprob(self, prev: int, tok: int) -> float:
        return self.table[prev][tok]

    def rank(self, prev: int, tok: int) -> int:
        row = self.table[prev]
        return 1 + sum(1 for x in row if x > row[tok])

    def next_token(self, prev: int, rng: random.Random, body: dict[str, Any], bias: float = 0.0) -> int:
        """One token with the request's temperature, top_k, top_p and min_p (vLLM's order); with chance
        ``bias`` the argmax instead (the broken sampler)."""
        row = self.table[prev]
        t = float(body.get("temperature") or 0.0)
        if t <= 0 or (bias and rng.random() < bias):
            return max(range(self.vocab), key=row.__getitem__)
        order = sorted(range(self.vocab), key=lambda v: -row[v])
        top = row[order[0]] / t
        probs = {v: math.exp(row[v] / t - top) for v in order}
        k = int(body.get("top_k") or 0)
        if k > 0:
            order = order[:k]
        top_p = float(body.get("top_p", 1.0))
        if top_p < 1.0:
            total, cum, keep = sum(probs[v] for v in order), 0.0, []
            for v in order:
                keep.append(v)
                cum += probs[v] / total
                if cum >= top_p:
                    break
            order = keep
        min_p = float(body.get("min_p") or 0.0)
        if min_p > 0:
            order = [v for v in order if probs[v] >= min_p * probs[order[0]]]
        u = rng.random() * sum(probs[v] for v in order)
        for v in order:
            u -= probs[v]
            if u <= 0:
                return v
        return order[-1]


_LMS: dict[tuple[int, int], ToyLM] = {}


def toy_lm(cfg: FakeConfig) -> ToyLM:
    """The toy model of a config (built once per vocab and seed)."""
    key = (cfg.vocab, cfg.lm_seed)
    if key not in _LMS:
        _LMS[key] = ToyLM(*key)
    return _LMS[key]


def _prompt_logprobs(lm: ToyLM, ids: list[int], k: Any) -> list[dict[str, dict[str, Any]] | None] | None:
    """vLLM's prompt_logprobs: None for the first position, then per position a dict keyed by token id
    (a string in JSON) holding the actual token (with its rank) and the top ``k`` (-1: all)."""
    if k is None:
        return None
    k = lm.vocab if int(k) == -1 else int(k)
    out: list[dict[str, dict[str, Any]] | None] = [None]
    for prev, tok in itertools.pairwise(ids):
        row = lm.table[prev]
        entries = {tok: lm.rank(prev, tok)}
        for r, v in enumerate(sorted(range(lm.vocab), key=lambda v: -row[v])[:k], start=1):
            entries.setdefault(v, r)
        out.append({str(v): {"logprob": max(row[v], -9999.0), "rank": r, "decoded_token": f" t{v}"}
                    for v, r in entries.items()})
    return out


VLLM_VERSION = "0.32.0-fake"  # what the fakes say they are (a real 0.32.0 answers "0.32.0")
#: The torch its /server_info reports: none that is installed, so a client's own torch never passes for it.
TORCH_VERSION = "2.99.0+fake"
#: The CUDA runtime and NVIDIA driver its /server_info reports, none a client has either; the driver only
#: for device "cuda" (vLLM's collect_env finds a CUDA runtime library on a CPU machine too, but no driver).
CUDA_RUNTIME_VERSION = "12.99.0-fake"
NVIDIA_DRIVER_VERSION = "999.99.99-fake"


def resolve_speculative_config(spec: dict[str, Any] | None, target: str) -> dict[str, Any] | None:
    """``--speculative-config`` as vLLM 0.32 resolves it (``SpeculativeConfig.__post_init__``), reduced to the
    fields a client reads: ngram's ``model`` is the placeholder "ngram", its prompt-lookup window defaults
    to 5..5 and is 0..0 for other methods, a draft gets TP 1 and its own model config."""
    if not spec:
        return None
    method = spec.get("method")
    ngram = method in ("ngram", "ngram_gpu")
    lo, hi = spec.get("prompt_lookup_min"), spec.get("prompt_lookup_max")
    if ngram:
        lo, hi = (lo or hi or 5), (hi or lo or 5)
    draft = spec.get("model") or (target if method in ("mtp", "draft_model") else None)
    model = {"ngram": "ngram", "ngram_gpu": "ngram_gpu", "suffix": "suffix"}.get(str(method), draft)
    return {
        "enforce_eager": spec.get("enforce_eager"), "num_speculative_tokens": spec.get("num_speculative_tokens"),
        "model": model, "method": method, "draft_tensor_parallel_size": spec.get("draft_tensor_parallel_size", 1),
        "tensor_parallel_size": None, "quantization": spec.get("quantization"),
        "max_model_len": spec.get("max_model_len"),
        "revision": spec.get("revision"), "code_revision": None, "prompt_lookup_max": hi if ngram else 0,
        "prompt_lookup_min": lo if ngram else 0, "parallel_drafting": False, "disable_padded_drafter_batch": False,
        "target_model_config": {"model": target, "dtype": "torch.float32"},
        "draft_model_config": None if ngram or method == "suffix" else {"model": model, "runner": "draft"},
        "draft_parallel_config": None, "draft_load_config": None,
        "rejection_sample_method": "standard", "draft_sample_method": "greedy",
    }


def vllm_server_info(model: str, speculative_config: dict[str, Any] | None, *, dtype: str = "float32",
                     max_model_len: int = 1024, max_num_seqs: int = 256, max_num_batched_tokens: int = 2048,
                     enforce_eager: bool = False, tensor_parallel_size: int = 1, seed: int = 0,
                     capture_sizes: tuple[int, ...] = (), device: str = "cpu") -> dict[str, Any]:
    """``/server_info?config_format=json`` as vLLM 0.32 answers it (vllm/entrypoints/serve/dev/server_info/
    api_router.py: the pydantic dump of VllmConfig, enums by value, dtype as ``str``), reduced to a few fields
    of each section; ``speculative_config`` is served as given."""
    graphs = bool(capture_sizes) and not enforce_eager
    return {
        "vllm_config": {
            "model_config": {"model": model, "tokenizer": model, "tokenizer_mode": "auto", "trust_remote_code": False,
                             "dtype": f"torch.{dtype}", "seed": seed, "revision": None, "max_model_len": max_model_len,
                             "quantization": None, "enforce_eager": enforce_eager, "served_model_name": model,
                             "generation_config": "vllm", "max_logprobs": 20},
            "cache_config": {"block_size": 128, "gpu_memory_utilization": 0.92, "cache_dtype": "auto",
                             "enable_prefix_caching": True, "prefix_caching_hash_algo": "sha256",
                             "num_gpu_blocks": 819},
            "parallel_config": {"pipeline_parallel_size": 1, "tensor_parallel_size": tensor_parallel_size,
                                "data_parallel_size": 1, "distributed_executor_backend": "mp", "world_size": 1},
            "scheduler_config": {"runner_type": "generate", "max_num_batched_tokens": max_num_batched_tokens,
                                 "max_num_seqs": max_num_seqs, "enable_chunked_prefill": True, "policy": "fcfs",
                                 "async_scheduling": False},
            "device_config": {"device": device},
            "load_config": {"load_format": "auto", "download_dir": None},
            "attention_config": {"backend": None},
            "speculative_config": speculative_config,
            "compilation_config": {
                "mode": 3 if graphs else 0, "backend": "inductor", "custom_ops": ["all"],
                "cudagraph_mode": [2, 1] if graphs else 0, "cudagraph_capture_sizes": list(capture_sizes),
                "pass_config": {"fuse_norm_quant": True},
                "max_cudagraph_capture_size": max(capture_sizes, default=None),
                "dynamic_shapes_config": {"type": "backed"},
            },
            "lora_config": None, "additional_config": {}, "optimization_level": 2, "performance_mode": "balanced",
        },
        "vllm_env": {"VLLM_SERVER_DEV_MODE": True, "VLLM_TARGET_DEVICE": device},
        "system_env": {"torch_version": TORCH_VERSION, "is_cuda_available": "False", "vllm_version": VLLM_VERSION,
                       "vllm_build_flags": "CUDA Archs: Not Set; ROCm: Disabled; XPU: Disabled",
                       "cuda_runtime_version": CUDA_RUNTIME_VERSION,
                       "nvidia_driver_version": NVIDIA_DRIVER_VERSION if device == "cuda" else None},
    }


def spec_decoding_metrics(histogram: list[int], draft_tokens: int, k: int, steps: list[tuple[int, int]] | None = None
                          ) -> dict[str, Any]:
    """A request's ``metrics.speculative_decoding`` as vLLM 0.32 writes it: ``RequestSpecDecodeMetrics.to_dict``
    (vllm/v1/metrics/stats.py) into ``SpeculativeDecodingMetrics`` (vllm/entrypoints/generate/base/protocol.py), its
    fields in that order, the per-step arrays only at the detailed level (``steps``: (accepted, drafted) per step)."""
    n_steps = sum(histogram)
    accepted = sum(j * n for j, n in enumerate(histogram))
    out: dict[str, Any] = {
        "mean_acceptance_length": 1.0 + accepted / n_steps if n_steps else 1.0,
        "draft_acceptance_rate": accepted / draft_tokens if draft_tokens else 0.0,
        "acceptance_histogram": list(histogram), "num_spec_steps": n_steps, "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": draft_tokens, "num_spec_tokens": k,
    }
    if steps:
        out["per_step_accepted"] = [a for a, _ in steps]
        out["per_step_drafted"] = [d for _, d in steps]
    return out


def build_app(cfg: FakeConfig, server_info: dict[str, Any] | None = None) -> tuple[web.Application, _State]:
    """The aiohttp application and the state it updates (exposed so tests can inspect requests).

    ``server_info``: the whole ``/server_info`` answer to serve (the stand-in builds it from its command line);
    without it ``cfg.server_info`` decides."""
    st = _State(cfg)

    async def complete(request: web.Request, chat: bool) -> web.StreamResponse:
        cfg = st.cfg  # read per request, so FakeServer.reconfigure() takes effect on the next one
        st.posts += 1
        slow = cfg.slow_factor if cfg.slow_posts[0] <= st.posts <= cfg.slow_posts[1] else 1.0
        tail = cfg.ttft_tail_s if cfg.ttft_tail_every and st.posts % cfg.ttft_tail_every == 0 else 0.0
        if st.posts == cfg.fail_request:
            return _error(500, f"injected error (fake vLLM: request {st.posts})")
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "body is not JSON")
        if cfg.temperature_decay and cfg.k:
            t = float(body.get("temperature") or 0.0)
            cfg = dataclasses.replace(cfg, acceptance=tuple(a * math.exp(-cfg.temperature_decay * t)
                                                            for a in cfg.acceptance))
        if "temperature" not in body:
            return _error(400, "temperature is required (the fake server refuses server-side defaults)")
        if body.get("model") != cfg.model:
            return _error(404, f"The model `{body.get('model')}` does not exist.")
        if not body.get("stream"):
            return respond(body, chat)
        text = _prompt_text(body, chat)
        if text is None:
            return _error(400, "no messages" if chat else "no prompt")
        st.requests.append(body)
        st.n += 1
        engine = str((st.n - 1) % cfg.engines)
        salt = body.get("cache_salt")
        # Seeded from the prompt, not the arrival order, so results do not depend on concurrency.
        rng = random.Random(zlib.crc32(f"{cfg.seed}\0{salt}\0{text}".encode()))
        if cfg.error_share and rng.random() < cfg.error_share:
            return _error(500, "injected error")
        abort = bool(cfg.abort_share) and rng.random() < cfg.abort_share
        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        n_out = min(cfg.output_tokens or max_tokens, max_tokens)
        eos_prob = 0.0 if body.get("ignore_eos") else cfg.eos_prob
        so = body.get("stream_options") or {}
        include_usage = bool(so.get("include_usage"))
        continuous = include_usage and bool(so.get("continuous_usage_stats")) and cfg.continuous_usage
        n_prompt = max(1, len(text.split()))
        m, lab = cfg.model, (cfg.model, engine)
        st.pc_queries.labels(*lab).inc(n_prompt)
        if (salt, text) in st.seen_prefixes:
            st.pc_hits.labels(*lab).inc(n_prompt)
        st.seen_prefixes.add((salt, text))
        st.prompt.labels(*lab).inc(n_prompt)

        rid = f"{'chatcmpl' if chat else 'cmpl'}-{st.n}"
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choices: list[dict[str, Any]], done_tokens: int | None,
                  metrics: dict[str, Any] | None = None) -> bytes:
            d: dict[str, Any] = {"id": rid, "object": obj, "created": created, "model": m, "choices": choices}
            if done_tokens is not None:
                d["usage"] = {"prompt_tokens": n_prompt, "completion_tokens": done_tokens,
                              "total_tokens": n_prompt + done_tokens}
            if metrics is not None:
                d["metrics"] = metrics
            return b"data: " + _DUMPS(d).encode() + b"\n\n"

        # the request's own spec-decode figures, observed where the counters are incremented (as vLLM's scheduler)
        histogram, drafted, steps = [0] * (cfg.k + 1), 0, []

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)
        running = st.running.labels(*lab)
        running.inc()
        st.active += 1
        st.peak_active = max(st.peak_active, st.active)
        held: list[bytes] = []  # events not yet written (batch_events)
        merged = 0  # steps merged into the pending event (merge_steps)
        pending = 0  # tokens of the pending event

        async def send(data: bytes, last: bool) -> None:
            held.append(data)
            if last or len(held) >= cfg.batch_events:
                await resp.write(b"".join(held))
                held.clear()

        try:
            if cfg.hang_after and st.posts > cfg.hang_after:  # alive, listening, and silent: a hung engine
                await asyncio.sleep(3600)
            await asyncio.sleep(cfg.ttft_s + tail)
            emitted, n, finish = 0, 1, None  # the prefill step yields one token and no draft
            if chat:
                await resp.write(chunk([{"index": 0, "delta": {"role": "assistant", "content": ""},
                                         "logprobs": None, "finish_reason": None}], 0 if continuous else None))
            while True:
                n = min(n, n_out - emitted)
                if eos_prob:
                    for j in range(n):
                        if rng.random() < eos_prob:
                            n, finish = j + 1, "stop"
                            break
                emitted += n
                if finish is None and emitted >= n_out:
                    finish = "length"
                st.generation.labels(*lab).inc(n)
                pending += n
                merged += 1
                if finish is not None or merged >= cfg.merge_steps:
                    piece = " tok" * pending
                    c0: dict[str, Any] = ({"index": 0, "delta": {"content": piece}, "logprobs": None,
                                           "finish_reason": finish} if chat else
                                          {"index": 0, "text": piece, "logprobs": None, "finish_reason": finish,
                                           "stop_reason": None})
                    await send(chunk([c0], emitted if continuous else None), finish is not None)
                    pending = merged = 0
                if finish is not None:
                    break
                if abort and emitted * 2 >= n_out:
                    if held:
                        await resp.write(b"".join(held))
                    return resp  # cut the stream: no usage chunk, no [DONE]
                await asyncio.sleep(cfg.step_s * slow * _drift(cfg) * _load(st, cfg)
                                    + (cfg.draft_overhead_s if cfg.k else 0.0))
                n = 1
                if cfg.k and rng.random() < cfg.draft_share:
                    u = rng.random()
                    a = sum(1 for r in cfg.acceptance if u < r)
                    st.drafts.labels(*lab).inc()
                    st.draft_tokens.labels(*lab).inc(cfg.k)
                    st.accepted.labels(*lab).inc(a)
                    histogram[a] += 1
                    drafted += cfg.k
                    steps.append((a, cfg.k))
                    for p in range(a):
                        st.per_pos.labels(m, engine, str(p)).inc()
                    n += a
            st.success.labels(m, engine, finish).inc()
            if include_usage:
                # in a stream, the metrics ride on the final usage chunk, for n == 1 only (chat_completion/serving.py)
                per_request = None
                if cfg.spec_decode_metrics != "none" and int(body.get("n") or 1) == 1:
                    extra = cfg.spec_metrics_extra_steps
                    histogram[0] += extra
                    steps += [(0, cfg.k)] * extra
                    per_request = {"speculative_decoding": spec_decoding_metrics(
                        histogram, drafted + extra * cfg.k, cfg.k,
                        steps if cfg.spec_decode_metrics == "detailed" else None)}
                await resp.write(chunk([], emitted, per_request))
            await resp.write(b"data: [DONE]\n\n")
        finally:
            if cfg.linger_s > 0:
                asyncio.get_running_loop().call_later(cfg.linger_s, running.dec)
            else:
                running.dec()
            st.active -= 1
        return resp

    def respond(body: dict[str, Any], chat: bool) -> web.Response:
        """A non-streamed response from the toy model, in vLLM's JSON (``ChatCompletionResponse`` /
        ``CompletionResponse`` of vllm/entrypoints/openai/*/protocol.py, as serving.py fills them)."""
        cfg = st.cfg
        lm = toy_lm(cfg)
        raw = body.get("prompt")
        if not chat and isinstance(raw, list):
            if not raw or not all(isinstance(t, int) and 0 <= t < cfg.vocab for t in raw):
                return _error(400, f"prompt token ids must be in [0, {cfg.vocab})")
            prompt_ids, key = list(raw), ",".join(map(str, raw))
        else:
            text = _prompt_text(body, chat)
            if text is None:
                return _error(400, "no messages" if chat else "no prompt")
            prompt_ids, key = lm.tokenize(text, bos=chat or body.get("add_special_tokens", True) is not False), text
        st.requests.append(body)
        st.n += 1
        engine = str((st.n - 1) % cfg.engines)
        # Seeded by the prompt and how often it was asked before, so the same requests in the same order give
        # the same samples whatever the concurrency, and a repeated prompt gets new ones (no seed sent); k in
        # the seed, so a spec and a reference server draw different samples, as two vLLM servers do.
        again = st.asked.get(key, 0)
        st.asked[key] = again + 1
        rng = random.Random(zlib.crc32(f"{cfg.seed}\0{cfg.k}\0{again}\0{key}".encode()))
        n = int(body.get("n") or 1)
        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        cap = min(cfg.output_tokens or max_tokens, max_tokens)
        bias = cfg.sampler_bias if cfg.k else 0.0
        with_ids = bool(body.get("return_token_ids")) and cfg.return_token_ids
        choices, generated = [], 0
        for i in range(n):
            out: list[int] = []
            finish = "length"
            while len(out) < cap:
                tok = lm.next_token((prompt_ids + out)[-1], rng, body, bias)
                out.append(tok)
                if tok == EOS and not body.get("ignore_eos"):
                    finish = "stop"
                    break
            generated += len(out)
            text_out = "".join(f" t{t}" for t in out if t != EOS)
            c: dict[str, Any] = {"index": i}
            if chat:
                c["message"] = {"role": "assistant", "content": text_out, "refusal": None, "annotations": None,
                                "audio": None, "function_call": None, "reasoning": None}
            else:
                c["text"] = text_out
            c.update({"logprobs": None, "finish_reason": finish, "stop_reason": None,
                      "token_ids": out if with_ids else None})
            if not chat:
                c["prompt_logprobs"] = _prompt_logprobs(lm, prompt_ids, body.get("prompt_logprobs"))
                c["prompt_token_ids"] = prompt_ids if with_ids else None
            c["routed_experts"] = None
            choices.append(c)
        lab = (cfg.model, engine)
        st.prompt.labels(*lab).inc(len(prompt_ids))
        st.generation.labels(*lab).inc(generated)
        for c in choices:
            st.success.labels(cfg.model, engine, c["finish_reason"]).inc()
        d: dict[str, Any] = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{st.n}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": cfg.model, "choices": choices, "service_tier": None,
            "system_fingerprint": None,
            "usage": {"prompt_tokens": len(prompt_ids), "total_tokens": len(prompt_ids) + generated,
                      "completion_tokens": generated, "prompt_tokens_details": None,
                      "completion_tokens_details": None},
        }
        if chat:
            d.update({"prompt_logprobs": _prompt_logprobs(lm, prompt_ids, body.get("prompt_logprobs")),
                      "prompt_token_ids": prompt_ids if with_ids else None, "prompt_text": None})
        d.update({"kv_transfer_params": None, "ec_transfer_params": None, "metrics": None})
        return web.Response(body=_DUMPS(d), content_type="application/json")

    async def chat_completions(request: web.Request) -> web.StreamResponse:
        return await complete(request, True)

    async def completions(request: web.Request) -> web.StreamResponse:
        return await complete(request, False)

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": cfg.model, "object": "model",
                                                              "created": 0, "owned_by": "vllm", "root": cfg.model}]})

    async def show_server_info(request: web.Request) -> web.Response:
        if server_info is not None:
            return web.json_response(server_info)
        return web.json_response(vllm_server_info(cfg.model, json.loads(cfg.server_info)))

    async def health(request: web.Request) -> web.Response:
        return web.Response()

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(st.registry), content_type="text/plain")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    if server_info is not None or cfg.server_info:
        app.router.add_get("/server_info", show_server_info)
    return app, st


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port); port 0 picks a free one."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


class FakeServer:
    """The fake server on its own event loop in a background thread of this process."""

    def __init__(self, config: FakeConfig | None = None, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.config = config or FakeConfig()
        self.host, self.port = host, port
        self.app, self.state = build_app(self.config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def reconfigure(self, **changes: Any) -> FakeConfig:
        """Change the behaviour of the running server from the next request on (e.g. ``step_s`` to inject
        a slowdown, ``acceptance`` to inject an acceptance drop). ``k``, ``model`` and ``engines`` shape the
        exported counters and cannot change."""
        fixed = {"k", "model", "engines"} & set(changes)
        if fixed:
            raise ValueError(f"cannot change {sorted(fixed)} of a running fake server")
        self.config = self.state.cfg = dataclasses.replace(self.state.cfg, **changes)
        return self.config

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Every accepted request body, in arrival order (for assertions on what the client sent)."""
        return self.state.requests

    def start(self) -> str:
        """Start serving and return the base URL once the socket accepts connections."""
        sock = bind_socket(self.host, self.port)
        self.port = sock.getsockname()[1]
        loop = self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        failure: list[BaseException] = []

        async def setup() -> None:
            self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False, shutdown_timeout=2.0)
            await self._runner.setup()
            await web.SockSite(self._runner, sock).start()

        def main() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(setup())
            except BaseException as e:  # surfaced to start()
                failure.append(e)
                ready.set()
                return
            ready.set()
            loop.run_forever()

        self._thread = threading.Thread(target=main, name="fake-vllm", daemon=True)
        self._thread.start()
        ready.wait(10)
        if failure:
            raise failure[0]
        return self.base_url

    def stop(self) -> None:
        """Close connections and the loop; safe to call twice."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        self._loop = self._thread = self._runner = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


#: argv prefix that runs the ``vllm`` stand-in (fakes/serve.py): ``[*LAUNCHER, "serve", MODEL, ...]``, what a
#: ``launcher=`` of pytest_specdec's server pool or a replaced ``pytest_specdec.vllm.command.vllm_launcher`` takes.
LAUNCHER = [sys.executable, str(Path(__file__).resolve().parent)]


class FakeServerProcess:
    """The fake server as a child process (the ``vllm serve`` stand-in with this config): its CPU is not ours."""

    def __init__(self, config: FakeConfig | None = None, *, host: str = "127.0.0.1") -> None:
        self.config = config or FakeConfig()
        self.host = host
        self.port = 0
        self.proc: subprocess.Popen[str] | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 20) -> str:
        """Spawn, read the port from the first stdout line against a deadline, return the base URL."""
        cmd = [*LAUNCHER, "serve", self.config.model, "--host", self.host, "--port", "0",
               "--fake-config", self.config.to_json()]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        ready = sel.select(timeout_s)
        sel.close()
        line = self.proc.stdout.readline() if ready else ""
        if not line.strip().isdigit():
            self.proc.kill()
            err = self.proc.stderr.read()[-2000:] if self.proc.stderr else ""
            self.stop()
            raise RuntimeError(f"fake server did not start: {' '.join(cmd)}\nstdout: {line!r}\nstderr: {err}")
        self.port = int(line)
        return self.base_url

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 s."""
        p = self.proc
        if p is None:
            return
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        for f in (p.stdout, p.stderr):
            if f is not None:
                f.close()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
