"""Hub revisions through whole sessions on the `vllm serve` stand-in: the commit a draft head's cache resolves to is
recorded under test, so a head changed upstream between two nights shows in the baseline diff; a pinned revision
that differs between nights makes them not comparable. The hub cache is a directory in huggingface_hub's layout."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from session import specdec_session

from fakes import STAND_IN_VALIDITY, FakeVllm

HEAD_1, HEAD_2, TARGET = "1" * 40, "2" * 40, "7" * 40
# The verdicts are recorded, never failed on: two runs of 4 prompts of the stand-in's random acceptance can read
# 0.82 one night and 0.64 the next, `regressed`; what is checked here is what the nights record.
SUITE = {"method": "draft_model", "concurrency": 1, "num_prompts": 4, "max_tokens": 8, "body": "pass",
         "verdicts": "check=False"}


def snapshot(cache: Path, repo: str, commit: str, *, main: bool = True) -> None:
    """``repo`` at ``commit`` in the hub cache (its config.json), the default branch pointing there when ``main``."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    (folder / "snapshots" / commit).mkdir(parents=True, exist_ok=True)
    (folder / "snapshots" / commit / "config.json").write_text("{}")
    if main:
        (folder / "refs").mkdir(exist_ok=True)
        (folder / "refs" / "main").write_text(commit)


def profile(path: Path, revision: str | None = None) -> Path:
    """A cpu profile of hub names (served by the stand-in): target org/target, draft org/head, pinned or not."""
    pin = f', revision = "{revision}"' if revision else ""
    validity = "\n".join(f"{key} = {value}" for key, value in STAND_IN_VALIDITY.items())
    path.write_text(f'name = "hub"\ndevice = "cpu"\n[target]\nmodel = "org/target"\n[methods.draft_model]\n'
                    f'speculative_config = {{ method = "draft_model", model = "org/head"{pin} }}\n'
                    f"[matrix]\nk = [3]\nruns = 2\n[validity]\n{validity}\n")
    return path


@pytest.fixture
def hub(pytester: pytest.Pytester, fake_vllm: FakeVllm, make_suite: Callable[..., str],
        monkeypatch: pytest.MonkeyPatch) -> Path:
    import huggingface_hub.constants  # noqa: F401  # read HF_HUB_CACHE here, before it is set: the plugin reads it anew

    cache = pytester.path / "hub-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))  # the sessions' (and so the servers') hub cache
    snapshot(cache, "org/target", TARGET)
    snapshot(cache, "org/head", HEAD_1)
    pytester.makepyfile(test_suite=make_suite(**SUITE))
    return cache


def night(pytester: pytest.Pytester, path: Path, *extra: str) -> dict[str, object]:
    """One session; its one test's results."""
    session = specdec_session(pytester, path, None, "--specdec-settle-timeout=0", *extra)
    session.result.assert_outcomes(passed=1)
    return session.test


def test_a_draft_head_changed_upstream_shows_under_test(pytester: pytest.Pytester, hub: Path) -> None:
    path = profile(pytester.path / "hub.toml")
    first = night(pytester, path, "--update-baselines")
    assert first["baseline"]["under_test"]["loaded_revisions"] == {"target": TARGET, "draft": HEAD_1}
    snapshot(hub, "org/head", HEAD_2)  # the head's owner pushed new weights; the next download fetched them
    second = night(pytester, path)
    baseline = second["baseline"]
    assert baseline["status"] == "compared"  # the same conditions: the new head is what the gate judges
    assert baseline["under_test"]["loaded_revisions"] == {"target": TARGET, "draft": HEAD_2}
    assert baseline["under_test_diff"] == {"loaded_revisions.draft": [HEAD_1, HEAD_2]}


def test_a_pinned_revision_that_differs_is_not_comparable(pytester: pytest.Pytester, hub: Path) -> None:
    snapshot(hub, "org/head", HEAD_2, main=False)  # both commits downloaded; the default branch is HEAD_1
    night(pytester, profile(pytester.path / "hub.toml", HEAD_1), "--update-baselines")
    pinned = night(pytester, profile(pytester.path / "hub.toml", HEAD_2))
    baseline = pinned["baseline"]
    assert baseline["status"] == "not-comparable"
    assert baseline["not_comparable_fields"] == {"speculation.revision": [HEAD_1, HEAD_2]}
    assert baseline["under_test"]["loaded_revisions"]["draft"] == HEAD_2  # what vLLM loaded: the pinned commit
    assert {v["verdict"] for v in pinned["verdicts"].values()} == {"not-comparable"}
