"""The one stand-in for `vllm serve` in the tests: the simulated server of fakes/server.py behind vLLM's command line.

    python tests/fakes serve MODEL [--host H] [--port P] [--speculative-config JSON] [vLLM's flags]
                                  [--fake-config JSON]
    python -m fakes serve ...      # the same, with tests/ on sys.path

`--per-request-spec-decode-metrics summary|detailed` makes each stream's final usage chunk carry the request's
`metrics.speculative_decoding`, as vLLM 0.32 does (`FakeConfig.spec_decode_metrics`); like vLLM, a server without
--speculative-config refuses it at start.

It starts like vLLM 0.32: one `INFO fake vllm serve ...` line, then vLLM's engine-config line (with a CUDA-graph
capture size), then it serves /health, /v1/models, /metrics, the completion routes and, with
VLLM_SERVER_DEV_MODE=1 like vLLM, `/server_info?config_format=json` (built from the command's --max-model-len,
--max-num-seqs, --max-num-batched-tokens, --dtype, --enforce-eager, --tensor-parallel-size, --seed and the
resolved speculative config). `--port 0` picks a free port and prints it alone on the first line. Other vLLM
flags are accepted and ignored. SIGTERM or SIGINT stops it.

What it simulates:

* `--fake-config JSON` or FAKE_VLLM_CONFIG: `FakeConfig` fields for every server (`{"step_s": 0.001}`), or keyed
  by method (`{"*": {...}, "none": {...}, "ngram": {...}}`: `none` is the reference, `*` every method not
  named; a method's own keys win), or by method and draft model (`"eagle3:/heads/new"`: that draft's keys win
  over its method's, so an A/B session's base and candidate can differ). `k` comes from the speculative config's
  `num_speculative_tokens` unless given, and an `acceptance` longer than k is cut to its first k values. The
  flag's fields win over the variable's.
* Without either, a GPU-like simulation per method: a decode step costs more when more tokens are in flight
  (`capacity` 16, the capture size printed) so the speedup falls with concurrency and crosses 1.0, acceptance
  falls with the requested temperature; `ngram` drafts on 85 % of steps with acceptance 0.75 * 0.8^i,
  `draft_model` accepts 0.85 * 0.85^i with steps 35 % dearer for the draft model, `eagle3` crashes at start with
  a log line holding `<script>` (a report must show it as text), other methods exit with an error.
  SPECDEC_FAKE_DEGRADE=METHOD:K halves that server's acceptance (an injected regression); ngram with k=5 answers
  its 30th completion request with HTTP 500 (after a warm-up of 4 and a first run of 16 prompts: the second spec
  run is invalid).

Environment for server-lifecycle tests:

* FAKE_VLLM_MODE: `ok` (default), `crash` (exit 3 after a log line), `hang` (never listen), `slow` (listen after 1 s).
* VLLM_API_KEY: as vLLM, the /v1 routes answer 401 without `Authorization: Bearer <key>`.
* FAKE_VLLM_HANG_ONCE=METHOD:N:FLAG_FILE: the first server of that method to start (it creates FLAG_FILE) hangs
  after its Nth completion request: later requests get their headers and then nothing.
* FAKE_VLLM_STALL_ONCE=METHOD:N:FLAG_FILE: as FAKE_VLLM_HANG_ONCE, but later requests hang mid-stream: they get
  their first token and then nothing.
* FAKE_VLLM_DIE_AFTER=METHOD:N: that method's server (`none`: the reference) exits with code 70 after its Nth
  completion request, printing an EngineCore error (a server that dies mid-session).
* FAKE_VLLM_FAULT_LOG=FILE: what a server that fails prints (`crash` at its start, FAKE_VLLM_DIE_AFTER mid-session)
  instead of its one error line: a real vLLM's log of that failure (tests/data).
* FAKE_VLLM_LEGACY=1: an older vLLM (v0.0.0-fake): no /server_info route, no per-request spec-decode figures, and
  the older engine-config line (`compilation_config={"level": 3, ...}`).
* FAKE_VLLM_CHILD_PID_FILE: start a child process in the server's process group (a stop must take it down too)
  and write its pid there.
* FAKE_VLLM_RECORDS: a directory; at exit the stand-in writes `<pid>.json` there: its pid, its parent's pid,
  method, k, start, ready (about to serve) and end times, CUDA_VISIBLE_DEVICES, and `sent`, the prompt of every
  completion request it served (a chat request's last message), in order.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .server import VLLM_VERSION, FakeConfig, bind_socket, build_app, resolve_speculative_config, vllm_server_info

if TYPE_CHECKING:
    import pytest

CAPACITY = 16  # tokens in flight per step before a step gets slower (= the capture size printed)
CAPTURE_SIZES = (1, 2, 4, 8, CAPACITY)
STEP_S = 0.003
FAIL_NGRAM_K5_AT = 30
MODES = ("ok", "crash", "hang", "slow")
_FIELDS = set(FakeConfig.__dataclass_fields__)


class FakeVllm:
    """The stand-ins a pytester project starts as its ``vllm serve`` (the ``fake_vllm`` fixture of tests/conftest.py):
    what they simulate, and what they recorded."""

    def __init__(self, records: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.records_dir = records
        self._monkeypatch = monkeypatch

    def configure(self, config: dict[str, Any]) -> None:
        """FAKE_VLLM_CONFIG for every server the plugin starts: FakeConfig fields, or keyed by method."""
        self._monkeypatch.setenv("FAKE_VLLM_CONFIG", json.dumps(config))

    def records(self) -> list[dict[str, Any]]:
        """What each stopped stand-in wrote (see FAKE_VLLM_RECORDS), sorted by file name."""
        return [json.loads(p.read_text()) for p in sorted(self.records_dir.glob("*.json"))]


def parse_args(argv: list[str]) -> argparse.Namespace:
    """`serve MODEL` and the flags the stand-in reads; any other vLLM flag is accepted and ignored."""
    ap = argparse.ArgumentParser(prog="fakes", description=__doc__.splitlines()[0], allow_abbrev=False,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[1:]))
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve MODEL like `vllm serve` (see the description above)", allow_abbrev=False)
    s.add_argument("model")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000, help="0 picks a free port and prints it on the first line")
    s.add_argument("--speculative-config", type=json.loads, default=None, metavar="JSON")
    s.add_argument("--served-model-name", default=None)
    s.add_argument("--dtype", default="float32")
    s.add_argument("--max-model-len", type=int, default=1024)
    s.add_argument("--max-num-seqs", type=int, default=256)
    s.add_argument("--max-num-batched-tokens", type=int, default=2048)
    s.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--enforce-eager", action="store_true")
    s.add_argument("--per-request-spec-decode-metrics", choices=("none", "summary", "detailed"), default="none")
    s.add_argument("--fake-config", type=json.loads, default=None, metavar="JSON",
                   help="FakeConfig fields, or per method (overrides FAKE_VLLM_CONFIG's)")
    args, _ignored = ap.parse_known_args(argv)
    return args


def _method(spec: dict[str, Any] | None) -> str:
    return str(spec["method"]) if spec else "none"


def _k(spec: dict[str, Any] | None) -> int:
    return int(spec.get("num_speculative_tokens", 3)) if spec else 0


def _for_method(raw: dict[str, Any], method: str, draft: str | None = None) -> dict[str, Any]:
    """A config's fields for this method: the fields themselves (any key a FakeConfig field), or `*`'s overlaid
    with the method's own, then with its draft model's (`METHOD:MODEL`; every value an object of fields)."""
    if set(raw) & _FIELDS:
        return dict(raw)
    if not all(isinstance(v, dict) for v in raw.values()):
        raise ValueError(f"expected FakeConfig fields, or objects of them keyed by method, got {raw}")
    return {**raw.get("*", {}), **raw.get(method, {}), **raw.get(f"{method}:{draft}", {})}


def plain_config(model: str, spec: dict[str, Any] | None, fields: dict[str, Any]) -> FakeConfig:
    """The server a test configured: FakeConfig defaults, the command's model and k, then its fields."""
    k = int(fields.get("k", _k(spec)))
    fields = {"model": model, **fields, "k": k}
    if "acceptance" in fields:
        fields["acceptance"] = list(fields["acceptance"])[:k]
    return FakeConfig.from_fields(fields)


