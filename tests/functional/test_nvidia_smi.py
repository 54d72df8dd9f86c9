"""nvidia-smi read through a stand-in script: the GPUs it lists, its failures, and the hardware a session's
results name from it (the profiles' GPU checks without a process: tests/unit/test_profiles.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_specdec.errors import ConfigError
from pytest_specdec.servers.hardware import SMI_ENV, GpuList, list_gpus

SXM = "NVIDIA H100 80GB HBM3"


def test_list_gpus_reads_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    fake_nvidia_smi: Callable[..., Path]) -> None:
    monkeypatch.setenv(SMI_ENV, str(fake_nvidia_smi(f"{SXM}\n{SXM}\n")))
    assert list_gpus() == GpuList((SXM, SXM))
    monkeypatch.setenv(SMI_ENV, str(fake_nvidia_smi("NVIDIA-SMI has failed because it couldn't communicate "
                                                         "with the NVIDIA driver.\n", code=9)))
    gpus = list_gpus()
    assert gpus.names == () and "exited with 9: NVIDIA-SMI has failed" in str(gpus.problem)
    monkeypatch.setenv(SMI_ENV, str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="is not an executable file"):
        list_gpus()
    monkeypatch.delenv(SMI_ENV)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert list_gpus() == GpuList((), "no nvidia-smi on PATH (no NVIDIA driver on this machine)")


def test_results_name_the_gpus_nvidia_smi_listed_not_the_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                fake_nvidia_smi: Callable[..., Path]) -> None:
    from pytest_specdec.options import Settings
    from pytest_specdec.output.results import hardware_name
    from pytest_specdec.session import SpecDecSession

    def session(dry_run: bool = False) -> SpecDecSession:
        settings = Settings(gpu="h100", profile_path=None, runs=None, dry_run=dry_run, endpoint=None,
                            reference_endpoint=None, api_key_env="NO_KEY", json_path=None, reports_dir=tmp_path,
                            max_servers=1, startup_timeout_s=1.0)
        return SpecDecSession(settings, tmp_path, progress=lambda line: None)

    def hardware(s: SpecDecSession) -> str:
        return hardware_name(s.profile, s.gpu_names)

    monkeypatch.setenv(SMI_ENV, str(fake_nvidia_smi(f"{SXM}\n{SXM}\n")))
    assert hardware(session()) == f"{SXM} x2"
    # Not looked at (dry run): the profile's SKU, said to be unchecked.
    assert hardware(session(dry_run=True)) == f"{SXM} (profile; GPUs not checked)"
