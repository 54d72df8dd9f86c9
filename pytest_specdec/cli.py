"""`pytest-specdec`: the plugin's results read outside pytest (wiring only; the work is in app/, output/ and gate/).

    pytest-specdec compare OLD NEW.json        the plugin's verdicts of NEW against OLD's runs (a results file)
                                               or stored baselines (a directory: exactly the session's own
                                               verdicts); exit 1 where the plugin fails a test (a gated
                                               regression of a test that did not opt out, a dead arm in NEW)
    pytest-specdec compare [OLD] AB.json       an A/B session's tests judged again, candidate vs base, beside
                                               OLD's A/B verdicts
    pytest-specdec merge SHARD.json...         one night's shards (a session each, on its own machine) as one
                                               results file, JUnit file and HTML report: BH/Holm redone over
                                               every shard's verdicts together; with --expect, a test in no
                                               shard fails the merge; exit 1 where a test fails
    pytest-specdec history DIR|FILE...         per test and gated metric, the nights' series and change points
    pytest-specdec calibrate FILE.json...      this host's noise from several sessions of the same tests: run and
                                               night sd per metric, what a lone test catches; --write
                                               keeps it beside the machine's baselines for the gate
    pytest-specdec report FILE.json            the HTML report again, from a results file
    pytest-specdec convert-schema PATH...      the plugin's files of an older schema brought to the
                                               current one, in place, every night kept (the command the
                                               plugin names for an older file)

Bad input (a missing or malformed file, an unknown profile, a bad option) exits 2 with one line naming what
to fix. Heavy modules are imported inside the commands, so `--help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_specdec.errors import SpecDecDeprecationWarning, SpecDecError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pytest_specdec.app.compare import StoredDir
    from pytest_specdec.gate.stats import Thresholds
    from pytest_specdec.output.history import NightFile
    from pytest_specdec.output.schema import Results
    from pytest_specdec.profiles import Profile

#: Exit statuses: nothing failed, a test failed as the plugin fails it (compare), bad input.
OK, REGRESSED, BAD_INPUT = 0, 1, 2


class InputError(SpecDecError):
    """Input the command cannot use; the message names the file or option and what to fix."""


#: The name the plugin gives its --specdec-save-outputs side file (`specdec-<time>.outputs.json`), which has a
#: `schema` of its own beside the results file it belongs to.
OUTPUTS_SUFFIX = ".outputs.json"


def read_json(path: Path) -> Any:
    """A file parsed as JSON; errors name the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file (a results file is reports/specdec-<time>.json or "
                         "reports/latest.json of a session)") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot be read as a results file ({exc})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None


def not_results(path: Path, data: Any) -> str:
    """Why a JSON file is none of a session's results files ("" when it may be one): the side file of
    --specdec-save-outputs by its name, anything else by the top-level `schema` every results file has
    (a --specdec-benchmark-json file has none). A file that passes may still be broken: `load` says where."""
    if path.name.endswith(OUTPUTS_SUFFIX):
        return (f"a --specdec-save-outputs side file (its name ends {OUTPUTS_SUFFIX}); the session's results "
                f"are the {path.name[:-len(OUTPUTS_SUFFIX)]}.json beside it")
    if not isinstance(data, dict) or "schema" not in data:
        return "no top-level `schema` (e.g. a --specdec-benchmark-json file or another tool's JSON)"
    return ""


def read_results(path: Path, data: Any = None) -> tuple[dict[str, Any], Results]:
    """A results file parsed and read as typed data (older schemas converted); errors name the file.
    ``data``: the file already parsed."""
    from pytest_specdec.output.schema import ResultsError, load

    if data is None:
        data = read_json(path)
    why = not_results(path, data)
    if why:
        raise InputError(f"{path}: not a pytest-specdec results file: {why}")
    try:
        return data, load(data, str(path))
    except ResultsError as exc:
        raise InputError(str(exc)) from None


