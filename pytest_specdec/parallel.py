"""pytest-xdist: workers measure; the controller alone adjusts p-values over the whole family and writes
the results and baselines.  Each worker sends its records at its session end; the controller merges them."""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_specdec.options import Settings
    from pytest_specdec.session import SpecDecSession, SpecDecWarning


def check_xdist(dist: str, settings: Settings) -> None:
    """Refuse what cannot be measured in parallel, saying how to run it instead."""
    import pytest

    if dist == "each":
        raise pytest.UsageError("pytest-specdec with --dist each would measure every test once per worker; "
                                "use -n N with the default --dist load (or loadscope/loadgroup)")
    if settings.endpoint:
        raise pytest.UsageError("--specdec-endpoint with pytest-xdist (-n): the workers would load the same "
                                "servers at once and their /metrics counters cannot be split per worker; run "
                                "without -n (or -n 0)")
    if settings.dry_run:
        raise pytest.UsageError("--specdec-dry-run starts nothing and prints from collection, which xdist "
                                "workers do not show: run it without -n (or -n 0)")


def worker_output(session: SpecDecSession) -> bytes:
    """What a worker sends the controller at its session end (via `config.workeroutput`).

    Pickled: the records hold dataclasses (results, verdicts) that execnet cannot send as they are;
    both ends run the same plugin code.  The baseline files this worker read go too, so the
    controller's "unused" count sees every worker's tests.
    """
    from pytest_specdec.output.results import server_entries, workarounds

    judge = session._judge
    store = judge.store if judge is not None and judge.opened else None
    pool = session._pool
    return pickle.dumps({
        "worker": session.worker,
        "records": session.records,
        "servers": server_entries(pool.servers if pool else {}, session.worker),
        "starts": pool.starts if pool else [],
        "workarounds": workarounds(pool.servers.values()) if pool else [],
        "used": store.used if store else set(),
        "modules": store.modules if store else set(),
        "lines": session.worker_lines,
    })


def merge_worker(session: SpecDecSession, blob: bytes) -> list[str]:
    """Controller: take a finished worker's records; returns problems to show (never dropped silently)."""
    data = pickle.loads(blob)  # noqa: S301 - sent by our own worker process over xdist's channel
    worker = str(data["worker"])
    problems = list(data["lines"])  # what the worker did for the session (the strays it stopped)
    for nodeid, record in data["records"].items():
        if nodeid in session.records:
            problems.append(f"specdec: {nodeid} was measured by both {session.measured_by[nodeid]} and {worker}; "
                            f"kept {session.measured_by[nodeid]}'s measurement")
            continue
        session.records[nodeid] = record
        session.measured_by[nodeid] = worker
    if data["used"] or data["modules"]:
        session.judge.store.used |= data["used"]
        session.judge.store.modules |= data["modules"]
    session.remote.append({k: data[k] for k in ("worker", "servers", "starts", "workarounds")})
    return problems


def parallel_warning(session: SpecDecSession, workers: int) -> SpecDecWarning | None:
    """Why -n on a cpu-device profile measures badly (a GPU profile leases disjoint GPUs instead)."""
    from pytest_specdec.session import SpecDecWarning

    profile = session.profile
    if profile.device != "cpu":
        return None
    return SpecDecWarning(
        f"pytest-xdist runs {workers} workers on the {profile.name} profile (device cpu): their vLLM "
        "servers and load generators share this host's CPU cores, so every worker's timings disturb the "
        "others' and there are no GPUs to lease apart; use -n on GPU profiles, and keep baselines from "
        "sequential sessions")
