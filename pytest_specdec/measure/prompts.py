"""Which prompts each run of a test sends: the same ones every run, or, for a drafter that learns what its
server served (suffix decoding), prompts that server has never been sent."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_specdec.measure.types import Prompt


class FixedPrompts:
    """The same prompts for every run (what every method but a learning drafter gets)."""

    fresh = False

    def __init__(self, prompts: list[Prompt]) -> None:
        self.prompts = prompts

    def run(self, index: int) -> list[Prompt]:
        return self.prompts

    def warmup(self, n: int) -> list[Prompt]:
        return [self.prompts[i % len(self.prompts)] for i in range(n)] if n else []


class FreshPrompts:
    """Prompts a learning drafter has never been sent.

    vLLM's suffix decoding keeps the responses it served in a global tree (up to
    `suffix_decoding_max_cached_requests`), so a prompt sent twice to one server is drafted from its own
    earlier answer and acceptance soars.  Each pair index gets its own seeded sample of `size` prompts,
    shared by the two arms (pairs stay comparable), drawn without replacement from the prompts `seen`
    (shared by every test on that server) does not hold; warm-ups draw too.  When too few are left,
    `exhausted()` is called (the session restarts the server: a fresh tree) and the draw starts over.
    """

    fresh = True

    def __init__(self, pool: list[Prompt], size: int, seen: set[str], exhausted: Callable[[], None],
                 seed: int = 0) -> None:
        if size > len(pool):
            raise ValueError(f"{size} prompts per run but the dataset has {len(pool)}")
        self.pool, self.size, self.seen, self.exhausted = pool, size, seen, exhausted
        self.rng = random.Random(seed)
        self.by_run: dict[int, list[Prompt]] = {}

    def _draw(self, n: int) -> list[Prompt]:
        unseen = [p for p in self.pool if p.id not in self.seen]
        if len(unseen) < n:
            self.exhausted()
            self.seen.clear()
            unseen = list(self.pool)
        drawn = self.rng.sample(unseen, min(n, len(unseen)))
        self.seen.update(p.id for p in drawn)
        return drawn

    def run(self, index: int) -> list[Prompt]:
        if index not in self.by_run:
            self.by_run[index] = self._draw(self.size)
        return self.by_run[index]

    def warmup(self, n: int) -> list[Prompt]:
        # Never more than a run's worth, so a warm-up alone cannot use up a small dataset.
        return self._draw(min(n, self.size)) if n else []


PromptSource = FixedPrompts | FreshPrompts