def thresholds(profile: str, items: Sequence[str], where: str, recorded: Mapping[str, Any] | None = None
               ) -> tuple[Thresholds, dict[str, float]]:
    """The session's thresholds, as the file recorded them (else the profile's `[verdicts] thresholds`), with
    --threshold on top as the plugin layers them; and the --threshold layer alone (it also goes on top of
    each test's recorded thresholds)."""
    from pytest_specdec.errors import ConfigError
    from pytest_specdec.gate.thresholds import build_thresholds, from_dict, layers, on_top, parse_threshold_items

    try:
        override = parse_threshold_items(items, "--threshold")
        if recorded is not None:
            return on_top(from_dict(recorded, f"{where}: gate.settings.thresholds"), override), override
    except ConfigError as exc:
        raise InputError(str(exc)) from None
    p = profile_of(profile, where)
    raw = p.raw.get("verdicts", {}).get("thresholds", {})
    try:  # the profile's table, as the session layers it (no ini here), --threshold on top
        return build_thresholds(*layers(raw, f"profile {p.path} [verdicts] thresholds", (), items,
                                        "--threshold")), override
    except ConfigError as exc:
        raise InputError(str(exc)) from None


def profile_of(profile: str, where: str) -> Profile:
    from pytest_specdec.errors import ConfigError
    from pytest_specdec.profiles import load_profile

    try:
        return load_profile(profile)
    except ConfigError as exc:
        raise InputError(f"{where}: {exc} (the thresholds come from it: pass --profile NAME or PATH)") from None


def stored_dir(path: Path, profile: str) -> StoredDir:
    """OLD given as a directory of baselines: the root (holding ``<profile>/``), the profile's own folder (each
    test against its own machine's folder), or one machine's folder."""
    from pytest_specdec.app.compare import StoredDir
    from pytest_specdec.gate.baselines import safe_part

    if (path / safe_part(profile)).is_dir():
        return StoredDir(path, profile)
    if path.name == safe_part(profile):
        return StoredDir(path.parent, profile)
    if path.parent.name == safe_part(profile):  # one machine's folder: every test against it
        return StoredDir(path.parent.parent, profile, path.name)
    raise InputError(f"{path}: no baselines of profile {profile!r} there (neither {path / safe_part(profile)} nor a "
                     f"folder named {safe_part(profile)}); pass the baselines root, baselines/<profile> or "
                     "baselines/<profile>/<hardware>")


