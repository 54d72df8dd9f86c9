"""Stands in for `vllm serve` with speculation, for recording report data without real vLLM.

`python fake_vllm_spec.py serve MODEL --host H --port P [--speculative-config JSON] ...` prints vLLM 0.32's
engine-config line (with a CUDA-graph capture size) and serves `fake_server.build_app` on the port, plus,
with VLLM_SERVER_DEV_MODE=1 like vLLM, `/server_info?config_format=json` (`fake_server.vllm_server_info`,
from the command's --max-num-batched-tokens, --max-num-seqs, --max-model-len, --dtype, --enforce-eager, ...).
Unlike the plain fake server, a decode step costs more when more tokens are in flight: the step
time is `step_s * max(1, active_requests * (1 + k) / CAPACITY)`, so the speedup falls with
concurrency and crosses 1.0 like on a real GPU; acceptance falls with the requested temperature.

Per method: `ngram` (draft_share 0.85, acceptance 0.75 * 0.8^i), `draft_model` (acceptance 0.85 *
0.85^i, steps 35 % dearer for the draft model), `eagle3` crashes at start with a log line holding
`<script>` (the report must show it as text). Environment: SPECDEC_FAKE_DEGRADE=METHOD:K halves that
server's acceptance (an injected regression); ngram with k=5 answers its 30th completion request
with HTTP 500 (after a warm-up of 4 and a first run of 16 prompts: the second spec run is invalid).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import fake_server  # noqa: E402
from aiohttp import web  # noqa: E402

CAPACITY = 16  # tokens in flight per step before a step gets slower (= the capture size printed)
CAPTURE_SIZES = (1, 2, 4, 8, CAPACITY)
STEP_S = 0.003


def config_for(model: str, spec: dict[str, Any] | None) -> tuple[fake_server.FakeConfig, float]:
    """The fake server's config and the step-cost factor of this speculative config."""
    if not spec:
        return fake_server.FakeConfig(model=model, k=0, step_s=STEP_S, ttft_s=0.01), 1.0
    method, k = spec["method"], int(spec.get("num_speculative_tokens", 3))
    if method == "ngram":
        acc, share, cost = [0.75 * 0.8 ** i for i in range(k)], 0.85, 1.15
    elif method == "draft_model":
        acc, share, cost = [0.85 * 0.85 ** i for i in range(k)], 1.0, 1.35
    else:
        raise SystemExit(f"fake_vllm_spec: no behaviour for method {method!r}")
    if os.environ.get("SPECDEC_FAKE_DEGRADE") == f"{method}:{k}":
        acc = [a * 0.5 for a in acc]
    cfg = fake_server.FakeConfig(model=model, k=k, acceptance=tuple(acc), draft_share=share,
                                 step_s=STEP_S * cost, ttft_s=0.01)
    return cfg, cost


def _option(argv: list[str], flag: str, default: Any, kind: type = int) -> Any:
    return kind(argv[argv.index(flag) + 1]) if flag in argv[:-1] else default


def server_info(argv: list[str], spec: dict[str, Any] | None) -> dict[str, Any]:
    """What vLLM 0.32 would answer on /server_info for this command (the scheduler's limits from the flags)."""
    model = argv[1]
    return fake_server.vllm_server_info(
        model, fake_server.resolve_speculative_config(spec, model),
        dtype=_option(argv, "--dtype", "float32", str), max_model_len=_option(argv, "--max-model-len", 1024),
        max_num_seqs=_option(argv, "--max-num-seqs", 256),
        max_num_batched_tokens=_option(argv, "--max-num-batched-tokens", 2048),
        enforce_eager="--enforce-eager" in argv, tensor_parallel_size=_option(argv, "--tensor-parallel-size", 1),
        seed=_option(argv, "--seed", 0), capture_sizes=CAPTURE_SIZES, device="cuda")