def simulated_config(model: str, spec: dict[str, Any] | None) -> FakeConfig:
    """The GPU-like simulation of this speculative config (see the module's docstring)."""
    if not spec:
        return FakeConfig(model=model, k=0, step_s=STEP_S, ttft_s=0.01, capacity=CAPACITY)
    method, k = _method(spec), _k(spec)
    if method == "ngram":
        acc, share, cost = [0.75 * 0.8 ** i for i in range(k)], 0.85, 1.15
    elif method == "draft_model":
        acc, share, cost = [0.85 * 0.85 ** i for i in range(k)], 1.0, 1.35
    else:
        raise SystemExit(f"fake vllm: no simulated behaviour for method {method!r} (give --fake-config)")
    if os.environ.get("SPECDEC_FAKE_DEGRADE") == f"{method}:{k}":
        acc = [a * 0.5 for a in acc]
    return FakeConfig(model=model, k=k, acceptance=tuple(acc), draft_share=share, step_s=STEP_S * cost, ttft_s=0.01,
                      capacity=CAPACITY, temperature_decay=0.9,
                      fail_request=FAIL_NGRAM_K5_AT if (method, k) == ("ngram", 5) else 0)


def _configured(args: argparse.Namespace) -> dict[str, Any] | None:
    """The FakeConfig fields a test gave this server (FAKE_VLLM_CONFIG, then --fake-config), or None."""
    raw = [json.loads(os.environ["FAKE_VLLM_CONFIG"])] if os.environ.get("FAKE_VLLM_CONFIG") else []
    if args.fake_config is not None:
        raw.append(args.fake_config)
    if not raw:
        return None
    fields: dict[str, Any] = {}
    spec = args.speculative_config
    for r in raw:
        fields.update(_for_method(r, _method(spec), spec.get("model") if spec else None))
    return fields