def cmd_compare(args: argparse.Namespace) -> int:
    from pytest_specdec.app.ab_compare import is_ab
    from pytest_specdec.app.compare import compare, session_rule
    from pytest_specdec.gate.machine import StateTolerance
    from pytest_specdec.gate.variance import NightPrior, night_prior_from
    from pytest_specdec.output.compare import names, summary_lines, table_lines, to_json

    if args.new is None:  # one file: an A/B session's, judged again
        args.old, args.new = None, args.old
    old_file = None if args.old is None or args.old.is_dir() else read_results(args.old)
    new_raw, new = read_results(args.new)
    if is_ab(new) or (old_file is not None and is_ab(old_file[1])):
        return compare_ab_files(args, None if old_file is None else old_file[1], new)
    if args.old is None:
        raise InputError(f"{args.new}: not an A/B session's results; compare needs OLD and NEW (one file alone is "
                         "judged again only when an A/B session wrote it)")
    profile = args.profile or new.profile
    if not profile:
        raise InputError(f"{args.new}: no `profile` recorded; pass --profile NAME or PATH for the thresholds")
    where = "--profile" if args.profile else f"{args.new}: `profile`"
    settings = new.gate.settings
    th, override = thresholds(profile, args.threshold, where, None if args.profile else settings.get("thresholds"))
    alpha = args.alpha if args.alpha is not None else float(settings.get("alpha", 0.05))
    multiplicity = args.multiplicity or str(settings.get("multiplicity", "bh"))
    old_name, new_name = names((args.old, args.new))
    rule = session_rule(new, strict=args.strict, fail_inconclusive=args.fail_inconclusive)
    tolerance = settings.get("machine_state_tolerance")
    if tolerance is None or args.profile:
        tolerance = StateTolerance.of_profile(profile, profile_of(profile, where).machine_state_tolerance)
    else:  # the session's own: its calibration's, say (a number in a file before tolerances per kind)
        tolerance = StateTolerance.from_setting(tolerance, f"{args.new}: gate.settings")
    if settings.get("night_prior") is not None and not args.profile:  # the session's own: its calibration's, say
        prior = NightPrior.from_dict(settings["night_prior"], f"{args.new}: gate.settings")
    else:  # a file written before night priors, or --profile: the profile's
        p = profile_of(profile, where)
        prior = night_prior_from(p.night_prior, p.night_prior_source)
    if args.old.is_dir():
        old: Any = stored_dir(args.old, new.profile or profile)
        floor = settings.get("min_night_sd")
        if floor is None or args.profile:
            floor = profile_of(profile, where).min_night_sd
        result = compare(old, new, thresholds=th, override=override, alpha=alpha, multiplicity=multiplicity,
                         min_night_sd=float(floor), night_prior=prior, state_tolerance=tolerance,
                         old_name=old_name, new_name=new_name, rule=rule)
        started = f"stored baselines of profile {old.profile}"
    else:
        assert old_file is not None
        old_raw, old = old_file
        if old.profile != new.profile and not args.profile:
            print(f"specdec compare: the files ran different profiles ({old.profile} → {new.profile}); thresholds "
                  f"of {new.profile}", file=sys.stderr)
        result = compare(old, new, thresholds=th, override=override, alpha=alpha, multiplicity=multiplicity,
                         night_prior=prior,
                         state_tolerance=tolerance, old_name=old_name, new_name=new_name,
                         datasets=(old_raw.get("datasets") or {}, new_raw.get("datasets") or {}), rule=rule)
        started = old.started
    if args.json:
        print(json.dumps(to_json(result), indent=1, default=str))
    else:
        print(f"specdec compare: {old_name} ({started}) → {new_name} ({new.started}); OLD's runs are the "
              f"baseline; thresholds of profile {profile}")
        print()
        print("\n".join(table_lines(result, shown=args.all)))
        print("\n".join(summary_lines(result, old_name, new_name)))
    return REGRESSED if result.failed() or result.failed_sweeps else OK


def compare_ab_files(args: argparse.Namespace, old: Results | None, new: Results) -> int:
    """`compare` of an A/B session's results (`app.ab_compare`): NEW's A/B tests judged again candidate vs base,
    beside OLD's when OLD is an A/B session's results too (`output.ab_results` renders them); exit 1 where the plugin
    fails a test."""
    from pytest_specdec.app.ab_compare import compare_ab, is_ab
    from pytest_specdec.app.compare import session_rule
    from pytest_specdec.errors import ConfigError
    from pytest_specdec.gate.thresholds import parse_threshold_items
    from pytest_specdec.output.ab_results import ab_summary_lines, ab_table_lines, ab_to_json
    from pytest_specdec.output.compare import names
    from pytest_specdec.output.schema import ResultsError

    if args.old is not None and args.old.is_dir():
        raise InputError(f"{args.new}: an A/B session's results (candidate vs base, no stored night) cannot be judged "
                         f"against the baselines in {args.old}; compare it with another A/B session's results, or "
                         "alone (`pytest-specdec compare NEW.json`) to judge it again")
    if old is not None and not (is_ab(old) and is_ab(new)):
        nightly, ab = (args.old, args.new) if is_ab(new) else (args.new, args.old)
        raise InputError(f"{ab} is an A/B session's results and {nightly} is not: compare two A/B sessions' results, "
                         f"or {ab} alone to judge it again")
    try:
        override = parse_threshold_items(args.threshold, "--threshold")
    except ConfigError as exc:
        raise InputError(str(exc)) from None
    settings = new.gate.settings
    alpha = args.alpha if args.alpha is not None else float(settings.get("alpha", 0.05))
    multiplicity = args.multiplicity or str(settings.get("multiplicity", "bh"))
    old_name, new_name = names((args.old, args.new)) if args.old is not None else ("OLD", str(args.new))
    try:
        result = compare_ab(old, new, override=override, alpha=alpha, multiplicity=multiplicity, old_name=old_name,
                            new_name=new_name, rule=session_rule(new, fail_inconclusive=args.fail_inconclusive))
    except ResultsError as exc:
        raise InputError(str(exc)) from None
    if args.json:
        print(json.dumps(ab_to_json(result), indent=1, default=str))
    else:
        against = f"{old_name} ({old.started}) → " if old is not None else ""
        print(f"specdec compare: A/B results: {against}{new_name} ({new.started}); each test's candidate against "
              "the base measured beside it")
        print()
        print("\n".join(ab_table_lines(result, old_name, new_name)))
        print("\n".join(ab_summary_lines(result, new_name)))
    return REGRESSED if result.failed() else OK


