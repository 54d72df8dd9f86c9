"""The GPU lease options through pytester (the lease pool itself: tests/functional/test_gpus.py; leasing under
pytest-xdist: tests/functional/test_xdist.py)."""

from __future__ import annotations

import pytest


def test_gpu_options_in_help_and_a_bad_gpu_list_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines([
        "*--specdec-gpus=LIST*GPU ids the servers may lease*",
        "*--specdec-lease-dir=DIR*",
        "*Default: '.pytest_cache/specdec-gpus'",
        "*--specdec-gpu-wait=SECONDS*",
        "*--specdec-pin-cpus*pin each vLLM server to the CPUs local to*",
    ])
    bad = pytester.runpytest("--specdec-gpus=0,0")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--specdec-gpus: GPU id(s) 0 given twice in '0,0'*"])