def server_config(args: argparse.Namespace, configured: dict[str, Any] | None) -> FakeConfig:
    """What this command serves: the fields a test configured, else the simulation."""
    model = args.served_model_name or args.model
    if configured is None:
        return simulated_config(model, args.speculative_config)
    return plain_config(model, args.speculative_config, configured)


def server_info(args: argparse.Namespace) -> dict[str, Any]:
    """What vLLM 0.32 would answer on /server_info for this command (the scheduler's limits from the flags)."""
    model = args.served_model_name or args.model
    return vllm_server_info(
        model, resolve_speculative_config(args.speculative_config, model), dtype=args.dtype,
        max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, enforce_eager=args.enforce_eager,
        tensor_parallel_size=args.tensor_parallel_size, seed=args.seed, capture_sizes=CAPTURE_SIZES, device="cuda")


def config_line(args: argparse.Namespace) -> str:
    """vLLM 0.32's start-up config line (VllmConfig.__str__, shortened), with SpeculativeConfig's repr."""
    model, spec = args.model, args.speculative_config
    if spec:
        draft = None if spec["method"] in ("ngram", "suffix") else spec.get("model")
        sc = f"SpeculativeConfig(method={spec['method']!r}, model={draft!r}, num_spec_tokens={_k(spec)})"
    else:
        sc = "None"
    eager = args.enforce_eager
    sizes = [] if eager else list(CAPTURE_SIZES)
    modes = ("<CompilationMode.NONE: 0>", "<CUDAGraphMode.NONE: 0>") if eager else (
        "<CompilationMode.VLLM_COMPILE: 3>", "<CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>")
    return (
        f"(EngineCore pid={os.getpid()}) INFO 11-24 03:05:13 [core.py:133] Initializing a V1 LLM engine "
        f"(v{VLLM_VERSION}) with config: model={model!r}, speculative_config={sc}, "
        f"tokenizer={model!r}, skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, "
        f"dtype=torch.{args.dtype}, max_seq_len={args.max_model_len}, "
        f"tensor_parallel_size={args.tensor_parallel_size}, enforce_eager={eager}, "
        f"kv_cache_dtype=auto, device_config=cuda, seed={args.seed}, "
        f"served_model_name={args.served_model_name or model}, "
        f"enable_prefix_caching=True, enable_chunked_prefill=True, "
        f"compilation_config={{'mode': {modes[0]}, 'backend': 'inductor', 'custom_ops': ['all'], "
        f"'cudagraph_mode': {modes[1]}, 'cudagraph_capture_sizes': {sizes}, "
        f"'pass_config': {{'fuse_norm_quant': True}}, 'max_cudagraph_capture_size': {max(sizes, default=None)}}}, "
        f"kernel_config=KernelConfig(ir_op_priority=IrOpPriorityConfig(rms_norm=['native']), moe_backend='auto')"
    )


