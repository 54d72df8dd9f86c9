"""The `pytest-specdec` command's use cases, above the output layer: results files judged against each other or
against stored baselines (`compare.py`; an A/B session's, `ab_compare.py`) and the nights' series with their change
points (`history.py`). Each reads results files (`output.schema`), asks the gate to decide, and hands typed values to
`output/` to render; `cli.py` wires them. Nothing below imports this layer (pyproject.toml's import-linter
contracts)."""
