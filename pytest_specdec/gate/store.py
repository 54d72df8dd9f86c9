"""Writing baselines: ``--update-baselines`` queues each test's night, and the session's end writes them all
at once on the controller, under a file lock, each file by atomic rename (what a file holds and how it is
read: `baselines.py`). A file that cannot be written is listed, never half-written, and the rest go on.

A store is one machine's: it reads and writes ``<root>/<profile>/<hardware>/`` only, so another machine's
nights beside them are never read as this one's, nor touched by its writes (`Hardware` says which folders
there are).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_specdec.files import write_atomic
from pytest_specdec.gate.baselines import (
    BaselineError,
    OlderBaseline,
    baseline_path,
    baseline_text,
    crossover_text,
    diff,
    hardware_key,
    hardware_label,
    identity_differences,
    load,
    metric_values,
    relative,
    safe_part,
)

#: The command that moves baseline files of the layout without a hardware folder into theirs: a one-off migration
#: (it `git mv`s tracked files), kept in the project's checkout, not in the package.
MOVE = "python -m scripts.hardware_layout"

#: Why a baseline file of the session's modules is listed as unused, in the terminal and the report alike: a test
#: deselected (-k) or stopped before its verdict did not read it either, hence "if the test is gone".
UNUSED_REASON = "no test of this session read it; delete it if the test is gone"


@dataclass
class Pending:
    """One write queued for the end of the session."""

    nodeid: str
    path: Path
    comparability: dict[str, Any]
    under_test: dict[str, Any]
    session: dict[str, Any]
    accepted_change: str = ""  # non-empty: tonight differs from the file (e.g. "speedup regressed"): start afresh


@dataclass
class WriteSummary:
    """What ``--update-baselines`` did, for the terminal summary."""

    created: list[Path] = field(default_factory=list)
    updated: list[tuple[Path, str]] = field(default_factory=list)  # (path, "old → new" headline)
    unchanged: list[tuple[Path, str]] = field(default_factory=list)  # (path, why not written)
    unused: list[Path] = field(default_factory=list)
    #: (path, what kept it unwritten: an OS error, or a file of an older schema, never replaced)
    failed: list[tuple[Path, str]] = field(default_factory=list)
    older: set[Path] = field(default_factory=set)  # of `failed`, the files of an older schema
    folder: str = ""  # the machine's folder the files were written to, and its name, for the first line

    def lines(self, root: Path) -> list[str]:
        def rel(p: Path) -> str:
            return relative(p, root)

        out = [f"specdec baselines ({self.folder or root}): {len(self.created)} created, {len(self.updated)} updated, "
               f"{len(self.unchanged)} unchanged, {len(self.unused)} unused"
               + (f", {len(self.failed)} NOT WRITTEN" if self.failed else "")]
        if self.failed:  # one line the session's end shows first, then each file
            fix = ("Convert it, then run again" if self.failed[0][0] in self.older else
                   "Make the directory writable or point --specdec-baselines elsewhere")
            out.insert(0, f"specdec: could not write {len(self.failed)} baseline file(s) under {root}: "
                          f"{self.failed[0][1]}; no stored file was changed by a failed write. {fix}")
        out += [f"  NOT WRITTEN {rel(p)}: {why}" for p, why in self.failed]
        out += [f"  created   {rel(p)}" for p in self.created]
        out += [f"  updated   {rel(p)}: {what}" for p, what in self.updated]
        out += [f"  unchanged {rel(p)}: {why}" for p, why in self.unchanged]
        out += [f"  unused    {rel(p)} ({UNUSED_REASON})" for p in self.unused]
        return out


def _machine_of(files: list[Path], identity: Any) -> tuple[str, tuple[str, ...]]:
    """A folder's machine as the words name it, and how its identity differs from ``identity`` (this
    machine's), from the first of its files that can be read (("", ()) when none can)."""
    for f in files:
        try:
            data = load(f, "pytest --update-baselines")
        except BaselineError:
            continue
        if data is not None:
            comp = data["comparability"]
            return hardware_label(comp), tuple(identity_differences(identity, comp.get("identity")))
    return "", ()


def headline(entry: dict[str, Any]) -> dict[str, float]:
    """Geometric means of the headline metrics of one session (for the old → new summary)."""
    from pytest_specdec.measure.figures import geomean

    vals = metric_values(entry)
    means = {name: geomean(vals.get(name, [])) for name in ("speedup", "output_tok_s", "reference_tok_s",
                                                            "acceptance_rate")}
    return {name: m for name, m in means.items() if m is not None}


def _headline_change(old: dict[str, Any] | None, new: dict[str, Any]) -> str:
    a = headline(old) if old else {}
    b = headline(new)
    parts = []
    for name, nv in b.items():
        ov = a.get(name)
        parts.append(f"{name} {'—' if ov is None else f'{ov:.4g}'} → {nv:.4g}")
    return ", ".join(parts) or "no valid values"


