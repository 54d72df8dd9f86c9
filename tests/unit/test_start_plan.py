"""Which servers start together (profiles/starts.py), where the profile allows it (Placement.start_together, its
[placement] start_together key) and what the dry run's estimate makes of it (output/estimate.py). The starts
themselves: tests/functional/test_start_together.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_specdec.errors import ConfigError
from pytest_specdec.output.estimate import PlannedTest, Timings, estimate
from pytest_specdec.profiles import load_profile, server_spec
from pytest_specdec.profiles.placement import Placement
from pytest_specdec.profiles.starts import StartPlan, lease_apart, lease_fit, plan_start
from pytest_specdec.servers.gpus import memory_fraction


def own_gpus(keys: object) -> bool:
    """`apart` where each server gets GPUs of its own: the group logic alone."""
    return True


def half(*keys: str, share: float = 0.45) -> dict[str, float]:
    return dict.fromkeys(keys, share)


def test_a_tests_two_missing_servers_that_fit_start_together() -> None:
    assert plan_start(["ref", "ngram"], [], [], half("ref", "ngram"), 2, own_gpus) == StartPlan(("ref", "ngram"))


def test_servers_that_would_share_a_gpu_never_start_together() -> None:
    """On an H200 (CUDA vLLM 0.26.0) the zoo's reference and draft_model servers, 0.2 of the GPU each, started at
    once on GPU 0: the second found "No available memory for the cache blocks", as vLLM sizes its KV cache from
    the memory free while it profiles. Room to co-reside is not room to start at once."""
    need = {"ref": (1, 0.2), "spec": (1, 0.2), "next": (1, 0.2)}
    one = ("0",)
    assert lease_fit(need, one)(["ref", "spec"])  # they co-reside ...
    assert not lease_apart(need, one)(["ref", "spec"])  # ... but share the GPU
    assert plan_start(["ref", "spec"], [], [], lease_fit(need, one), 3, lease_apart(need, one)) is None
    # the fractions alone (GPUs not known): one set of GPUs, nothing starts at once
    assert plan_start(["ref", "spec"], [], [], half("ref", "spec", share=0.2), 3) is None
    # on 8 GPUs the leases put a process's servers together where they fit (co-residence first): still one GPU
    eight = tuple("01234567")
    assert plan_start(["ref", "spec"], [], [], lease_fit(need, eight), 3, lease_apart(need, eight)) is None
    # a server already alive on the GPU is no neighbour that allocates: the one missing starts as ever, alone
    assert plan_start(["ref", "spec"], ["next"], ["ref"], lease_fit(need, one), 3, lease_apart(need, one)) is None


@pytest.mark.parametrize(("now", "fraction", "max_alive", "alive"), [
    (["ref", "ngram"], half("ref", "ngram", share=0.6), 2, []),  # 1.2 of the GPU: they cannot co-reside
    (["ref", "ngram"], half("ref", "ngram"), 1, []),  # the cap keeps one alive
    (["ref", "ngram"], half("ref", "ngram"), 2, ["ref"]),  # one to start: nothing to overlap
    (["ref", "ngram"], half("ref", "ngram"), 2, ["ngram", "ref"]),  # nothing to start
    (["ref", "base", "cand"], half("ref", "base", "cand"), 3, []),  # an A/B test's three do not fit: one at a time
])
def test_one_at_a_time_where_they_do_not_fit_or_nothing_overlaps(now: list[str], fraction: dict[str, float],
                                                                  max_alive: int, alive: list[str]) -> None:
    assert plan_start(now, [], alive, fraction, max_alive, own_gpus) is None


def test_the_next_tests_servers_join_in_run_order_while_they_fit() -> None:
    share = half("ref", "a", "b", "c", "d", share=0.2)
    # 0.2 each: five fit (1.0 exactly, despite binary fractions); a cap of 4 stops at c
    assert plan_start(["ref", "a"], ["ref", "b", "c", "d"], [], share, 5, own_gpus) == StartPlan(
        ("ref", "a", "b", "c", "d"))
    assert plan_start(["ref", "a"], ["ref", "b", "c", "d"], [], share, 4, own_gpus) == StartPlan(
        ("ref", "a", "b", "c"))
    # fractions that make 1 add up to a hair above it in binary (0.34 + 0.56 + 0.1) still fit
    assert plan_start(["ref", "a"], ["b"], [], {"ref": 0.34, "a": 0.56, "b": 0.1}, 3, own_gpus) == StartPlan(
        ("ref", "a", "b"))
    # never skipping ahead: b does not fit beside them, so d (which would) waits its turn too
    share["b"] = 0.7
    assert plan_start(["ref", "a"], ["b", "d"], [], share, 5, own_gpus) == StartPlan(("ref", "a"))


def test_live_servers_nobody_needs_next_are_stopped_least_recently_used_first() -> None:
    share = half("old1", "old2", "ref", "a", "b", share=0.25)
    plan = plan_start(["ref", "a"], ["b"], ["old1", "ref", "old2"], share, 4, own_gpus)
    assert plan == StartPlan(("a", "b"), stop=("old1",))  # ref is kept: the test needs it


def test_the_memory_fraction_is_the_servers_flag_else_vllms_default() -> None:
    assert memory_fraction(["--dtype", "float16", "--gpu-memory-utilization", "0.45"]) == 0.45
    assert memory_fraction(["--gpu-memory-utilization=0.2"]) == 0.2
    assert memory_fraction([]) == 0.9  # two servers without it never start together
    with pytest.raises(ConfigError, match=r"--gpu-memory-utilization 1\.5: expected a fraction in \(0, 1\]"):
        memory_fraction(["--gpu-memory-utilization", "1.5"])


def _placement(tmp_path: Path, device: str, placement: str = "", endpoint: bool = False) -> Placement:
    path = tmp_path / "p.toml"
    path.write_text(f'name = "p"\ndevice = "{device}"\n[target]\nmodel = "m"\n'
                    f'[server]\nargs = ["--gpu-memory-utilization", "0.45"]\n{placement}')
    return Placement(load_profile(str(path)), endpoint, 2, None, 3, "127.0.0.1")


def test_servers_start_together_on_gpu_profiles_only_unless_the_profile_says_not(tmp_path: Path) -> None:
    assert _placement(tmp_path, "cuda").start_together()
    assert not _placement(tmp_path, "cuda", "[placement]\nstart_together = false\n").start_together()
    assert not _placement(tmp_path, "cuda", "[placement]\nco_resident = false\n").start_together()
    assert not _placement(tmp_path, "cuda", endpoint=True).start_together()
    assert not _placement(tmp_path, "cpu").start_together()


@pytest.mark.parametrize(("device", "value", "message"), [
    ("cuda", '"yes"', r"\[placement\] start_together must be true or false, got 'yes'"),
    ("cpu", "true", r"\[placement\] start_together = true is for GPU profiles: on device = 'cpu' the starts would "
                    r"share the cores"),
])
def test_a_bad_start_together_names_the_file_and_key(tmp_path: Path, device: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _placement(tmp_path, device, f"[placement]\nstart_together = {value}\n")


def test_a_bad_memory_fraction_in_the_servers_args_names_the_profile(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('name = "p"\ndevice = "cuda"\n[target]\nmodel = "m"\n[server]\n'
                    'args = ["--gpu-memory-utilization", "45"]\n')
    with pytest.raises(ConfigError, match=r"profile .*p\.toml: \[server\] args: server argument "
                                          r"--gpu-memory-utilization 45: expected a fraction in \(0, 1\]"):
        load_profile(str(path))


def test_the_estimate_counts_a_group_started_together_as_one_start() -> None:
    timings = Timings(server_start_s=90, stream_tok_s=100, max_tok_s=1000, run_overhead_s=0)
    tests = [PlannedTest("m.py::a", ("ref", "a"), 100, 1, 1, 0, 0),
             PlannedTest("m.py::b", ("ref", "b"), 100, 1, 1, 0, 0)]
    one_by_one = estimate(tests, timings, runs=1, max_runs=1, max_servers=3)[0]
    together = estimate(tests, timings, runs=1, max_runs=1, max_servers=3,
                        fits=half("ref", "a", "b", share=0.3), apart=own_gpus)[0]
    assert (one_by_one.starts, one_by_one.groups, one_by_one.saved_s) == (3, 0, 0)
    assert (together.starts, together.together, together.groups, together.saved_s) == (3, 3, 1, 180)
    assert one_by_one.seconds - together.seconds == pytest.approx(180)


def test_servers_on_disjoint_gpus_start_together_where_the_leases_place_them() -> None:
    """A 70B-class target at TP 4 takes 0.9 of four GPUs per server: its memory fractions (0.9 + 0.9) never share
    one set of GPUs, but on an 8-GPU host the leases place the two arms on disjoint GPUs, so they start at once."""
    need = {"ref": (4, 0.9), "spec": (4, 0.9), "base": (4, 0.9)}
    eight = tuple("01234567")
    assert plan_start(["ref", "spec"], [], [], lease_fit(need, eight), 3, lease_apart(need, eight)) == StartPlan(
        ("ref", "spec"))
    four = eight[:4]
    assert plan_start(["ref", "spec"], [], [], lease_fit(need, four), 3, lease_apart(need, four)) is None  # one by one
    # an A/B test's third TP-4 server has no room beside two on 8 GPUs: its arms start one after another
    assert plan_start(["ref", "spec", "base"], [], [], lease_fit(need, eight), 3, lease_apart(need, eight)) is None
    # the fractions alone, where the GPUs are not known, start none of them together
    assert plan_start(["ref", "spec"], [], [], {k: f for k, (_, f) in need.items()}, 3) is None


def test_the_70b_profiles_two_arms_start_together_on_its_eight_gpus() -> None:
    placement = Placement(load_profile("h100x8-70b"), False, 2, None, 5, "127.0.0.1")
    ref, spec = server_spec(placement.profile, "none", None), server_spec(placement.profile, "eagle3", 3)
    assert placement.start_plan([ref, spec], [], [], tuple("01234567")) == StartPlan((ref.key(), spec.key()))
    assert placement.start_plan([ref, spec], [], [], ()) is None  # no GPUs known: as their fractions say
    # a process with half the host (two xdist workers) has room for one TP-4 server at a time
    assert placement.start_plan([ref, spec], [], [], tuple("0123")) is None
