"""Records `report_results.json`, the results file the HTML report tests render.

Two real plugin sessions in a scratch project, with the `vllm serve` stand-in of tests/fakes (its GPU-like
simulation, tests/fakes/serve.py) standing in for `vllm serve` (owned servers, so commands, start-up times,
engine configs and a failed start are real):

1. `--update-baselines`: writes the baselines;
2. the same suite with `SPECDEC_FAKE_DEGRADE=ngram:2` (ngram k=2 accepts half as much): its verdicts
   regress; `eagle3` fails to start (log tail recorded); ngram k=5 drops 4 % of requests (invalid runs).

Between the two, the regressed test's baseline is rewritten as if it had been recorded on vLLM 0.31.0 with
a smaller CUDA-graph capture size (`as_if_older_vllm`), so the second session's own code finds a change
under test (`baseline.under_test_diff`: vLLM 0.31.0 → 0.32.0 and the engine config) for the report to show.

The acceptance threshold is 12 pt: the injected drop is ~35 pt, and with 2 runs the T > 0 tests' sampling
noise alone crossed a 6 pt threshold (a false regression at T=0.5 in one of three recordings).

    python tests/data/record_report_results.py [--out PATH]   # rewrites tests/data/report_results.json

Nothing is edited by hand afterwards; the file is the second session's `reports/latest.json`. The committed
file was recorded by an older plugin and brought to the current schema by `pytest-specdec convert-schema`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
LAUNCHER = [sys.executable, str(HERE.parent / "fakes")]  # fakes.LAUNCHER, without importing the tests' package

PROFILE = """
name = "fake-gpu"
description = "recorded with the vllm serve stand-in of tests/fakes (simulated servers)"
device = "cpu"
hardware = "fake-gpu"
price_per_hour_usd = 2.5
[target]
model = "fake-model"
[server]
args = ["--max-num-batched-tokens", "256", "--seed", "0"]
[methods.ngram]
speculative_config = { method = "ngram", prompt_lookup_max = 4, prompt_lookup_min = 2 }
[methods.draft_model]
speculative_config = { method = "draft_model", model = "/fake/draft" }
[methods.eagle3]
speculative_config = { method = "eagle3", model = "/fake/eagle3-head" }
[matrix]
k = [3]
runs = 2
"""

CONFTEST = f"""
import sys
import pytest_specdec.servers.process as server

server.vllm_launcher = lambda: {LAUNCHER!r}
"""

SUITE = """
import pytest

W = dict(num_prompts=16, max_tokens=24)

@pytest.mark.specdec(method=["ngram", "draft_model"], k=3, temperature=0.0, concurrency=[1, 2, 4, 8, 16], **W)
def test_concurrency(specdec):
    assert specdec.summary["acceptance_rate"] is not None

@pytest.mark.specdec(method="draft_model", k=3, temperature=[0.0, 0.5, 1.0], concurrency=2, **W)
def test_temperature(specdec):
    assert specdec.summary["acceptance_rate"] is not None

@pytest.mark.specdec(method="ngram", k=[1, 2, 3, 5], temperature=0.0, concurrency=2, **W)
def test_k(specdec):
    assert specdec.summary["valid_reference_runs"] == 2

@pytest.mark.specdec(method="eagle3", k=3, temperature=0.0, concurrency=1, **W)
def test_eagle3(specdec):
    assert specdec.valid

@pytest.mark.parametrize("label", ["<script>alert('id')"])
@pytest.mark.specdec(method="ngram", k=3, temperature=0.0, concurrency=1, **W)
def test_label(specdec, label):
    assert specdec.valid
"""


#: The test whose baseline pretends to come from an older vLLM (the one SPECDEC_FAKE_DEGRADE regresses).
OLDER_VLLM_TEST = "test_k[ngram-k2-t0.0-c2]"


def as_if_older_vllm(under_test: dict) -> dict:
    """`under_test` as vLLM 0.31.0 would have recorded it: the version, and each server's engine config
    with the older version string and a CUDA-graph capture list ending at 8 instead of 16."""
    old = json.loads(json.dumps(under_test))
    old["vllm"] = "0.31.0"
    for config in (old.get("engine_config") or {}).values():
        config["vllm_version"] = "0.31.0-fake"
        # Flat typed keys (from /server_info, or parsed from the log line), else the log line's string.
        if "cudagraph_capture_sizes" in config:
            config["cudagraph_capture_sizes"] = [1, 2, 4, 8]
        if "max_cudagraph_capture_size" in config:
            config["max_cudagraph_capture_size"] = 8
        if isinstance(config.get("compilation_config"), str):
            config["compilation_config"] = ("{'mode': 3, 'cudagraph_capture_sizes': [1, 2, 4, 8], "
                                            "'max_cudagraph_capture_size': 8}")
    return old


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "report_results.json", help="(default: %(default)s)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="specdec-record-") as tmp:
        d = Path(tmp)
        (d / "fake.toml").write_text(PROFILE)
        (d / "conftest.py").write_text(CONFTEST)
        (d / "test_nightly.py").write_text(SUITE)
        (d / "pytest.ini").write_text("[pytest]\n")
        (d / ".gitignore").write_text("reports/\nbaselines/\n")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        # A suite repository, so the results carry a commit (pytest-benchmark's commit info).
        git = ["git", "-c", "user.name=specdec", "-c", "user.email=specdec@example.invalid"]
        subprocess.run(["git", "init", "-q", "-b", "nightly"], cwd=d, check=True)
        subprocess.run([*git, "add", "."], cwd=d, check=True)
        subprocess.run([*git, "commit", "-q", "-m", "suite"], cwd=d, check=True)
        common = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--specdec-profile=fake.toml",
                  "--specdec-threshold=rate=40", "--specdec-threshold=latency=150",
                  "--specdec-threshold=acceptance=12"]
        first = subprocess.run([*common, "--update-baselines"], cwd=d, env=env, text=True, capture_output=True)
        print(first.stdout[-3000:])
        baseline = d / "baselines" / "fake-gpu" / "test_nightly" / f"{OLDER_VLLM_TEST}.json"
        stored = json.loads(baseline.read_text())
        stored["under_test"] = as_if_older_vllm(stored["under_test"])
        for session in stored["sessions"]:
            if "under_test" in session:
                session["under_test"] = as_if_older_vllm(session["under_test"])
        baseline.write_text(json.dumps(stored, indent=1))
        second = subprocess.run([*common], cwd=d, text=True,
                                capture_output=True, env={**env, "SPECDEC_FAKE_DEGRADE": "ngram:2"})
        print(second.stdout[-6000:], second.stderr[-2000:])
        data = json.loads((d / "reports" / "latest.json").read_text())
        out = args.out
        out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(f"wrote {out} ({len(data['tests'])} tests)")
        shutil.rmtree(d / "reports", ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
