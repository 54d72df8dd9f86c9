"""measure/workload.py: rendering chat prompts for the completions API."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pytest_specdec.errors import ConfigError
from pytest_specdec.measure.workload import Workload


def test_completions_without_transformers_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A base install (endpoint mode, no vLLM extra) has no transformers: api='completions' over chat prompts
    says what to install or change, not a bare ImportError."""
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` now raises ImportError
    workload = Workload(tmp_path, print)
    with pytest.raises(ConfigError,
                       match=r"needs transformers .*install pytest-specdec\[cpu\] or \[gpu\], or use api='chat'"):
        workload.prompts("builtin", 2, 8, "completions", "some/model")
