"""Simulation models the tests check the statistics on, and scripts/ prints full-size figures from.

They live here, not in scripts/, so that the tests of the models import nothing from scripts/: the scripts import
these as ``tests.sims`` (run as ``python -m scripts.NAME`` from the repository root, which is then on
``sys.path``), as pytest's rootdir conftest gives the tests ``import sims``.
"""
