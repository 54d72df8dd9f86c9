"""The maintainers' tools (scripts/README.md lists them): a package, run from the repository root as
``python -m scripts.NAME``. The root is then first on the import path, so the tools import the plugin, the
simulations' models (``tests.sims``), the simulated vLLM (``tests.fakes``) and each other (``scripts.NAME``)
without editing that path (tests/functional/test_scripts.py fails on an edit)."""
