"""The maintained tools under scripts/ (and tests/data's recorder, and the `vllm serve` stand-in) run: each
answers --help, is listed in scripts/README.md, and the cheap ones run a small real invocation. What the
simulations' figures mean is checked on their models in tests/sims (tests/unit/test_stats.py and
test_distribution.py)."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
from command import in_process

from fakes import LAUNCHER
from pytest_specdec.gate.baselines import hardware_key

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"

#: Every script kept under scripts/, and what its --help starts its description with.
PYTHON_SCRIPTS = {
    "ab_simulation.py": "Simulated false alarms and power of an A/B in one session",
    "baseline_nights.py": "The nights stored in a profile's baseline files, written back",
    "block_simulation.py": "Simulated A/B tests in blocks (one server at a time)",
    "crossover_simulation.py": "Simulated false-regressed rate and power of the crossover verdict",
    "distribution_simulation.py": "How often the temperature > 0 distribution check",
    "endpoint_vs_bench.py": "Endpoint mode against two hand-started vLLM CPU servers",
    "gate_simulation.py": "Simulated false alarms and power of the speed gate",
    "install.py": "`pip install ARGS` into this interpreter's environment, with uv where it repeats pip's settings",
    "hardware_layout.py": "Move baseline files of the layout without a hardware folder into their machine's folder",
    "known_answers.py": "Known answers on the real engine: how often the gate catches a change",
    "latency_check.py": "A session's measurement traps from its results JSON",
    "replay_nights.py": "Replay stored nights as tonight",
    "stats_simulation.py": "Simulated false-alarm rate and power of pytest_specdec.gate.stats",
    "token_counts.py": "Token counts of the built-in dataset's prompts by the target's tokenizer",
    "trace_files.py": "The package's files a test passes through",
    "trend_simulation.py": "How `pytest-specdec history` finds change points",
    "vs_bench_load.py": "The plugin's load shaping against `vllm bench serve`",
    "vs_bench_serve.py": "Check the plugin's measurements against `vllm bench serve`",
}
#: The modules under scripts/ that tools import and nobody runs: listed in the README as such, never a tool.
LIBRARY = ("__init__.py", "vllm_bench.py")


def tool(name: str) -> list[str]:
    """The command that runs a tool: as a module of the scripts package, from the repository root (`_run`'s cwd)."""
    return [sys.executable, "-m", f"scripts.{Path(name).stem}"]


def _run(cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_every_script_is_listed_here_and_in_the_readme() -> None:
    """A new script gets a --help test and a README line (or is deleted): the lists above are what scripts/ holds.
    A library module is listed in the README's own section, and has no `__main__` of its own."""
    tools = sorted([*PYTHON_SCRIPTS, "setup.sh"])
    held = sorted(p.name for p in SCRIPTS.iterdir() if p.is_file() and p.name != "README.md")
    assert held == sorted([*tools, *LIBRARY])
    readme = (SCRIPTS / "README.md").read_text()
    assert [name for name in tools if f"`{name}`" not in readme] == []
    library_section = readme.split("**Library modules**", 1)[-1]
    assert [name for name in LIBRARY if f"`{name}`" not in library_section] == []
    assert [name for name in LIBRARY if "__main__" in (SCRIPTS / name).read_text()] == []


@pytest.mark.parametrize("name", sorted(PYTHON_SCRIPTS))
def test_script_help(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each tool's `main` with ``--help``, in this process: a child for each paid its imports (scipy, the plugin) again.
    The small runs below run tools as the README does (``python -m scripts.NAME``)."""
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT))  # what `python -m` from the root gives the tools
    monkeypatch.setattr(sys, "argv", [name, "--help"])
    out = in_process(importlib.import_module(f"scripts.{Path(name).stem}").main, sys.argv)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("usage: "), out.stdout
    assert PYTHON_SCRIPTS[name] in " ".join(out.stdout.split()), out.stdout


def test_no_tool_edits_the_import_path() -> None:
    """The tools run as modules of the scripts package from the repository root, which puts the root on the import
    path: none adds a folder of its own (not even in a child's generated code), so each imports what it names."""
    edits = [f"{p.name}:{n}: {line.strip()}" for p in sorted(SCRIPTS.glob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1) if "sys.path" in line or "addsitedir" in line]
    assert edits == []


def _sibling_imports(path: Path) -> set[str]:
    """The modules of scripts/ that ``path`` imports, at any depth of its code: as ``scripts.NAME``, relatively, or
    by a bare sibling name (the form a path edit made work)."""
    siblings = {p.stem for p in SCRIPTS.glob("*.py")} - {"__init__"}
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):  # a relative import is from the scripts package
            base = ".".join(filter(None, ("scripts" if node.level else None, node.module)))
            names = [base, *(f"{base}.{a.name}" for a in node.names)]
        else:
            continue
        for name in names:
            parts = name.split(".")
            stem = parts[1] if parts[0] == "scripts" and len(parts) > 1 else parts[0]
            if stem in siblings and stem != path.stem:
                found.add(stem)
    return found


def test_the_tools_import_each_other_in_one_direction_only() -> None:
    """No import circle among scripts/'s modules; a library module imports no tool."""
    graph = {p.stem: _sibling_imports(p) for p in sorted(SCRIPTS.glob("*.py"))}
    library = {Path(name).stem for name in LIBRARY}
    assert {m: sorted(graph[m] - library) for m in library if graph[m] - library} == {}
    done: set[str] = set()

    def cycle(m: str, stack: list[str]) -> list[str] | None:
        if m in stack:
            return [*stack[stack.index(m):], m]
        if m in done:
            return None
        for n in sorted(graph[m]):
            if (found := cycle(n, [*stack, m])) is not None:
                return found
        done.add(m)
        return None

    assert [c for m in sorted(graph) if (c := cycle(m, [])) is not None] == []


#: Where commands that run a tool are written down.
DOCUMENTED = ("README.md", "docs", "scripts", "pytest_specdec", "tests", "suites", "examples", ".ci")


def test_documented_commands_run_the_tools_as_modules() -> None:
    """A command that runs a tool by its path would not find its imports; every `-m scripts.NAME` names a tool."""
    texts = {p: p.read_text() for top in DOCUMENTED for p in ([ROOT / top] if (ROOT / top).is_file() else
                                                                 sorted((ROOT / top).rglob("*")))
             if p.is_file() and (p.suffix in (".md", ".py", ".toml", ".yml", ".yaml", ".sh") or p.parent.name == ".ci")}
    by_path = [f"{p.relative_to(ROOT)}: {m}" for p, text in texts.items()
               for m in re.findall(r"python3?\s+scripts/\w+\.py", text)]
    assert by_path == []
    tools = {Path(name).stem for name in PYTHON_SCRIPTS}
    unknown = [f"{p.relative_to(ROOT)}: {m}" for p, text in texts.items()
               for m in re.findall(r"-m\s+scripts\.(\w+)", text) if m not in tools and m != "NAME"]
    assert unknown == []
    assert any("-m scripts.vs_bench_serve" in text for text in texts.values())


def test_setup_sh_help_installs_nothing() -> None:
    out = _run(["bash", str(SCRIPTS / "setup.sh"), "--help"])
    assert out.returncode == 0, out.stderr
    assert "scripts/setup.sh --gpu" in out.stdout and "scripts/setup.sh --dev" in out.stdout
    bad = _run(["bash", str(SCRIPTS / "setup.sh"), "--tpu"])
    assert bad.returncode == 2 and "unknown option '--tpu'" in bad.stderr


def test_record_report_results_help() -> None:
    out = _run([sys.executable, str(ROOT / "tests" / "data" / "record_report_results.py"), "--help"])
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Records `report_results.json`" in out.stdout and "--out" in out.stdout


def test_vllm_serve_stand_in_help() -> None:
    out = _run([*LAUNCHER, "--help"])
    assert out.returncode == 0, out.stderr[-3000:]
    for words in ("serve", "--fake-config", "FAKE_VLLM_MODE", "FAKE_VLLM_RECORDS"):
        assert words in out.stdout, out.stdout


# ---- small real invocations ------------------------------------------------------------------------------


def test_latency_check_reads_a_results_file() -> None:
    out = _run([*tool("latency_check.py"), "tests/data/report_results.json"])
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    # The recorded session: 19 tests, ngram k=5's invalid run (an injected HTTP 500), no coalesced run.
    assert lines[0] == "19 tests; 1 invalid run(s); 0 coalesced run(s)", lines[0]
    assert "test_k[ngram-k5-t0.0-c2] spec run" in lines[1] and "requests failed" in lines[1]
    assert lines[-1].startswith("largest reference/spec TTFT P95 ratio at c=1: ")
    missing = _run([*tool("latency_check.py")])
    assert missing.returncode == 2 and "the following arguments are required: results" in missing.stderr


def test_distribution_simulation_small() -> None:
    out = _run([*tool("distribution_simulation.py"), "--scale", "0.01"])
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert len(lines) == 9 and all(line.startswith("alpha 0.0") for line in lines), lines
    assert lines[0].startswith("alpha 0.01, 8 prompts x 4 samples, shift 0.0 nats, 20 comparisons: {")


def test_replay_nights_on_the_stored_cpu_baselines(tmp_path: Path) -> None:
    import json

    out = _run([*tool("replay_nights.py"), "baselines/cpu"])
    assert out.returncode == 0, out.stderr[-3000:]
    assert "files with >= 3 nights; thresholds" in out.stdout.splitlines()[0]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and " of " in line.split("|")[1]]
    assert rows, out.stdout
    missing = _run([*tool("replay_nights.py"), "no/such/dir"])
    assert missing.returncode == 2 and "no baseline files under no/such/dir" in missing.stderr
    # two nights leave nothing to replay a night against: said, not a traceback
    committed = next((ROOT / "baselines" / "cpu").rglob("*.json"))
    data = json.loads(committed.read_text())
    data["sessions"] = data["sessions"][:2]
    (tmp_path / "t.json").write_text(json.dumps(data))
    few = _run([*tool("replay_nights.py"), str(tmp_path)])
    assert few.returncode == 2 and "holds 3 nights or more; record more nights" in few.stderr, few.stderr


def test_hardware_layout_moves_old_files_into_their_machines_folder_keeping_every_night(tmp_path: Path) -> None:
    """The committed nights copied into the layout without a hardware folder, beside a second machine's file: the
    script moves each into the folder its own comparability names, and reads back as many sessions as before."""
    import json
    import shutil

    committed = sorted((ROOT / "baselines" / "cpu").rglob("*.json"))
    old = tmp_path / "baselines" / "cpu"
    for f in committed:
        (old / f.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy(f, old / f.parent.name / f.name)
    other = json.loads(committed[0].read_text())
    other["comparability"].update(hardware="Intel(R) Xeon(R) Processor", device_count=4)
    (old / "suites.other").mkdir()
    (old / "suites.other" / "test_x.json").write_text(json.dumps(other))
    before = sum(len(json.loads(f.read_text())["sessions"]) for f in old.rglob("*.json"))

    check = _run([*tool("hardware_layout.py"), str(tmp_path / "baselines"), "--check"])
    assert check.returncode == 1 and "in the old layout" in check.stdout
    out = _run([*tool("hardware_layout.py"), str(tmp_path / "baselines")])
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{len(committed) + 1} file(s) moved; {before} session(s) before, {before} read after" in out.stdout
    here = hardware_key(json.loads(committed[0].read_text())["comparability"])
    there = hardware_key(other["comparability"])
    assert here.startswith("amd-epyc-2cpu-") and there.startswith("intel-xeon-4cpu-")
    assert sorted(p.name for p in old.iterdir()) == [here, there]
    assert len(list((old / here).rglob("*.json"))) == len(committed)
    assert (old / there / "suites.other" / "test_x.json").is_file()


def test_the_committed_baselines_are_all_in_their_machines_folder() -> None:
    """Every committed night is read by a session on the machine that measured it."""
    import json

    stored: dict[str, int] = {}  # each machine's folder (profile/hardware): the nights its files hold
    for f in sorted((ROOT / "baselines").rglob("*.json")):
        folder = "/".join(f.relative_to(ROOT / "baselines").parts[:2])
        stored[folder] = stored.get(folder, 0) + len(json.loads(f.read_text()).get("sessions", ()))
    assert "cpu" in {folder.split("/")[0] for folder in stored} and len(stored) >= 2  # the CPU's and the H200's
    out = _run([*tool("hardware_layout.py"), "baselines", "--check"])
    assert out.returncode == 0, out.stdout + out.stderr
    for folder, nights in stored.items():
        assert f"baselines/{folder}: {nights} session(s) read" in out.stdout, (folder, out.stdout)


def test_stats_simulation_small() -> None:
    out = _run([*tool("stats_simulation.py"), "--suites", "20", "--tests", "5"])
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("20 suites of 5 tests x 6 metrics, seed 20240611; alpha 0.05"), lines[0]
    # Every figure it describes: 38 shares with their standard errors, and 3 mean run counts.
    figures = [line for line in lines if line.rstrip().endswith(")") and " %  (± " in line]
    runs = [line for line in lines if "mean runs tonight" in line]
    assert (len(figures), len(runs)) == (38, 3), out.stdout


def test_ab_simulation_small() -> None:
    out = _run([*tool("ab_simulation.py"), "--suites", "5", "--pairs", "4", "--max-pairs", "6"])
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith(("| cpu", "| gpu"))]
    assert len(rows) >= 14 and all(line.count("|") in (7, 10, 12) for line in rows), out.stdout
    # the sequential table: every noise row under each of the 5 default schedules
    assert len([line for line in rows if line.count("|") == 12]) == 7 * 5, out.stdout
    bad = _run([*tool("ab_simulation.py"), "--pairs", "x"])
    assert bad.returncode == 2 and "--pairs: a comma-separated list" in bad.stderr


def test_block_simulation_small() -> None:
    out = _run([*tool("block_simulation.py"), "--tests", "5"])
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 8 and all(line.count("%") == 3 for line in rows), out.stdout


def test_trend_simulation_small() -> None:
    out = _run([*tool("trend_simulation.py"), "--series", "4"])
    assert out.returncode == 0, out.stderr[-3000:]
    for words in ("  6 nights:", "histories of 60 series", "10 nights: drop 20 %:"):
        assert words in out.stdout, out.stdout


def test_gate_simulation_small() -> None:
    out = _run([*tool("gate_simulation.py"), "--suites", "3", "--power-suites", "3"])
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("noise measured on ") and "baselines/cpu" in out.stdout.splitlines()[0]
    rows = [line for line in out.stdout.splitlines() if line.startswith(("| cpu |", "| gpu-like |"))]
    assert len(rows) == 9 and all(line.count("|") == 13 for line in rows), out.stdout


def test_vs_bench_load_reads_slos_and_finds_token_mismatches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The load mode's pure parts: bench serve's `--goodput` syntax, a bad SLO named, and a request whose token
    count differs between the clients reported as a mismatch (the figures it prints need real vLLM). Imported as
    the tools import it, from the repository root (on sys.path for this test only)."""
    monkeypatch.syspath_prepend(str(ROOT))
    vs_bench_load = importlib.import_module("scripts.vs_bench_load")

    assert vs_bench_load.parse_slos("ttft:500 tpot:50") == {"ttft": 500.0, "tpot": 50.0}
    for bad in ("ttft:0", "itl:5", "ttft:x", ""):
        with pytest.raises(SystemExit, match="--goodput"):
            vs_bench_load.parse_slos(bad)
    run = {"request_s": 2.0, "output_tok_s": 60.0, "goodput_req_s": 1.0, "input_tokens": [64, 64],
           "output_tokens": [32, 32]}
    same = vs_bench_load.compare({"plugin": [run], "bench": [dict(run)]})
    assert same["tokens_exact"] and same["request_s"]["rel_diff"] == 0.0
    off = vs_bench_load.compare({"plugin": [run], "bench": [{**run, "input_tokens": [64, 65], "request_s": 2.5}]})
    assert not off["tokens_exact"]
    assert off["token_mismatches"] == [{"pair": 0, "what": "input_tokens", "plugin": [64, 64], "bench": [64, 65]}]
    assert abs(off["request_s"]["rel_diff"] - (2.0 / 2.5 - 1)) < 1e-12
