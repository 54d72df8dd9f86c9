"""The order of a test's runs: reference and spec interleaved per pair (ABBA), or in ABBA blocks when the two
servers cannot be alive at once (a block switch then restarts one server, not two), an A/B session's three
or four arms, and the warm-up each server gets before its first measured run."""

from __future__ import annotations

from typing import Literal

#: "spec" is the spec config under test (in an A/B session: the candidate); "base" is an A/B session's base;
#: "base_reference" the base install's reference, when the base is another install (`--specdec-base-python`).
Arm = Literal["reference", "spec", "base", "base_reference"]


def schedule(start: int, runs: int, block: int | None, block_index: int = 0) -> list[tuple[int, Arm]]:
    """The order of (pair index, arm) for pairs `start`..`runs`-1.

    ``block=None`` interleaves per pair, which arm goes first swapping from pair to pair (reference, spec,
    spec, reference, ...): neither arm always runs right after the other's server, and every other run
    follows its own server's run, so it needs no wait for another server's busy loop to end
    (`servers.pool.ServerPool.wait_quiet` leaves the next run's own server out).  ``block=b`` runs b pairs' worth of
    one arm, then of the other, and swaps which arm goes first every block (ABBA), so the server that
    is up at the end of a block serves the start of the next; ``block_index`` continues that parity
    when sequential looks extend a case.
    """
    out: list[tuple[int, Arm]] = []
    if block is None:
        for i in range(start, runs):
            out += [(i, "reference"), (i, "spec")] if i % 2 == 0 else [(i, "spec"), (i, "reference")]
        return out
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    for n, first in enumerate(range(start, runs, block), start=block_index):
        idx = range(first, min(first + block, runs))
        arms: tuple[Arm, Arm] = ("reference", "spec") if n % 2 == 0 else ("spec", "reference")
        for arm in arms:
            out += [(i, arm) for i in idx]
    return out


def schedule_ab(start: int, runs: int, installs: bool = False, block: int | None = None,
                block_index: int = 0) -> list[tuple[int, Arm]]:
    """An A/B session's order for pairs `start`..`runs`-1: the reference, then the base and the candidate
    ("spec"), which of the two goes first swapping from pair to pair, so neither always runs right after the
    reference (a run after the reference's may find the machine in another state than one after a spec run).
    With two ``installs`` the two references run back to back, then the two spec arms, the base's first in
    even pairs and the candidate's in odd ones, so each compared pair is adjacent and neither side always leads.

    ``block=b`` (servers that cannot be alive at once): b pairs' worth of each arm in turn, the arms' order
    reversed every block (ABBA over three or four arms), so the server up at a block's end serves the next
    block's start; ``block_index`` continues that parity when sequential looks extend a case."""
    if block is not None:
        if block < 1:
            raise ValueError(f"block must be >= 1, got {block}")
        arms: list[Arm] = (["base_reference", "reference", "base", "spec"] if installs
                           else ["reference", "base", "spec"])
        out: list[tuple[int, Arm]] = []
        for n, first in enumerate(range(start, runs, block), start=block_index):
            idx = range(first, min(first + block, runs))
            for arm in arms if n % 2 == 0 else arms[::-1]:
                out += [(i, arm) for i in idx]
        return out
    out = []
    for i in range(start, runs):
        if installs:
            refs: tuple[Arm, Arm] = ("base_reference", "reference") if i % 2 == 0 else ("reference", "base_reference")
            specs: tuple[Arm, Arm] = ("base", "spec") if i % 2 == 0 else ("spec", "base")
            out += [(i, refs[0]), (i, refs[1]), (i, specs[0]), (i, specs[1])]
        else:
            out += [(i, "reference"), *(((i, "base"), (i, "spec")) if i % 2 == 0 else ((i, "spec"), (i, "base")))]
    return out


def warmup_requests(n_prompts: int, concurrency: int) -> int:
    """Requests sent (and discarded) before a server's first measured run: enough to fill every slot
    twice, never more than the workload (the dry-run estimate counts them too)."""
    return min(n_prompts, 2 * concurrency)