@dataclass(frozen=True)
class Machine:
    """One machine's baselines of a profile: its folder (a `hardware_key`), its name as the words give it,
    and how many files it holds."""

    key: str
    name: str
    files: int
    #: How this machine's identity differs from the session's machine (another machine's folder only).
    differs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Hardware:
    """Which machine a session's baselines are read from and written to (``this``), and every other
    machine with baselines of the same profile (``others``): what the session says once when this machine
    has none of its own."""

    profile: str
    this: Machine
    others: tuple[Machine, ...] = ()
    root: str = "baselines"  # the baselines' root, as the checkout names it

    @property
    def without_own(self) -> bool:
        """This machine has no baseline of the profile while another machine has: no test can be judged."""
        return self.this.files == 0 and bool(self.others)


def stale_layout(root: Path, profile: str) -> list[Path]:
    """The suite folders of ``<root>/<profile>/`` that hold baseline files directly (the layout without a
    hardware folder): never read as any machine's, and named in an error with `MOVE`."""
    base = root / safe_part(profile)
    return sorted(d for d in base.iterdir() if d.is_dir() and any(d.glob("*.json"))) if base.is_dir() else []


class BaselineStore:
    """Reads one machine's baselines of one profile and queues writes; ``flush`` writes them (controller only).

    ``fingerprint`` is the machine's part of a comparability record (hardware, device, device_count): its
    `hardware_key` names the folder this store reads and writes, and nothing outside it."""

    def __init__(self, root: Path, profile: str, fingerprint: dict[str, Any], *, mode: str | None,
                 keep: int) -> None:
        self.root = root
        self.profile = profile
        self.fingerprint = fingerprint
        self.hardware = hardware_key(fingerprint)
        self.mode = mode
        self.keep = keep
        self.pending: dict[Path, Pending] = {}
        self.used: set[Path] = set()
        self.modules: set[Path] = set()

    @property
    def base(self) -> Path:
        """This machine's folder: ``<root>/<profile>/<hardware>``."""
        return self.root / safe_part(self.profile) / safe_part(self.hardware)

    def path(self, nodeid: str) -> Path:
        return baseline_path(self.root, self.profile, self.hardware, nodeid)

    def read(self, nodeid: str, create_hint: str) -> tuple[Path, dict[str, Any] | None]:
        path = self.path(nodeid)
        self.used.add(path)
        self.modules.add(path.parent)
        stale = stale_layout(self.root, self.profile)
        if stale:
            raise BaselineError(f"{relative(stale[0], self.root)} holds baseline files with no hardware folder "
                                f"({len(stale)} such folder(s) under {self.root / safe_part(self.profile)}); move "
                                f"them into their machine's folder, keeping their nights, with `{MOVE} {self.root}` "
                                "from the root of a checkout of pytest-specdec")
        return path, load(path, create_hint)

    def portable(self, nodeid: str, comparability: dict[str, Any], machines: list[str]
                 ) -> tuple[dict[str, Any], tuple[str, ...]] | None:
        """Where this machine has no baseline of ``nodeid``: the other ``machines``' files of it (their folder keys)
        whose software conditions are tonight's (every comparability field but the machine's: models by content
        hash, dataset, workload, sampling, server args, speculation, engine mode), their nights pooled into one
        baseline, and which machines gave them; None when none does. Only read, never written: the portable metrics
        are judged against them (`verdicts.evaluate`), the speed metrics are not."""
        sessions: list[Any] = []
        first: dict[str, Any] | None = None
        used: list[str] = []
        for key in machines:
            try:
                data = load(baseline_path(self.root, self.profile, key, nodeid), "")
            except BaselineError:
                continue  # another machine's unreadable file judges nothing here; its own sessions say so
            if data is None or not isinstance(data.get("comparability"), dict):
                continue
            theirs = {k: v for k, v in data["comparability"].items() if k not in self.fingerprint}
            if diff(theirs, {k: v for k, v in comparability.items() if k not in self.fingerprint}):
                continue
            first = first or data
            sessions += data["sessions"]
            used.append(key)
        return None if first is None else ({**first, "sessions": sessions}, tuple(used))

    def all_files(self) -> list[Path]:
        return sorted(self.base.rglob("*.json")) if self.base.is_dir() else []

    def machines(self) -> Hardware:
        """This machine's folder and every other machine's folder of the profile, each named from one of
        its readable files (the folder's name when none is readable)."""
        this = Machine(self.hardware, hardware_label(self.fingerprint), len(self.all_files()))
        others = []
        base = self.root / safe_part(self.profile)
        for folder in sorted(base.iterdir()) if base.is_dir() else []:
            files = sorted(folder.rglob("*.json")) if folder.is_dir() and folder.name != this.key else []
            if not files or folder in stale_layout(self.root, self.profile):
                continue
            name, differs = _machine_of(files, self.fingerprint.get("identity"))
            others.append(Machine(folder.name, name or folder.name, len(files), differs))
        return Hardware(self.profile, this, tuple(others), str(self.root))

    def readable(self) -> list[dict[str, Any]]:
        """Every readable stored file of the profile, parsed: what the gate learns its nights from. A broken
        file is its own test's error, never the others'."""
        datas = []
        for f in self.all_files():
            try:
                data = load(f, "pytest --update-baselines")
            except BaselineError:
                continue
            if data is not None:
                datas.append(data)
        return datas

    def queue(self, item: Pending) -> None:
        if item.path in self.pending:
            raise BaselineError(f"two tests map to the same baseline file {item.path}: "
                                f"{self.pending[item.path].nodeid} and {item.nodeid}; rename one of them")
        self.pending[item.path] = item

    def flush(self) -> WriteSummary:
        """Write every queued baseline under one lock, each by atomic rename; list what happened."""
        from filelock import FileLock

        summary = WriteSummary(folder=f"{relative(self.base, self.root.parent)}, {hardware_label(self.fingerprint)}")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with FileLock(str(self.root / ".specdec-baselines.lock"), timeout=600):
                self._write_all(summary)
        except OSError as exc:  # no lock (a read-only or missing directory): nothing was written
            done = {*summary.created, *(p for p, _ in summary.updated), *(p for p, _ in summary.unchanged),
                    *(p for p, _ in summary.failed)}
            summary.failed += [(p, str(exc)) for p in sorted(self.pending) if p not in done]
        written = set(self.pending)
        for module in sorted(self.modules):
            for f in sorted(module.glob("*.json")) if module.is_dir() else []:
                if f not in self.used and f not in written:
                    summary.unused.append(f)
        return summary

    def _write_all(self, summary: WriteSummary) -> None:
        """Each queued file (under the lock): a file that cannot be written is listed and the rest go on."""
        for path in sorted(self.pending):
            item = self.pending[path]
            try:
                old = load(path, "pytest --update-baselines")
            except OlderBaseline as exc:  # its nights are kept: converted, not replaced
                summary.failed.append((path, str(exc)))
                summary.older.add(path)
                continue
            except BaselineError as exc:
                old = None
                summary.updated.append((path, f"replaced an unreadable file ({exc})"))
            if old is not None and self.mode == "missing":
                summary.unchanged.append((path, "exists (--update-baselines=missing writes only missing files)"))
                continue
            sessions: list[dict[str, Any]] = []
            note = ""
            if old is not None:
                changed = diff(old["comparability"], item.comparability)
                if changed:
                    note = (f" (replaced {len(old['sessions'])} non-comparable session(s): "
                            + ", ".join(changed) + ")")
                elif item.accepted_change:
                    note = (f" (accepted a change, {item.accepted_change}: the {len(old['sessions'])} older "
                            "session(s) measured the old state and were dropped)")
                else:
                    sessions = list(old["sessions"])
            sessions.append(item.session)
            dropped = max(0, len(sessions) - self.keep)
            sessions = sessions[-self.keep:]
            text = baseline_text(item.nodeid, self.profile, item.comparability, item.under_test, sessions)
            try:
                write_atomic(path, text)
            except OSError as exc:
                summary.updated[:] = [(p, what) for p, what in summary.updated if p != path]
                summary.failed.append((path, str(exc)))
                continue
            if old is None and not any(p == path for p, _ in summary.updated):
                summary.created.append(path)
            elif old is not None:
                last = old["sessions"][-1] if old["sessions"] else None
                kept = f"; {len(sessions)} session(s) kept" + (f", {dropped} oldest dropped" if dropped else "")
                summary.updated.append((path, _headline_change(last, item.session) + kept + note))



