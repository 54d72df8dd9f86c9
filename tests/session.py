"""One plugin session of a pytester project, as the functional tests run it: against servers already running
(endpoint mode: the simulated vLLM's ``FakeServer``/``FakeServerProcess``, or their URLs), or against the servers the
session starts itself (``servers=None``), its reports in ``<project>/reports`` unless told, no cache provider.

What is particular to a test file (its runs, thresholds, the servers' speed before a session) stays in that file,
passed here or set on the servers before the call.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest


@dataclass
class SessionRun:
    """A session's outcome (``result``) and what it wrote to ``reports``, read when first asked for: before the
    next session of the project writes them again."""

    result: pytest.RunResult
    reports: Path

    @cached_property
    def results(self) -> dict[str, Any]:
        """The session's results file (``latest.json``)."""
        return read_results(self.reports)

    @property
    def test(self) -> dict[str, Any]:
        """The results of the session's one test."""
        test: dict[str, Any]
        (test,) = self.results["tests"]
        return test

    @property
    def html(self) -> str:
        """The session's HTML report (``latest.html``)."""
        return (self.reports / "latest.html").read_text()

    def keep(self, path: Path) -> Path:
        """The results file copied to ``path`` (where the next session does not overwrite it)."""
        path.write_text((self.reports / "latest.json").read_text())
        return path


def read_results(reports: Path) -> dict[str, Any]:
    """The results file (``latest.json``) of the last session that wrote its reports to ``reports``."""
    data: dict[str, Any] = json.loads((reports / "latest.json").read_text())
    return data


#: The results file's documentation: every key a session writes at the top, in a test's entry, its `baseline` and
#: `ab` sections and the gate's settings is named there (`undocumented`).
RESULTS_DOC = Path(__file__).resolve().parents[1] / "docs" / "results.md"


def undocumented(results: dict[str, Any]) -> list[str]:
    """The keys of a results file, at the top, in each test's entry, its `baseline` and `ab` sections and
    `gate.settings`, that docs/results.md never names in backticks: a field the writer added and the doc lacks."""
    import re

    named = {word for quoted in re.findall(r"`([^`]+)`", RESULTS_DOC.read_text())
             for word in re.findall(r"[A-Za-z_]\w*", quoted)}
    keys = {("", k) for k in results} | {("gate.settings.", k) for k in (results.get("gate") or {}).get("settings", {})}
    for t in results.get("tests", []):
        keys |= {("tests[].", k) for k in t}
        keys |= {(f"tests[].{section}.", k) for section in ("baseline", "ab") for k in (t.get(section) or {})}
    return sorted(where + k for where, k in keys if k not in named)


def latest(pytester: pytest.Pytester, where: str = "") -> dict[str, Any]:
    """The results file of the project's last session whose reports went to ``<project>/<where>/reports``."""
    return read_results(pytester.path / where / "reports")


def url(server: Any) -> str:
    """A server's base URL: a ``FakeServer``'s or ``FakeServerProcess``'s, or the URL itself."""
    return server if isinstance(server, str) else str(server.base_url)


def specdec_session(pytester: pytest.Pytester, profile: Path | str, servers: Sequence[Any] | None, *extra: str,
                    runs: int | None = None, max_runs: int | None = None, thresholds: Sequence[str] = (),
                    reports: Path | None = None, baselines: Path | None = None,
                    subprocess: bool = False, timeout: float | None = None) -> SessionRun:
    """Run the pytester project's session with ``--specdec-profile=profile``; ``servers``: (spec, reference) for
    ``--specdec-endpoint`` and ``--specdec-reference-endpoint`` (None: the session starts its servers); ``runs``,
    ``max_runs``, each of ``thresholds`` (``METRIC=VALUE``) and ``baselines`` as their options when given; the
    reports under ``reports`` (default ``<project>/reports``); then ``extra``, last, so that it can add to or
    override any of these. ``subprocess``: in a child process (``runpytest_subprocess``, which ``timeout`` bounds),
    where the project's conftest must not outlive the run, or a module must not be imported twice in one process."""
    reports = pytester.path / "reports" if reports is None else reports
    args = [f"--specdec-profile={profile}"]
    if servers is not None:
        spec, ref = servers
        args += [f"--specdec-endpoint={url(spec)}", f"--specdec-reference-endpoint={url(ref)}"]
    args.append(f"--specdec-reports-dir={reports}")
    if baselines is not None:
        args.append(f"--specdec-baselines={baselines}")
    if runs is not None:
        args.append(f"--specdec-runs={runs}")
    if max_runs is not None:
        args.append(f"--specdec-max-runs={max_runs}")
    args += ["-p", "no:cacheprovider", *(f"--specdec-threshold={t}" for t in thresholds), *extra]
    if subprocess:
        return SessionRun(pytester.runpytest_subprocess(*args, timeout=timeout), reports)
    assert timeout is None, "a timeout bounds a subprocess session only"
    return SessionRun(pytester.runpytest(*args), reports)
