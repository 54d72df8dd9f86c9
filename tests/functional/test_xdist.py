"""The plugin under pytest-xdist (`-n 2`), through pytester, with servers the plugin starts itself:
the `vllm serve` stand-in (tests/fakes) serves them, so every worker starts its own reference and
spec servers (on leased fake GPUs for a GPU-device profile) and measures its own tests; the
controller alone adjusts the verdicts, writes the JSON results and the baselines."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

# pytester's in-process runs drop modules first imported inside them (tests/conftest.py imports the plugin's)
import xdist  # noqa: F401 - the [test] extra installs pytest-xdist
from session import read_results, specdec_session

from fakes import FakeVllm

# Each `vllm serve` the plugin starts: k from its speculative config, the acceptance of (0.8, 0.6, 0.4, 0.3, 0.2)
# cut to k, steps of 1 ms (2 ms without speculation), 24 tokens per request.
SERVERS = {"*": {"acceptance": [0.8, 0.6, 0.4, 0.3, 0.2], "step_s": 0.001, "output_tokens": 24},
           "none": {"step_s": 0.002}}
SUITE = {"temperature": [0.0, 1.0], "concurrency": [1, 4], "num_prompts": 8, "max_tokens": 24,
         "body": "assert specdec.valid"}

IDS = [f"test_suite.py::test_ngram[ngram-k3-t{t}-c{c}]" for t in ("0.0", "1.0") for c in (1, 4)]


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, fake_vllm: FakeVllm,
            make_suite: Callable[..., str]) -> Path:
    """A pytester project whose `vllm serve` is the stand-in (SERVERS); its starts are recorded."""
    fake_vllm.configure(SERVERS)
    pytester.makepyfile(test_suite=make_suite(**SUITE))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return pytester.path


@pytest.fixture
def run(pytester: pytest.Pytester, project: Path,
        make_profile: Callable[..., Path]) -> Callable[..., pytest.RunResult]:
    """`run(device, *args)`: a session of the project under `-n 2` with a profile of that device."""

    def go(device: str, *extra: str) -> pytest.RunResult:
        name = "fakegpu" if device == "cuda" else "fakecpu"
        profile = make_profile(name, device=device, tensor_parallel_size=1, methods=("ngram",), validity=None)
        if device == "cuda":  # as the 1-GPU profiles do: a worker's two servers share its GPU (servers/gpus.py)
            profile.write_text(profile.read_text() + '[server]\nargs = ["--gpu-memory-utilization", "0.45"]\n')
        # A subprocess: the project's conftest replaces pytest_specdec.vllm.command.vllm_launcher (see fake_vllm).
        return specdec_session(
            pytester, profile, None, "-n", "2", *extra, subprocess=True,
            # Four fake servers and two workers share 2 busy cores: wide thresholds keep "unchanged" from flaking.
            thresholds=("rate=60", "latency=300", "acceptance=15")).result

    return go


def test_workers_measure_on_disjoint_gpus_and_the_controller_writes_once(
    project: Path, fake_vllm: FakeVllm, run: Callable[..., pytest.RunResult]
) -> None:
    r = run("cuda", "--specdec-gpus=0,1", "--update-baselines")
    r.assert_outcomes(passed=4)
    # Written by the controller, once, with every worker's tests: a worker writing too would have made
    # the controller's write an update with two sessions per file.
    r.stdout.fnmatch_lines(["specdec baselines (*): 4 created, 0 updated, 0 unchanged, 0 unused"])
    assert sum("specdec baselines (" in line for line in r.outlines) == 1
    files = sorted((next((project / "baselines" / "fakegpu").iterdir()) / "test_suite").glob("*.json"))
    assert len(files) == 4
    assert all(len(json.loads(f.read_text())["sessions"]) == 1 for f in files)

    data = read_results(project / "reports")
    assert sorted(t["nodeid"] for t in data["tests"]) == sorted(IDS)
    assert all(t["outcome"] == "passed" and t["baseline"]["status"] == "missing" for t in data["tests"])
    placements = [p for s in data["servers"].values() for p in s["placements"]]
    assert len(placements) == data["server_starts"] == 4  # a reference and a spec server per worker
    by_worker = {p["worker"]: p["cuda_visible_devices"] for p in placements}
    assert sorted(by_worker) == ["gw0", "gw1"] and sorted(by_worker.values()) == ["0", "1"], placements
    for worker in ("gw0", "gw1"):  # workers have no terminal: their progress lines go to a file each
        progress = (project / "reports" / "logs" / worker / "progress.log").read_text()
        assert "specdec: starting vLLM (ngram, " in progress and " on GPU " in progress, progress

    # Every server got one leased GPU; servers of different workers alive at once never shared one,
    # while a worker's reference and spec servers co-resided on its GPU.
    starts = fake_vllm.records()
    assert len(starts) == 4 and len({s["parent_pid"] for s in starts}) == 2
    for a in starts:
        assert a["cuda_visible_devices"] in ("0", "1")
        for b in starts:
            if a["parent_pid"] != b["parent_pid"] and a["start"] < b["end"] and b["start"] < a["end"]:
                assert a["cuda_visible_devices"] != b["cuda_visible_devices"], (a, b)
            if a["parent_pid"] == b["parent_pid"]:
                assert a["cuda_visible_devices"] == b["cuda_visible_devices"]
    leases = json.loads(next((project / ".pytest_cache" / "specdec-gpus").glob("gpu-leases-*.json")).read_text())
    assert leases["leases"] == []  # all given back

    # The next night compares under -n 2: verdicts from every worker, adjusted over the whole session's
    # family by the controller (workers only adjust at each test's end).
    r = run("cuda", "--specdec-gpus=0,1")
    r.assert_outcomes(passed=4)
    data = read_results(project / "reports")
    assert sorted(t["nodeid"] for t in data["tests"]) == sorted(IDS)
    for test in data["tests"]:
        assert test["baseline"]["status"] == "compared" and test["baseline"]["adjusted"] == "session"
        assert test["verdicts"]["speedup"]["verdict"] != "regressed", test["verdicts"]["speedup"]
    assert all(len(json.loads(f.read_text())["sessions"]) == 1 for f in files)  # compare never writes


def test_cpu_profile_under_xdist_warns_and_leases_nothing(project: Path, fake_vllm: FakeVllm,
                                                          run: Callable[..., pytest.RunResult]) -> None:
    r = run("cpu", "--update-baselines=missing")
    r.assert_outcomes(passed=4, warnings=1)
    r.stdout.fnmatch_lines(["*SpecDecWarning: pytest-xdist runs 2 workers on the fakecpu profile (device cpu): "
                            "their vLLM servers and load generators share this host's CPU cores*"])
    assert [s["cuda_visible_devices"] for s in fake_vllm.records()] == [None] * 4
    assert not (project / ".pytest_cache" / "specdec-gpus").exists()
    r.stdout.fnmatch_lines(["specdec baselines (*): 4 created, 0 updated, 0 unchanged, 0 unused"])


@pytest.mark.parametrize(("args", "message"), [
    (["--specdec-endpoint=http://127.0.0.1:1", "--specdec-reference-endpoint=http://127.0.0.1:2"],
     "*--specdec-endpoint with pytest-xdist (-n): the workers would load the same servers at once*"),
    (["--specdec-dry-run"], "*--specdec-dry-run starts nothing and prints from collection*run it without -n*"),
    (["--dist", "each"], "*--dist each would measure every test once per worker*"),
])
def test_what_cannot_run_in_parallel_is_refused(pytester: pytest.Pytester, args: list[str], message: str,
                                                make_suite: Callable[..., str]) -> None:
    pytester.makepyfile(test_suite=make_suite(**SUITE))
    r = pytester.runpytest("-n", "2", *args, "-p", "no:cacheprovider")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    r.stderr.fnmatch_lines([message])
