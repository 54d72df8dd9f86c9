"""The wait for idle servers before a run (`servers/quiet.py`: its loop on an injected clock, CPU ticks and
request count; the /metrics gauges it reads; the fixed delay counted from the previous run's end), the pool's
choice of whose CPU it watches, and the session's time split (`output/timing.py`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from factories import measured_run, run_metrics

from pytest_specdec.errors import SpecDecError
from pytest_specdec.measure.runner import CaseResult, RunRecord
from pytest_specdec.output.schema import quiet_entry, session_time_entry
from pytest_specdec.output.timing import session_time
from pytest_specdec.servers.quiet import SAMPLE_S, Quiet, idle_delay, wait_idle
from pytest_specdec.vllm.counters import in_flight

HZ = os.sysconf("SC_CLK_TCK")


class Clock:
    """A clock that only `sleep` moves, and CPU ticks that follow a script: per window, cores used."""

    def __init__(self, cores_per_window: list[float], then: float = 0.0) -> None:
        self.t = 100.0
        self.script, self.then = cores_per_window, then
        self.used = 0.0
        self.windows = 0

    def sleep(self, s: float) -> None:
        cores = self.script[self.windows] if self.windows < len(self.script) else self.then
        self.used += cores * HZ * s
        self.windows += 1
        self.t += s

    def ticks(self, pgids: set[int]) -> int:
        return int(self.used + 1e-9)

    def wait(self, **kw: Any) -> Quiet:
        return wait_idle({123}, sleep=self.sleep, clock=lambda: self.t, ticks=self.ticks, **kw)


def test_the_wait_ends_two_quiet_windows_after_the_spin() -> None:
    c = Clock([1.0] * 20)  # vLLM's 1 s spin, one core
    q = c.wait(timeout_s=3.0)
    assert q.quiet and c.windows == 22 and q.waited_s == pytest.approx(22 * SAMPLE_S)
    assert q.cores == 0.0 and q.how == "cpu"


def test_one_quiet_window_amid_a_spin_does_not_end_the_wait() -> None:
    # A spinning server the loaded machine left unscheduled for one window reads 0 cores in it.
    c = Clock([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    q = c.wait(timeout_s=3.0)
    assert q.quiet and c.windows == 8


def test_a_server_still_holding_requests_is_waited_for_and_read_only_when_its_cpu_rests() -> None:
    c = Clock([1.0, 1.0])
    reads: list[float] = []

    def held() -> int:
        reads.append(c.t)
        return 2 if len(reads) <= 2 else 0

    q = c.wait(timeout_s=3.0, requests=held)
    assert q.quiet and q.requests == 0
    # 2 busy windows unread, then read after every 2 quiet windows: held twice, then none
    assert len(reads) == 3 and c.windows == 8


def test_the_wait_gives_up_at_the_timeout_and_says_so() -> None:
    c = Clock([], then=1.0)
    q = c.wait(timeout_s=0.5)
    assert not q.quiet and q.waited_s >= 0.5 and q.cores == pytest.approx(1.0, abs=0.25)
    c = Clock([])
    q = c.wait(timeout_s=0.5, requests=lambda: 1)  # CPU at rest, a request held all along
    assert not q.quiet and q.requests == 1


def test_the_time_since_the_previous_run_ended_is_recorded() -> None:
    c = Clock([1.0] * 4)
    q = c.wait(timeout_s=3.0, ended=99.25)  # the previous run ended 0.75 s before the wait began
    assert q.after_run_s == pytest.approx(0.75) and quiet_entry(q)["after_run_s"] == 0.75
    assert quiet_entry(wait_idle(set(), ended=None)) == {"waited_s": 0.0, "quiet": True, "cores": 0.0, "how": "cpu",
                                                      "requests": None, "after_run_s": None}
    assert wait_idle({1}, timeout_s=0).waited_s == 0.0


def test_the_fixed_delay_counts_from_the_previous_run_end() -> None:
    slept: list[float] = []
    q = idle_delay(1.2, ended=9.5, sleep=slept.append, clock=lambda: 10.0)  # bookkeeping took 0.5 s of it
    assert slept == [pytest.approx(0.7)] and q.waited_s == pytest.approx(0.7) and q.how == "delay"
    assert q.after_run_s == 0.5
    slept.clear()
    assert idle_delay(1.2, ended=5.0, sleep=slept.append, clock=lambda: 10.0).waited_s == 0.0 and slept == []
    assert idle_delay(1.2, sleep=slept.append, clock=lambda: 10.0).waited_s == 1.2 and slept == [1.2]


METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 1.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 500.0
"""