def cmd_merge(args: argparse.Namespace) -> int:
    """`pytest-specdec merge`: one night's shards as one results file, JUnit file and HTML report (`app.merge`)."""
    from pytest_specdec.app.merge import MergeError, expected_ids, merge, outcome_counts
    from pytest_specdec.files import write_atomic
    from pytest_specdec.output.junit import junit_xml
    from pytest_specdec.output.results import INSUFFICIENT_DATA, Shard, write_report
    from pytest_specdec.output.schema import ResultsError, load, render_results

    shards = []
    for path in args.shards:
        data, results = read_results(path)
        shards.append(Shard(path, data, results))
    expected = None
    if args.expect is not None:
        try:
            expected = expected_ids(args.expect.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"--expect {args.expect}: cannot be read ({exc})") from None
        if not expected:
            raise InputError(f"--expect {args.expect}: no test ids in it (one `path::test[id]` a line, as "
                             "`pytest --co -q` or the plugin's dry run prints them)")
    try:
        merged = merge(shards, expected)
    except MergeError as exc:
        raise InputError(str(exc)) from None
    out = args.output
    junit = args.junit or out.with_suffix(".junit.xml")
    html = args.html or out.with_suffix(".html")
    written = {p.resolve() for p in (out, junit, html)}
    if len(written) < 3 or written & {p.resolve() for p in args.shards}:
        raise InputError(f"-o {out}, --junit {junit} and --html {html} must be three files, none of them a shard")
    text = render_results(merged.data)
    try:
        results = load(merged.data, str(out))  # what every reader will read: read it before writing it
    except ResultsError as exc:
        raise InputError(f"the merged night cannot be read back ({exc}); a shard's file is likely broken") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, text)
    junit.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(junit, junit_xml(results, suite=f"pytest-specdec merge of {len(shards)} shards",
                                  skipped_outcomes=(INSUFFICIENT_DATA,) if args.allow_missing else ()))
    html.parent.mkdir(parents=True, exist_ok=True)
    write_report(json.loads(text), out.parent, 0.0, html)
    name = {"bh": "Benjamini-Hochberg", "holm": "Holm"}.get(merged.multiplicity, merged.multiplicity)
    counts = ", ".join(f"{n} {word}" for word, n in sorted(outcome_counts(merged.data["tests"]).items()))
    print(f"specdec merge: {len(shards)} shard(s), {len(merged.data['tests'])} test(s) ({counts}); {name} at alpha "
          f"{merged.alpha:g} over the {merged.family} gated p-value(s) of every shard together")
    for nodeid, before, after in merged.changed:
        print(f"specdec merge: {nodeid}: {before} in its shard, {after} once the night's family is adjusted together")
    for nodeid in merged.failed:
        print(f"specdec merge: failed: {nodeid}")
    for sweep in merged.failed_sweeps:
        print(f"specdec merge: sweep failed: {sweep}")
    for line in merged.errors:
        print(f"specdec merge: error: {line}")
    for path in merged.machine_failed:
        print(f"specdec merge: machine factor beyond its threshold (--specdec-fail-machine): {path}")
    for nodeid in merged.missing:
        print(f"specdec merge: insufficient-data: {nodeid}: expected (--expect {args.expect}) but in no shard")
    if merged.missing:
        print(f"specdec merge: {len(merged.missing)} expected test(s) in no shard"
              + (" (--allow-missing: not failed)" if args.allow_missing else
                 "; a shard never ran or never uploaded its results (--allow-missing to accept)"))
    if expected is not None:
        extra = [t["nodeid"] for t in merged.data["tests"] if t["nodeid"] not in set(expected)]
        if extra:
            print(f"specdec merge: {len(extra)} test(s) in the shards but not in --expect {args.expect}: "
                  + ", ".join(extra))
    print(f"specdec merge: wrote {out}, {junit}, {html}")
    return REGRESSED if merged.fails or (merged.missing and not args.allow_missing) else OK