def legacy_config_line(args: argparse.Namespace) -> str:
    """The engine-config line of an older vLLM (v0.0.0-fake), with the compilation level."""
    spec = args.speculative_config
    sc = f"SpeculativeConfig(method={spec['method']!r}, num_spec_tokens={_k(spec)})" if spec else "None"
    return (f"INFO Initializing a V1 LLM engine (v0.0.0-fake) with config: model={args.model!r}, "
            f"speculative_config={sc}, max_seq_len={args.max_model_len}, enable_prefix_caching=True, "
            'compilation_config={"level": 3, "sizes": [1, 2]}, seed=' f"{args.seed}")


def _sent(requests: list[dict[str, Any]]) -> list[str]:
    """The prompt of every request served: a chat request's last message, a completion's prompt."""
    out = []
    for b in requests:
        if isinstance(b.get("messages"), list) and b["messages"]:
            out.append(b["messages"][-1].get("content"))
        elif isinstance(b.get("prompt"), str):
            out.append(b["prompt"])
    return out


async def _serve(app: web.Application, sock: socket.socket, die_after: int = 0, state: Any = None) -> None:
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=2.0)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    if die_after:
        asyncio.get_running_loop().create_task(_die_after(state, die_after))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def _require_key(key: str) -> Any:
    """VLLM_API_KEY as vLLM enforces it (serve/middleware/authenticate.py): /v1 routes need the Bearer key."""

    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.startswith("/v1") and request.headers.get("Authorization") != f"Bearer {key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    return check


async def _die_after(state: Any, posts: int) -> None:
    """FAKE_VLLM_DIE_AFTER: a server that dies mid-session, as an engine core that crashed."""
    while state.posts < posts:
        await asyncio.sleep(0.01)
    print(_fault_log() or f"ERROR EngineCore died unexpectedly (fake: after {posts} completion requests)", flush=True)
    os._exit(70)


def _fault_log() -> str:
    """FAKE_VLLM_FAULT_LOG: the log text a failing server prints ("" when unset)."""
    path = os.environ.get("FAKE_VLLM_FAULT_LOG")
    if not path:
        return ""
    with open(path, encoding="utf-8") as f:
        return f.read().rstrip("\n")


def _die_after_posts(spec: dict[str, Any] | None) -> int:
    """FAKE_VLLM_DIE_AFTER=METHOD:N: this method's server exits after its Nth completion request."""
    method, _, n = os.environ.get("FAKE_VLLM_DIE_AFTER", "").partition(":")
    return int(n) if n and method == _method(spec) else 0


def _hang_once(spec: dict[str, Any] | None, variable: str = "FAKE_VLLM_HANG_ONCE") -> int:
    """FAKE_VLLM_HANG_ONCE=METHOD:N:FLAG_FILE: the first server of that method (the one that creates
    FLAG_FILE) hangs after its Nth completion request; the servers started after it do not."""
    method, _, rest = os.environ.get(variable, "").partition(":")
    n, _, flag = rest.partition(":")
    if not n or method != _method(spec):
        return 0
    try:
        with open(flag, "x"):
            return int(n)
    except FileExistsError:
        return 0