def write_sweep(root: Path, path: Path, record: dict[str, Any], night: dict[str, Any], *, keep: int,
                missing_only: bool) -> str:
    """Append tonight's night to a sweep's crossover record (`baselines.sweep_path`), keeping the last ``keep``;
    returns what happened ("created", "updated", or why it was left as it is). Under the baselines' lock (``root``'s),
    by atomic rename, like the tests' files; an OSError is the caller's to list."""
    from filelock import FileLock

    from pytest_specdec.gate.baselines import load_sweep

    try:
        old = load_sweep(path)
    except BaselineError as exc:
        old, note = None, f" (replaced an unreadable record: {exc})"
    else:
        note = ""
    if old is not None and missing_only:
        return "unchanged: exists (--update-baselines=missing writes only missing files)"
    nights = [*(old["nights"] if old is not None else []), night][-keep:]
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / ".specdec-baselines.lock"), timeout=600):
        write_atomic(path, crossover_text(record, nights))
    return ("updated" if old is not None else "created") + f": {len(nights)} night(s) kept{note}"


@dataclass(frozen=True)
class BaselineWrites:
    """What ``--update-baselines`` did, for the results and the report as well as the terminal: a CI job
    that opens a pull request with the files, or a reviewer of the night, reads it there. Paths are as
    the checkout names them, so they can go to `git add` as they are."""

    root: str  # the baselines' root
    mode: str  # "all" or "missing"
    created: tuple[str, ...] = ()
    updated: tuple[tuple[str, str], ...] = ()  # (path, old → new headline figures, what was kept or dropped)
    unchanged: tuple[tuple[str, str], ...] = ()  # (path, why it was not written)
    unused: tuple[str, ...] = ()  # files of the session's modules that no test of the session read
    not_written: tuple[tuple[str, str], ...] = ()  # (path, why): failed tests, tests without valid runs