def history_nights(sources: Sequence[Path]) -> tuple[list[NightFile], list[tuple[Path, str]]]:
    """The results files of ``sources`` read, and the files of its directories skipped with why. A session's
    reports/ holds other JSON beside its results (the saved outputs, a pytest-benchmark file), so a
    directory's *.json that is no results file (`not_results`) is skipped; a file named on the command
    line is meant as one, and is an error otherwise, as a broken results file in a directory is."""
    from pytest_specdec.output.history import NightFile

    nights: list[NightFile] = []
    skipped: list[tuple[Path, str]] = []
    for src in sources:
        if src.is_dir():
            found = sorted(src.glob("*.json"))
            before = len(nights)
            for path in found:
                data = None if path.name.endswith(OUTPUTS_SUFFIX) else read_json(path)
                why = not_results(path, data)
                if why:
                    skipped.append((path, why))
                else:
                    nights.append(NightFile(path, read_results(path, data)[1]))
            if len(nights) == before:
                raise InputError(f"{src}: a directory without results files (*.json"
                                 + (f"; {len(found)} other JSON file(s) skipped" if found else "") + ")")
        elif src.exists():
            nights.append(NightFile(src, read_results(src)[1]))
        else:
            raise InputError(f"{src}: no such file or directory")
    return nights, skipped


def cmd_history(args: argparse.Namespace) -> int:
    from pytest_specdec.app.history import order, series
    from pytest_specdec.output.history import render_html, rule, table_lines, to_json

    nights_read, skipped = history_nights(args.sources)
    for path, why in skipped:
        print(f"specdec history: {path} skipped: {why}", file=sys.stderr)
    if skipped:
        print(f"specdec history: {len(skipped)} JSON file(s) skipped, not results files", file=sys.stderr)
    nights, dupes = order(nights_read)
    rows = series(nights, alpha=args.alpha, per_series=args.per_series)
    how = rule(args.alpha, args.per_series, rows)
    if args.html:
        args.html.parent.mkdir(parents=True, exist_ok=True)
        args.html.write_text(render_html(nights, rows, dupes, how), encoding="utf-8")
    if args.json:
        print(json.dumps(to_json(nights, rows, dupes, skipped), indent=1))
    else:
        print("\n".join(table_lines(nights, rows)))
        for dupe, kept in dupes:
            print(f"specdec history: {dupe.path} left out: the same session ({dupe.started}) as {kept.path}")
        changed = sorted({s.name for s in rows if s.change_nights})
        print(f"specdec history: {how}")
        print(f"specdec history: {len(nights)} night(s), {len({s.nodeid for s in rows})} test(s); "
              f"{len(changed)} with a change point" + (": " + ", ".join(changed) if changed else ""))
    if args.html:
        print(f"specdec history: HTML written to {args.html.resolve().as_uri()}", file=sys.stderr)
    return OK


