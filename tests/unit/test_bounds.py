"""max_num_seqs: how many requests a profile's server runs at once, as vLLM decides it, and why."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_specdec.errors import ConfigError
from pytest_specdec.profiles import load_profile
from pytest_specdec.profiles.placement import max_num_seqs


def _profile(tmp_path: Path, args: list[str], device: str = "cuda", names: list[str] | None = None,
             tensor_parallel_size: int = 1) -> tuple[int, str]:
    lines = ['name = "p"', f'device = "{device}"']
    if names is not None:
        lines.append(f"nvidia_smi_names = {names!r}".replace("'", '"'))
    lines += ["[target]", 'model = "m"', f"tensor_parallel_size = {tensor_parallel_size}", "[server]",
              f"args = {args!r}".replace("'", '"'), "[methods.ngram]", 'speculative_config = { method = "ngram" }']
    path = tmp_path / "p.toml"
    path.write_text("\n".join(lines) + "\n")
    return max_num_seqs(load_profile(str(path)))


@pytest.mark.parametrize(("args", "device", "names", "tp", "seqs", "source"), [
    (["--max-num-seqs", "64"], "cuda", None, 1, 64, "--max-num-seqs 64 in its [server] args"),
    (["--max-num-seqs=8", "--performance-mode", "throughput"], "cpu", None, 1, 8, "--max-num-seqs 8 in its"),
    ([], "cpu", None, 2, 256, "vLLM's default on the CPU, 128 per rank x 2; set --max-num-seqs"),
    ([], "cuda", ["NVIDIA A100-SXM4-80GB"], 1, 256, "vLLM's default on an A100;"),
    ([], "cuda", ["NVIDIA H100 80GB HBM3"], 1, 1024, "vLLM's largest GPU default;"),
    (["--performance-mode", "throughput"], "cuda", ["NVIDIA A100-SXM4-80GB"], 1, 512,
     "vLLM's default on an A100, doubled by --performance-mode throughput;"),
    (["--max-num-batched-tokens", "100"], "cuda", None, 1, 100, "--max-num-batched-tokens 100 in its [server] args;"),
])
def test_the_limit_and_where_it_comes_from(tmp_path: Path, args: list[str], device: str, names: list[str] | None,
                                           tp: int, seqs: int, source: str) -> None:
    got, why = _profile(tmp_path, args, device, names, tp)
    assert got == seqs and why.startswith(source)


def test_a_limit_that_is_no_number_names_the_profile_and_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"profile 'p': \[server\] args --max-num-seqs 'many' is not a whole number"):
        _profile(tmp_path, ["--max-num-seqs", "many"])
