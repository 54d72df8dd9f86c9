"""Run a snippet against vLLM's own benchmark code in a child process: importing vLLM costs seconds and torch, so
the tests that compare with it pay that once there, and skip where vLLM is not installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest


def run_vllm_script(script: str, payload: Any, what: str, **env: str) -> Any:
    """``script`` reads ``payload`` (JSON) on stdin and prints ``RESULT <json>``; its result, a skip where vLLM is
    missing or too slow to import, else an AssertionError naming ``what`` failed with its stderr."""
    child_env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", **env)
    try:
        p = subprocess.run([sys.executable, "-c", script], input=json.dumps(payload), capture_output=True, text=True,
                           env=child_env, timeout=180)
    except subprocess.TimeoutExpired:
        pytest.skip("importing vllm took over 180 s")
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        if "No module named 'vllm'" in p.stderr:
            pytest.skip("vllm is not installed in this interpreter")
        raise AssertionError(f"{what} failed:\n{p.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])
