"""The version of each file format the plugin writes, in one place, and the one command that brings an older
file to it. A baseline file (`gate/baselines.py`) and a results file (`output/schema.py`) are two formats with
a version each; their readers refuse any other version and name `CONVERT`, which ships with the package
(`pytest-specdec convert-schema`, `output/convert.py`). Bump a version where a field changes meaning or shape,
and teach `output/convert.py` the step from the one before."""

from __future__ import annotations

#: Baseline files: `<baselines>/<profile>/<hardware>/<suite module>/<test>.json`.
BASELINE_SCHEMA = 3
#: Results files: `reports/specdec-<UTC stamp>.json` (and --specdec-json).
RESULTS_SCHEMA = 5
#: A concurrency sweep's crossover record beside its tests' baseline files (`<sweep>.crossover`).
SWEEP_SCHEMA = 1
#: The GPU lease file a host's sessions share (`servers/gpus.py`); transient, never converted.
LEASE_SCHEMA = 1
#: How a file of an older schema is brought to the current one, wherever the package is installed.
CONVERT = "pytest-specdec convert-schema"