def cmd_convert_schema(args: argparse.Namespace) -> int:
    from pytest_specdec.output.convert import convert_paths

    for line in convert_paths(args.paths):
        print(line, flush=True)
    return OK


def cmd_report(args: argparse.Namespace) -> int:
    from pytest_specdec.output.report import render

    _, results = read_results(args.file)
    out = args.output or args.file.with_suffix(".html")
    if out.resolve() == args.file.resolve():
        raise InputError(f"-o {out}: that is the results file itself; name an .html file")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(results), encoding="utf-8")
    print(f"specdec report: {out.resolve().as_uri()}")
    return OK


def profile_state_tolerance(name: str, results: Results) -> float | None:
    """The profile's machine-state tolerance, which groups a calibration's sessions of one state (never a
    calibration's own): as the session recorded it where it was the profile's, else from the profile by name."""
    from pytest_specdec.gate.machine import StateTolerance

    recorded = results.gate.settings.get("machine_state_tolerance")
    if recorded is not None:
        tol = StateTolerance.from_setting(recorded, f"{name}: gate.settings")
        if tol.profiles:
            return tol.ratio
    return profile_of(results.profile, f"{name}: `profile`").machine_state_tolerance if results.profile else None


def cmd_calibrate(args: argparse.Namespace) -> int:
    """`pytest-specdec calibrate`: sessions of one machine and profile in, its calibration record out."""
    from pytest_specdec.app.calibrate import of_results
    from pytest_specdec.files import write_atomic
    from pytest_specdec.gate.calibration import CALIBRATION_FILE, calibration_path, summary_lines

    read = [(str(path), read_results(path)[1]) for path in args.files]
    record, profile, hardware = of_results(read, profile_state_tolerance(*read[-1]))
    settings = read[-1][1].gate.settings
    record = {**record, "profile": profile, "hardware": hardware,
              "command": "pytest-specdec calibrate " + " ".join(str(p) for p in args.files)}
    root = args.baselines or Path((settings.get("hardware") or {}).get("root") or "baselines")
    path = calibration_path(root, profile, hardware)
    if args.json:
        print(json.dumps(record, indent=1, sort_keys=True))
    else:
        print("\n".join(summary_lines(record, str(path))))
    if args.write:
        from filelock import FileLock

        root.mkdir(parents=True, exist_ok=True)
        with FileLock(str(root / ".specdec-baselines.lock"), timeout=600):
            write_atomic(path, CALIBRATION_FILE.render(record))
        print(f"specdec calibration: wrote {path}", file=sys.stderr)
    else:
        print(f"specdec calibration: nothing written (--write keeps it at {path})", file=sys.stderr)
    return 0


