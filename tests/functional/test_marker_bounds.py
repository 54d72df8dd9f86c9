"""Marker values no server can measure as labelled are collection errors naming the field, the limit and
where the limit comes from, before any server starts."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.parametrize(("marker", "server_args", "message"), [
    ('method="ngram", concurrency=10**9', None,
     "*concurrency=1000000000 is above the 128 requests a server of profile 'fake' runs at once (vLLM's default "
     "on the CPU, 128 per rank x 1; set --max-num-seqs in the profile's [[]server[]] args to say); the rest would wait "
     "in its queue*lower concurrency to at most 128"),
    ('method="ngram", concurrency=32, num_prompts=64', '["--max-num-seqs", "16"]',
     "*concurrency=32 is above the 16 requests a server of profile 'fake' runs at once (--max-num-seqs 16 in its "
     "[[]server[]] args)*"),
    ('method="ngram", concurrency=16, num_prompts=8', None,
     "*concurrency=16 but a run sends 8 prompts (num_prompts=8), so at most 8 are ever in flight; lower "
     "concurrency to at most 8 or send more prompts"),
    ('method="ngram", k=10**6', None,
     "*specdec marker: k=1000000 is above 128: vLLM verifies at most 128 draft tokens per step (MAX_SPEC_LEN of "
     "its rejection sampler); lower k to at most 128"),
    ('speculative_config={"method": "ngram", "num_speculative_tokens": 129, "prompt_lookup_max": 4}', None,
     "*specdec marker: speculative_config num_speculative_tokens=129 is above 128: *"),
    ('method="ngram", max_tokens=10**9', None,
     "*specdec marker: max_tokens=1000000000 is above 1048576: above any served context length, the bound of a "
     "dataset record's own max_tokens; lower max_tokens to at most 1048576"),
    ('method="ngram", request_rate=float("inf")', None,
     "*request_rate must be a finite number of requests/s > 0 (open loop) or None (closed loop), got inf"),
])
def test_marker_values_beyond_what_can_be_measured_are_collection_errors(
        pytester: pytest.Pytester, fake_profile: Path, marker: str, server_args: str | None, message: str) -> None:
    if server_args is not None:
        fake_profile.write_text(fake_profile.read_text().replace("[target]", f"[server]\nargs = {server_args}\n"
                                                                             "[target]"))
    pytester.makepyfile(f"""
        import pytest
        @pytest.mark.specdec({marker})
        def test_x(specdec):
            pass
        """)
    result = pytester.runpytest(f"--specdec-profile={fake_profile}", "--specdec-dry-run", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([message])  # `[[]` and `[]]` are fnmatch's brackets
    assert "Traceback" not in result.stdout.str()


def test_concurrency_up_to_the_limits_is_collected(pytester: pytest.Pytester, fake_profile: Path) -> None:
    """The limits themselves pass: concurrency equal to --max-num-seqs and to the prompts sent."""
    fake_profile.write_text(fake_profile.read_text().replace("[target]", '[server]\nargs = ["--max-num-seqs", "8"]\n'
                                                                         "[target]"))
    pytester.makepyfile("""
        import pytest
        @pytest.mark.specdec(method="ngram", k=128, concurrency=8, num_prompts=8)
        def test_x(specdec):
            pass
        """)
    result = pytester.runpytest(f"--specdec-profile={fake_profile}", "--specdec-dry-run", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=1)
