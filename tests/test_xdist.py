"""The plugin under pytest-xdist (`-n 2`), through pytester, with servers the plugin starts itself:
a stand-in for `vllm serve` runs tests/fake_server.py, so every worker starts its own reference and
spec servers (on leased fake GPUs for a GPU-device profile) and measures its own tests; the
controller alone adjusts the verdicts, writes the JSON results and the baselines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# pytester's in-process runs drop modules first imported inside them; numpy warns when imported twice
# (the controller unpickles the workers' records, which imports these).
import filelock  # noqa: F401
import numpy  # noqa: F401
import pytest_specdec.gate.baselines  # noqa: F401
import pytest_specdec.servers.gpus  # noqa: F401
import pytest_specdec.measure.client  # noqa: F401
import pytest_specdec.measure.runner  # noqa: F401
import pytest_specdec.measure.metrics  # noqa: F401
import pytest_specdec.gate.stats  # noqa: F401
import pytest_specdec.gate.sequential  # noqa: F401
import pytest_specdec.gate.slo  # noqa: F401
import pytest_specdec.gate.verdicts  # noqa: F401
import scipy.special  # noqa: F401
import scipy.stats  # noqa: F401
import xdist  # noqa: F401 - the [test] extra installs pytest-xdist

TESTS_DIR = Path(__file__).parent

# `vllm serve MODEL --host H --port P [--speculative-config JSON] ...` served by the fake server; each
# start writes what it was given (its parent is the xdist worker) and when it ran.
FAKE_SERVE = '''
import asyncio, json, os, sys, time
sys.path.insert(0, {tests_dir!r})
from fake_server import FakeConfig, _serve

argv = sys.argv[1:]
assert argv[0] == "serve", argv
spec = json.loads(argv[argv.index("--speculative-config") + 1]) if "--speculative-config" in argv else None
k = spec["num_speculative_tokens"] if spec else 0
cfg = FakeConfig(model=argv[1], k=k, acceptance=(0.8, 0.6, 0.4, 0.3, 0.2)[:k], step_s=0.001 if k else 0.002,
                 output_tokens=24)
record = {{"pid": os.getpid(), "worker_pid": os.getppid(), "k": k, "start": time.time(),
          "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}}
asyncio.run(_serve(cfg, argv[argv.index("--host") + 1], int(argv[argv.index("--port") + 1])))
record["end"] = time.time()
with open(os.path.join(os.environ["FAKE_SERVE_RECORDS"], f"{{os.getpid()}}.json"), "w") as f:
    json.dump(record, f)
'''

CONFTEST = '''
import sys
import pytest_specdec.servers.process

pytest_specdec.vllm.command.vllm_launcher = lambda: [sys.executable, {script!r}]
'''

SUITE = """
import pytest

@pytest.mark.specdec(method="ngram", k=3, temperature=[0.0, 1.0], concurrency=[1, 4], num_prompts=8, max_tokens=24)
def test_ngram(specdec):
    assert specdec.valid
"""

PROFILE = """
name = "{name}"
device = "{device}"
[target]
model = "fake-model"
tensor_parallel_size = 1
[methods.ngram]
speculative_config = {{ method = "ngram", prompt_lookup_max = 4, prompt_lookup_min = 2 }}
[matrix]
k = [3]
runs = 2
"""

IDS = [f"test_suite.py::test_ngram[ngram-k3-t{t}-c{c}]" for t in ("0.0", "1.0") for c in (1, 4)]


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A pytester project whose `vllm serve` is the fake server; its starts are recorded."""
    script = pytester.path / "fake_serve.py"
    script.write_text(FAKE_SERVE.format(tests_dir=str(TESTS_DIR)))
    pytester.makeconftest(CONFTEST.format(script=str(script)))
    pytester.makepyfile(test_suite=SUITE)
    records = pytester.path / "serve-records"
    records.mkdir()
    monkeypatch.setenv("FAKE_SERVE_RECORDS", str(records))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return pytester.path


def _run(pytester: pytest.Pytester, device: str, *extra: str) -> pytest.RunResult:
    name = "fakegpu" if device == "cuda" else "fakecpu"
    profile = pytester.path / f"{name}.toml"
    profile.write_text(PROFILE.format(name=name, device=device))
    # A subprocess: the conftest replaces pytest_specdec.vllm.command.vllm_launcher, and in-process that
    # replacement would outlive the run and send later tests' "real vLLM" servers to the fake one.
    return pytester.runpytest_subprocess(
        "-n", "2", f"--specdec-profile={profile}", f"--specdec-reports={pytester.path / 'reports'}",
        "-p", "no:cacheprovider",
        # Four fake servers and two workers share 2 busy cores: wide thresholds keep "unchanged" from flaking.
        "--specdec-threshold=rate=60", "--specdec-threshold=latency=300", "--specdec-threshold=acceptance=15",
        *extra,
    )


