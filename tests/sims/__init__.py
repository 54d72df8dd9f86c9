"""Simulation models the tests check the statistics on, and scripts/ prints full-size figures from.

They live here, not in scripts/, so that the tests import nothing from scripts/: the scripts import these
(``sys.path`` gets tests/), as pytest's rootdir conftest gives the tests ``import sims``.
"""
