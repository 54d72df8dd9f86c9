"""`vllm bench serve` as the comparison tools run it, and their `--server-cpus` option: what vs_bench_serve.py,
vs_bench_load.py and endpoint_vs_bench.py share. A library module, not a tool: it imports no other module of
scripts/, so the tools that import it import each other in one direction only."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any


def bench_prompts_file(prompts: list[Any], path: Path) -> None:
    """The built-in prompts as bench serve's custom JSONL: the user turn and its max_tokens."""
    with path.open("w", encoding="utf-8") as f:
        for p in prompts:
            if not p.messages or len(p.messages) != 1 or p.messages[0]["role"] != "user":
                raise SystemExit(f"prompt {p.id}: bench serve's custom dataset takes one user turn")
            f.write(json.dumps({"prompt": p.messages[0]["content"], "output_tokens": p.max_tokens}) + "\n")


def bench_command(base_url: str, model: str, tokenizer: str, data: Path, n: int, concurrency: int,
                  temperature: float, result_dir: Path, name: str) -> list[str]:
    """bench serve on the chat endpoint with the custom dataset written by `bench_prompts_file`."""
    return [
        sys.executable, "-m", "pytest_specdec.vllm.cli", "bench", "serve",
        "--backend", "openai-chat", "--base-url", base_url, "--endpoint", "/v1/chat/completions",
        "--model", model, "--tokenizer", tokenizer,
        "--dataset-name", "custom", "--dataset-path", str(data), "--custom-output-len", "-1",
        "--skip-chat-template", "--disable-shuffle", "--num-prompts", str(n),
        "--max-concurrency", str(concurrency), "--request-rate", "inf",
        "--temperature", str(temperature), "--num-warmups", "0", "--seed", "0",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,95,99",
        "--save-result", "--save-detailed", "--result-dir", str(result_dir), "--result-filename", name,
        "--ready-check-timeout-sec", "0",
    ]


def run_bench(cmd: list[str], env: dict[str, str], result: Path) -> tuple[dict[str, Any], float]:
    """Run bench serve; return its result JSON and the CPU seconds its process used."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"bench serve failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return json.loads(result.read_text()), cpu


def server_cpus(text: str | None) -> frozenset[int] | None:
    """`--server-cpus 1,3` → {1, 3}: the CPUs the server's processes start on (vLLM's CPU worker then binds
    itself to its own cores)."""
    return None if not text else frozenset(int(x) for x in text.split(","))