def parser() -> argparse.ArgumentParser:
    from pytest_specdec.option_values import alpha_value, renamed

    ap = argparse.ArgumentParser(
        prog="pytest-specdec",
        description="Read pytest-specdec results files outside pytest: compare two, trend many, re-render one, "
                    "convert older ones.",
        epilog="Exit status: 0 fine, 1 a gated regression or a dead arm (compare, merge) or an expected test in no "
               "shard (merge), 2 bad input. "
               "docs/cli.md has more.")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND", required=True)

    c = sub.add_parser("compare", help="the plugin's verdicts of NEW against OLD's runs",
                       description="Judge each test of NEW against OLD's runs as the plugin judges a night against "
                                   "a baseline of one session (the same verdict functions, the machine factor, "
                                   "BH or Holm over the gated family). Exit 1 when a gated metric of a test "
                                   "that did not opt out (check=False) regressed, or a test of NEW has an arm "
                                   "without a valid run.")
    c.add_argument("old", type=Path, metavar="OLD",
                   help="the earlier results file (its runs are the baseline), or a baselines directory (the root "
                        "or baselines/<profile>): NEW is then judged exactly as the plugin judged its session")
    c.add_argument("new", type=Path, metavar="NEW.json", nargs="?",
                   help="the later results file: judged against OLD. An A/B session's results are judged again "
                        "candidate vs base, beside OLD's when OLD is an A/B session's too, or alone (one file)")
    c.add_argument("--profile", metavar="NAME|PATH",
                   help="profile whose [verdicts] thresholds apply (default: the one NEW recorded)")
    c.add_argument("--threshold", action="append", default=[], metavar="METRIC=VALUE",
                   help="practical threshold, repeatable, as --specdec-threshold (e.g. speedup=10)")
    c.add_argument("--alpha", type=alpha_value, default=None,
                   help="one-sided level (default: NEW's session's, else 0.05; CIs are 1 - 2 alpha)")
    c.add_argument("--multiplicity", dest="multiplicity", choices=("bh", "holm"), default=None,
                   help="multiplicity adjustment over the gated family: bh (the false discovery rate) or holm (the "
                        "family-wise error rate) (default: NEW's session's, else bh)")
    c.add_argument("--fdr", choices=("bh", "holm"), action=renamed("--multiplicity", "multiplicity"),
                   help="deprecated spelling of --multiplicity, removed in the next release")
    c.add_argument("--all", action="store_true", help="show every metric's verdict, not only the gated ones")
    c.add_argument("--strict", action="store_true", help="exit 1 also when a test is not comparable")
    c.add_argument("--fail-inconclusive", action="store_true",
                   help="exit 1 also for a gated verdict (or gated drift) still inconclusive, as "
                        "--specdec-fail-inconclusive fails the test (default: as NEW's session ran)")
    c.add_argument("--json", action="store_true", help="print the comparison as JSON instead of tables")
    c.set_defaults(run=cmd_compare)

    m = sub.add_parser("merge", help="one night's shards as one results file, JUnit file and HTML report",
                       description="Each SHARD.json is a session's results (--specdec-json) that ran part of the "
                                   "suite on its own machine. The merged night redoes the session's BH/Holm "
                                   "adjustment over every shard's verdicts together (the level and rule the shards "
                                   "recorded), so the night's false-alarm rate is the suite's; each test's outcome "
                                   "follows from its merged verdicts by the plugin's failure rule. Shards of another "
                                   "profile, hardware, vLLM, plugin version or gate setting, or a test in two "
                                   "shards, are refused (exit 2). Exit 1 where a test fails, or an expected test is "
                                   "in no shard.")
    m.add_argument("shards", type=Path, nargs="+", metavar="SHARD.json", help="each shard's results file")
    m.add_argument("--expect", type=Path, metavar="FILE",
                   help="the test ids the night should hold, one a line: the output of `pytest --co -q` or of the "
                        "plugin's dry run; a test in no shard is insufficient-data and fails the merge")
    m.add_argument("--allow-missing", action="store_true",
                   help="an expected test in no shard is still insufficient-data in the file, but does not fail")
    m.add_argument("-o", "--output", type=Path, default=Path("reports/specdec-merged.json"), metavar="OUT.json",
                   help="the merged results file (default: reports/specdec-merged.json)")
    m.add_argument("--junit", type=Path, default=None, metavar="OUT.xml",
                   help="the JUnit XML file (default: OUT.junit.xml beside the results)")
    m.add_argument("--html", type=Path, default=None, metavar="OUT.html",
                   help="the HTML report (default: OUT.html beside the results)")
    m.set_defaults(run=cmd_merge)

    h = sub.add_parser("history", help="per test and gated metric, the series across nights and its change points",
                       description="One results file is one night, ordered by its recorded session start. Per test "
                                   "and gated metric: the nightly levels and the change points found by PELT "
                                   "(ruptures), each confirmed by a t-test against its neighbours, Benjamini-Hochberg "
                                   "over every series.")
    h.add_argument("sources", type=Path, nargs="+", metavar="DIR|FILE",
                   help="results files, or directories of them: a directory's other JSON (no top-level "
                        "`schema`, or a *.outputs.json side file) is skipped and counted")
    h.add_argument("--alpha", type=alpha_value, default=0.05,
                   help="false-discovery rate of the change points over all series (Benjamini-Hochberg; default 0.05)")
    h.add_argument("--per-series", action="store_true",
                   help="judge each series at --alpha alone, without the adjustment over all series (more power, "
                        "and about alpha x series false change points per history)")
    h.add_argument("--json", action="store_true", help="print the history as JSON instead of a table")
    h.add_argument("--html", type=Path, metavar="FILE", help="also write a self-contained HTML page with the charts")
    h.set_defaults(run=cmd_history)

    k = sub.add_parser("calibrate", help="this host's noise from several sessions of the same tests",
                       description="Each results file is one session of the same tests on this machine and profile, "
                                   "standing in for a night. Per metric: the run-to-run sd and the night-to-night sd "
                                   "beyond it (pooled over the tests), what a lone test then catches, the machine "
                                   "probe's repeatability and how the reference's speed follows it. With --write the "
                                   "record goes beside the machine's baselines, and the gate blends its night sds "
                                   "into the profile's night_prior (docs/gate.md).")
    k.add_argument("files", type=Path, nargs="+", metavar="FILE.json", help="two or more results files")
    k.add_argument("--write", action="store_true",
                   help="write the record to <baselines>/<profile>/<hardware>/host.calibration (nothing is written "
                        "without it)")
    k.add_argument("--baselines", type=Path, default=None, metavar="DIR",
                   help="the baselines root (default: the one the sessions recorded, relative to the current "
                        "directory)")
    k.add_argument("--json", action="store_true", help="print the record as JSON instead of lines")
    k.set_defaults(run=cmd_calibrate)

    r = sub.add_parser("report", help="re-render the HTML report from a results file",
                       description="The session's HTML report again, from its results JSON (older schemas too).")
    r.add_argument("file", type=Path, metavar="FILE.json", help="a results file")
    r.add_argument("-o", "--output", type=Path, metavar="OUT.html", help="where to write it (default: FILE.html)")
    r.set_defaults(run=cmd_report)

    v = sub.add_parser("convert-schema", help="bring the plugin's files (baselines, crossover, results and calibration "
                                              "records) of an older schema to the current one",
                       description="Converts each file in place, keeping every night, test and run; a file of the "
                                   "current schema is left as it is, other JSON is named and skipped. Each converted "
                                   "file is read back by the plugin's reader before it is written.")
    v.add_argument("paths", nargs="+", type=Path, metavar="PATH", help="the plugin's files, or directories of "
                                                                       "them (searched for *.json, *.crossover and "
                                                                       "*.calibration)")
    v.set_defaults(run=cmd_convert_schema)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    from pytest_specdec.option_values import RENAMED_DEST

    args = parser().parse_args(argv)
    for used, new in dict.fromkeys(getattr(args, RENAMED_DEST, None) or []):
        warnings.warn(SpecDecDeprecationWarning(f"{used} is deprecated and goes in the next release: use {new}"),
                      stacklevel=2)
    try:
        return int(args.run(args))
    except BrokenPipeError:  # `| head` stopped reading: the shell's status for a closed pipe, no traceback
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13
    except SpecDecError as exc:
        print(f"pytest-specdec {args.command}: error: {exc}", file=sys.stderr)
        return BAD_INPUT
    except OSError as exc:
        print(f"pytest-specdec {args.command}: error: {exc}", file=sys.stderr)
        return BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