def _starts(project: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((project / "serve-records").glob("*.json"))]


def test_workers_measure_on_disjoint_gpus_and_the_controller_writes_once(
    pytester: pytest.Pytester, project: Path
) -> None:
    r = _run(pytester, "cuda", "--specdec-gpus=0,1", "--update-baselines")
    r.assert_outcomes(passed=4)
    # Written by the controller, once, with every worker's tests: a worker writing too would have made
    # the controller's write an update with two sessions per file.
    r.stdout.fnmatch_lines(["specdec baselines (*): 4 created, 0 updated, 0 unchanged, 0 unused"])
    assert sum("specdec baselines (" in line for line in r.outlines) == 1
    files = sorted((project / "baselines" / "fakegpu" / "test_suite").glob("*.json"))
    assert len(files) == 4
    assert all(len(json.loads(f.read_text())["sessions"]) == 1 for f in files)

    data = json.loads((project / "reports" / "latest.json").read_text())
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
    starts = _starts(project)
    assert len(starts) == 4 and len({s["worker_pid"] for s in starts}) == 2
    for a in starts:
        assert a["cuda_visible_devices"] in ("0", "1")
        for b in starts:
            if a["worker_pid"] != b["worker_pid"] and a["start"] < b["end"] and b["start"] < a["end"]:
                assert a["cuda_visible_devices"] != b["cuda_visible_devices"], (a, b)
            if a["worker_pid"] == b["worker_pid"]:
                assert a["cuda_visible_devices"] == b["cuda_visible_devices"]
    leases = json.loads(next((project / ".pytest_cache" / "specdec-gpus").glob("gpu-leases-*.json")).read_text())
    assert leases["leases"] == []  # all given back

    # The next night compares under -n 2: verdicts from every worker, adjusted over the whole session's
    # family by the controller (workers only adjust at each test's end).
    r = _run(pytester, "cuda", "--specdec-gpus=0,1")
    r.assert_outcomes(passed=4)
    data = json.loads((project / "reports" / "latest.json").read_text())
    assert sorted(t["nodeid"] for t in data["tests"]) == sorted(IDS)
    for test in data["tests"]:
        assert test["baseline"]["status"] == "compared" and test["baseline"]["adjusted"] == "session"
        assert test["verdicts"]["speedup"]["verdict"] != "regressed", test["verdicts"]["speedup"]
    assert all(len(json.loads(f.read_text())["sessions"]) == 1 for f in files)  # compare never writes


def test_cpu_profile_under_xdist_warns_and_leases_nothing(pytester: pytest.Pytester, project: Path) -> None:
    r = _run(pytester, "cpu", "--update-baselines=missing")
    r.assert_outcomes(passed=4, warnings=1)
    r.stdout.fnmatch_lines(["*SpecDecWarning: pytest-xdist runs 2 workers on the fakecpu profile (device cpu): "
                            "their vLLM servers and load generators share this host's CPU cores*"])
    assert [s["cuda_visible_devices"] for s in _starts(project)] == [None] * 4
    assert not (project / ".pytest_cache" / "specdec-gpus").exists()
    r.stdout.fnmatch_lines(["specdec baselines (*): 4 created, 0 updated, 0 unchanged, 0 unused"])


@pytest.mark.parametrize(("args", "message"), [
    (["--specdec-endpoint=http://127.0.0.1:1", "--specdec-reference-endpoint=http://127.0.0.1:2"],
     "*--specdec-endpoint with pytest-xdist (-n): the workers would load the same servers at once*"),
    (["--specdec-dry-run"], "*--specdec-dry-run starts nothing and prints from collection*run it without -n*"),
    (["--dist", "each"], "*--dist each would measure every test once per worker*"),
])
def test_what_cannot_run_in_parallel_is_refused(pytester: pytest.Pytester, args: list[str], message: str) -> None:
    pytester.makepyfile(test_suite=SUITE)
    r = pytester.runpytest("-n", "2", *args, "-p", "no:cacheprovider")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    r.stderr.fnmatch_lines([message])