def config_line(argv: list[str], spec: dict[str, Any] | None) -> str:
    """vLLM 0.32's start-up config line (VllmConfig.__str__, shortened), with SpeculativeConfig's repr."""
    model = argv[1]
    if spec:
        draft = None if spec["method"] in ("ngram", "suffix") else spec.get("model")
        k = spec.get("num_speculative_tokens", 3)
        sc = f"SpeculativeConfig(method={spec['method']!r}, model={draft!r}, num_spec_tokens={k})"
    else:
        sc = "None"
    eager = "--enforce-eager" in argv
    sizes = [] if eager else list(CAPTURE_SIZES)
    modes = ("<CompilationMode.NONE: 0>", "<CUDAGraphMode.NONE: 0>") if eager else (
        "<CompilationMode.VLLM_COMPILE: 3>", "<CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>")
    return (
        f"(EngineCore pid={os.getpid()}) INFO 11-24 03:05:13 [core.py:133] Initializing a V1 LLM engine "
        f"(v{fake_server.VLLM_VERSION}) with config: model={model!r}, speculative_config={sc}, "
        f"tokenizer={model!r}, skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, "
        f"dtype=torch.{_option(argv, '--dtype', 'float32', str)}, "
        f"max_seq_len={_option(argv, '--max-model-len', 1024)}, "
        f"tensor_parallel_size={_option(argv, '--tensor-parallel-size', 1)}, enforce_eager={eager}, "
        f"kv_cache_dtype=auto, device_config=cuda, seed={_option(argv, '--seed', 0)}, served_model_name={model}, "
        f"enable_prefix_caching=True, enable_chunked_prefill=True, "
        f"compilation_config={{'mode': {modes[0]}, 'backend': 'inductor', 'custom_ops': ['all'], "
        f"'cudagraph_mode': {modes[1]}, 'cudagraph_capture_sizes': {sizes}, "
        f"'pass_config': {{'fuse_norm_quant': True}}, 'max_cudagraph_capture_size': {max(sizes, default=None)}}}, "
        f"kernel_config=KernelConfig(ir_op_priority=IrOpPriorityConfig(rms_norm=['native']), moe_backend='auto')"
    )


def main(argv: list[str]) -> None:
    assert argv[0] == "serve", argv
    model = argv[1]
    host, port = argv[argv.index("--host") + 1], int(argv[argv.index("--port") + 1])
    spec = json.loads(argv[argv.index("--speculative-config") + 1]) if "--speculative-config" in argv else None
    k = int(spec.get("num_speculative_tokens", 3)) if spec else 0
    print(f"INFO fake vllm serve {' '.join(argv[1:])}", flush=True)
    if spec and spec["method"] == "eagle3":
        print("INFO Loading EAGLE-3 head <script>alert('log')</script> from " + str(spec.get("model")), flush=True)
        print("ERROR RuntimeError: draft head hidden size 512 does not match the target's 256", flush=True)
        sys.exit(1)
    print(config_line(argv, spec), flush=True)
    base, _ = config_for(model, spec)
    app, st = fake_server.build_app(base)
    if os.environ.get("VLLM_SERVER_DEV_MODE") == "1":
        info = server_info(argv, spec)

        async def show_server_info(request: web.Request) -> web.Response:
            return web.json_response(info)

        app.router.add_get("/server_info", show_server_info)

    class _LoadedAsyncio:
        """`asyncio` for the fake server, whose decode-step sleep grows with the tokens in flight."""

        def __getattr__(self, name: str) -> Any:
            return getattr(asyncio, name)

        async def sleep(self, delay: float) -> None:
            if delay == st.cfg.step_s:
                delay *= max(1.0, st.active * (1 + k) / CAPACITY)
            await asyncio.sleep(delay)

    fake_server.asyncio = _LoadedAsyncio()  # type: ignore[assignment]

    posts = 0
    fail_at = 30 if spec and (spec["method"], k) == ("ngram", 5) else None

    @web.middleware
    async def temperature(request: web.Request, handler: Any) -> web.StreamResponse:
        nonlocal posts
        posts += request.method == "POST"
        if posts == fail_at and request.method == "POST":
            return fake_server._error(500, "injected error (fake_vllm_spec: request 30)")
        if request.method == "POST" and base.k:
            t = float((await request.json()).get("temperature") or 0.0)
            st.cfg = dataclasses.replace(base, acceptance=tuple(a * math.exp(-0.9 * t) for a in base.acceptance))
        return await handler(request)  # type: ignore[no-any-return]

    app.middlewares.append(temperature)
    web.run_app(app, host=host, port=port, print=None, access_log=None)


if __name__ == "__main__":
    main(sys.argv[1:])
