"""Stands in for `vllm serve` with speculation, for recording report data without real vLLM.

`python fake_vllm_spec.py serve MODEL --host H --port P [--speculative-config JSON] ...` prints vLLM's
engine-config line (with a CUDA-graph capture size) and serves `fake_server.build_app` on the port.
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
    print(
        f"INFO Initializing a V1 LLM engine (v0.32.0-fake) with config: model='{model}', "
        f"speculative_config={spec!r}, max_seq_len=1024, enable_prefix_caching=True, "
        f"compilation_config={{'mode': 3, 'cudagraph_capture_sizes': [1, 2, 4, 8, {CAPACITY}], "
        f"'max_cudagraph_capture_size': {CAPACITY}}}, seed=0",
        flush=True,
    )
    base, _ = config_for(model, spec)
    app, st = fake_server.build_app(base)

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