def test_requests_in_flight_are_running_plus_waiting_over_engines() -> None:
    assert in_flight(METRICS) == 6
    assert in_flight(METRICS.replace(" 1.0\n", " 0.0\n").replace(" 2.0\n", " 0.0\n").replace(" 3.0\n", " 0.0\n")) == 0
    with pytest.raises(SpecDecError, match="not Prometheus exposition format"):
        in_flight("vllm:num_requests_running{engine=0 1\n")


def _server(pid: int) -> Any:
    return SimpleNamespace(proc=SimpleNamespace(pid=pid), alive=lambda: True, base_url=f"http://h:{pid}",
                           api_key=f"k{pid}")


def test_the_pool_watches_every_server_but_the_next_runs_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next run's own server may still spin (it is about to work), but its requests are read like the
    others': one that still holds requests is not idle."""
    import pytest_specdec.servers.pool as pool_module
    from pytest_specdec.servers.pool import ServerPool

    seen: dict[str, Any] = {}

    def fake_wait(pgids: set[int], *, requests: Callable[[], int], **kw: Any) -> Quiet:
        seen.update(pgids=pgids, kw=kw)
        requests()
        return Quiet(0.1, True, 0.0)

    monkeypatch.setattr(pool_module, "wait_idle", fake_wait)
    monkeypatch.setattr(pool_module, "requests_held", lambda servers: seen.setdefault("servers", servers) and 0)
    pool = ServerPool(log_dir=None, max_alive=2, startup_timeout_s=1.0)  # type: ignore[arg-type]  # starts no server
    pool._alive.update({"ref": _server(11), "spec": _server(22)})
    pool.wait_quiet(3.0, own="22", ended=5.0)
    assert seen["pgids"] == {11} and seen["kw"] == {"timeout_s": 3.0, "ended": 5.0}
    assert seen["servers"] == [("http://h:11", "k11"), ("http://h:22", "k22")]
    seen.clear()
    pool.wait_quiet(3.0)
    assert seen["pgids"] == {11, 22}


def _run(arm: Any, duration_s: float, waited_s: float | None) -> RunRecord:
    return measured_run(arm, 0, metrics=run_metrics(duration_s=duration_s),
                        settle=None if waited_s is None else Quiet(waited_s, True, 0.0))


def test_the_session_time_split_and_its_efficiency() -> None:
    a = CaseResult(reference_runs=[_run("reference", 2.0, 0.5)], runs=[_run("spec", 1.0, 0.25)], summary=None,
                   speedup_per_pair=[])
    b = CaseResult(reference_runs=[_run("reference", 3.0, None)], runs=[], summary=None, speedup_per_pair=[],
                   base_runs=[_run("base", 4.0, 0.25)])
    t = session_time(20.0, [a, None, b], [3.0, 2.0])
    assert (t.runs_s, t.starts_s, t.waits_s, t.runs, t.efficiency) == (10.0, 5.0, 1.0, 4, 0.5)
    assert session_time_entry(t) == {"wall_s": 20.0, "runs_s": 10.0, "server_starts_s": 5.0, "waits_s": 1.0, "runs": 4,
                           "efficiency": 0.5}
    assert t.line() == ("specdec: wall 20 s: runs 10 s (4 runs), server starts 5 s, waits for idle servers 1 s, "
                        "other 4 s; efficiency (runs / wall) 50%")
    assert session_time(0.0, [], []).efficiency is None
