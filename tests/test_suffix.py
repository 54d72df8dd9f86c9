"""Suffix decoding learns the responses it served, so its runs must never repeat a prompt on one server.

Through pytester with servers the plugin starts itself: a stand-in for `vllm serve` (tests/fake_server.py)
writes, when it is stopped, every prompt it was sent; the test checks that no suffix server ever saw a
prompt twice (warm-ups included), that both arms of a pair get the same prompts, and that the server is
restarted when the dataset has no unseen prompts left.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).parent

FAKE_SERVE = '''
import asyncio, json, os, signal, sys
sys.path.insert(0, {tests_dir!r})
from aiohttp import web
from fake_server import FakeConfig, build_app

argv = sys.argv[1:]
spec = json.loads(argv[argv.index("--speculative-config") + 1]) if "--speculative-config" in argv else None
k = int(spec["num_speculative_tokens"]) if spec else 0
cfg = FakeConfig(model=argv[1], k=k, acceptance=tuple(0.5 for _ in range(k)), step_s=0.0005, output_tokens=8)

async def main():
    app, state = build_app(cfg)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, argv[argv.index("--host") + 1], int(argv[argv.index("--port") + 1])).start()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    sent = [b["messages"][-1]["content"] for b in state.requests if "messages" in b]
    with open(os.path.join(os.environ["FAKE_SERVE_RECORDS"], f"{{os.getpid()}}.json"), "w") as f:
        json.dump({{"method": spec["method"] if spec else "none", "sent": sent}}, f)
    await runner.cleanup()

asyncio.run(main())
'''

CONFTEST = '''
import sys
import pytest_specdec.servers.process

pytest_specdec.vllm.command.vllm_launcher = lambda: [sys.executable, {script!r}]
'''

PROFILE = """
name = "fakesuffix"
device = "cpu"
[target]
model = "fake-model"
[methods.suffix]
speculative_config = {{ method = "suffix" }}
[methods.ngram]
speculative_config = {{ method = "ngram", prompt_lookup_max = 4, prompt_lookup_min = 2 }}
[matrix]
k = [3]
runs = {runs}
"""

# 40 prompts; two suffix tests of 3 runs x 6 prompts plus warm-ups need more than that on one server.
DATASET = "\n".join(json.dumps({"id": f"p{i}", "prompt": f"prompt number {i}", "max_tokens": 8}) for i in range(40))

SUITE = """
import pytest

@pytest.mark.specdec(method=["suffix", "ngram"], temperature=0.0, concurrency=[1, 2], num_prompts=6,
                     dataset="prompts.jsonl")
def test_methods(specdec):
    assert specdec.valid
"""


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    script = pytester.path / "fake_serve.py"
    script.write_text(FAKE_SERVE.format(tests_dir=str(TESTS_DIR)))
    pytester.makeconftest(CONFTEST.format(script=str(script)))
    pytester.makepyfile(test_suite=SUITE)
    (pytester.path / "prompts.jsonl").write_text(DATASET + "\n")
    records = pytester.path / "serve-records"
    records.mkdir()
    monkeypatch.setenv("FAKE_SERVE_RECORDS", str(records))
    return pytester.path


def _run(pytester: pytest.Pytester, runs: int) -> pytest.RunResult:
    profile = pytester.path / "fakesuffix.toml"
    profile.write_text(PROFILE.format(runs=runs))
    # A subprocess: the conftest replaces server.vllm_launcher, which must not outlive the run.
    return pytester.runpytest_subprocess(
        f"--specdec-profile={profile}", f"--specdec-reports={pytester.path / 'reports'}", "-p", "no:cacheprovider",
        "--specdec-quiet-timeout=0", "-v", "--update-baselines=missing",  # no baselines: a first session
    )


def test_suffix_runs_get_prompts_their_server_never_saw(pytester: pytest.Pytester, project: Path) -> None:
    r = _run(pytester, runs=3)
    r.assert_outcomes(passed=4)
    r.stdout.fnmatch_lines([
        "*fresh prompts every run (suffix decoding learns what it served)*",
        "*stopping vLLM (suffix, *): every prompt of 'prompts.jsonl' left has been sent to it*",
    ])
    servers = [json.loads(p.read_text()) for p in sorted((project / "serve-records").glob("*.json"))]
    suffix = [s for s in servers if s["method"] == "suffix"]
    # 2 tests x (3 runs x 6 + warm-up) > 40 prompts: the second test needs a fresh server.
    assert len(suffix) == 2, [len(s["sent"]) for s in suffix]
    for s in suffix:
        assert len(s["sent"]) == len(set(s["sent"])), "a suffix server was sent a prompt twice"
    # Other methods keep one server and the same prompts every run (and repeat them across tests).
    ngram = [s for s in servers if s["method"] == "ngram"]
    assert len(ngram) == 1 and len(ngram[0]["sent"]) > len(set(ngram[0]["sent"]))

    data = json.loads((project / "reports" / "latest.json").read_text())
    for test in data["tests"]:
        runs, refs = test["runs"], test["reference_runs"]
        if test["params"]["method"] == "suffix":
            # Both arms of a pair share their prompts; no two runs of a test do.
            assert [r["prompt_ids"] for r in runs] == [r["prompt_ids"] for r in refs]
            ids = [i for r in runs for i in r["prompt_ids"]]
            assert len(ids) == len(set(ids)) == 18
        else:
            assert all("prompt_ids" not in r for r in [*runs, *refs])
        assert test["sampling"]["temperature"] == 0.0 and test["sampling"]["ignore_eos"] is False
    # Server starts are printed: the suffix restart is one more than the distinct specs.
    r.stdout.fnmatch_lines(["*specdec: 4 vLLM server start(s), 3 distinct server spec(s)*"])