def _stall_after(state: Any, posts: int) -> Any:
    """FAKE_VLLM_STALL_ONCE: from the (N+1)th completion request on, a decode step takes an hour, so each
    later stream sends its first token and then nothing (a hung engine mid-stream). Set as that request
    arrives, before the handler reads its config, so which requests stall does not depend on timing."""
    seen = 0

    @web.middleware
    async def stall(request: web.Request, handler: Any) -> web.StreamResponse:
        nonlocal seen
        if request.method == "POST" and request.path in ("/v1/chat/completions", "/v1/completions"):
            seen += 1
            if seen == posts + 1:
                state.cfg = dataclasses.replace(state.cfg, step_s=3600.0)
        return await handler(request)

    return stall


def main(argv: list[str] | None = None) -> int:
    started = time.time()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    sock = bind_socket(args.host, 0) if args.port == 0 else None
    if sock is not None:
        print(sock.getsockname()[1], flush=True)
    mode = os.environ.get("FAKE_VLLM_MODE", "ok")
    if mode not in MODES:
        raise SystemExit(f"fake vllm: FAKE_VLLM_MODE={mode!r}; expected one of {', '.join(MODES)}")
    legacy = os.environ.get("FAKE_VLLM_LEGACY") == "1"
    spec = args.speculative_config
    print(f"INFO fake vllm serve {' '.join(sys.argv[2:] if argv is None else argv[1:])}", flush=True)
    configured = _configured(args)
    if configured is None and spec and spec["method"] == "eagle3":
        print("INFO Loading EAGLE-3 head <script>alert('log')</script> from " + str(spec.get("model")), flush=True)
        print("ERROR RuntimeError: draft head hidden size 512 does not match the target's 256", flush=True)
        return 1
    level = "none" if legacy else args.per_request_spec_decode_metrics  # an older vLLM has no per-request figures
    if level != "none" and not spec:
        print("ERROR ValueError: --per-request-spec-decode-metrics requires speculative decoding to be enabled "
              "(via --speculative-config).", flush=True)  # vllm/config/vllm.py
        return 1
    cfg = dataclasses.replace(server_config(args, configured), spec_decode_metrics=level)
    hang = _hang_once(spec)
    if hang:
        cfg = dataclasses.replace(cfg, hang_after=hang)
    print(legacy_config_line(args) if legacy else config_line(args), flush=True)
    if mode == "crash":
        print(_fault_log() or "RuntimeError: fake engine failed to start", flush=True)
        return 3
    if mode == "hang":
        time.sleep(3600)
    if mode == "slow":
        time.sleep(1)
    if os.environ.get("FAKE_VLLM_CHILD_PID_FILE"):
        # A grandchild in our process group: the server's stop must take it down too.
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        with open(os.environ["FAKE_VLLM_CHILD_PID_FILE"], "w") as f:
            f.write(str(child.pid))
    dev_mode = os.environ.get("VLLM_SERVER_DEV_MODE") == "1" and not legacy
    app, state = build_app(cfg, server_info(args) if dev_mode else None)
    key = os.environ.get("VLLM_API_KEY")
    if key:
        app.middlewares.append(_require_key(key))
    stall = _hang_once(spec, "FAKE_VLLM_STALL_ONCE")
    if stall:
        app.middlewares.append(_stall_after(state, stall))
    ready = time.time()  # about to serve: what the plugin's readiness poll waits for
    asyncio.run(_serve(app, sock or bind_socket(args.host, args.port), _die_after_posts(spec), state))
    records = os.environ.get("FAKE_VLLM_RECORDS")
    if records:
        record = {"pid": os.getpid(), "parent_pid": os.getppid(), "method": _method(spec), "k": cfg.k,
                  "start": started, "ready": ready, "end": time.time(),
                  "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                  "sent": _sent(state.requests)}
        with open(os.path.join(records, f"{os.getpid()}.json"), "w") as f:
            json.dump(record, f)
    return 0
