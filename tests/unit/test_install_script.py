"""scripts/install.py: uv installs only with pip's settings carried over, and pip installs where uv could not
repeat them. The listing is `pip config list`'s own format (this machine's, with a PIP_* variable beside its files)."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def install(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """scripts/install.py imported as the tools import it, from the repository root (on sys.path for the test only)."""
    monkeypatch.syspath_prepend(str(ROOT))
    return importlib.import_module("scripts.install")

#: `pip config list` on the project's machines, with PIP_EXTRA_INDEX_URL set as docs/ci.md's CPU job sets it.
LISTING = """\
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.disable-pip-version-check='1'
:env:.extra-index-url='https://download.pytorch.org/whl/cpu'
:env:.find-links='/opt/wheels'
download.dest='/tmp/d'
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels'
install.find-links='/srv/wheels'
"""


def test_the_strongest_section_wins_and_other_commands_sections_do_not_apply(install: ModuleType) -> None:
    settings = install.pip_settings(LISTING)
    assert settings["extra-index-url"] == "https://download.pytorch.org/whl/cpu"  # the environment over the files
    assert settings["find-links"] == "/opt/wheels"  # the environment over [install] over [global]
    assert settings["constraint"] == "/etc/xdg/pip/constraints.txt"
    assert "dest" not in settings
    assert install.pip_settings("install.find-links='/srv/wheels'\nglobal.find-links='/opt/wheels'\n") == {
        "find-links": "/srv/wheels"}


def test_uv_gets_every_index_link_and_constraint_and_the_certificate(install: ModuleType) -> None:
    plan = install.uv_options(install.pip_settings(LISTING.replace(":env:.extra-index-url='https://download.pytorch.org/whl/cpu'\n",
                                                   "")))
    assert not isinstance(plan, str)
    options, env = plan
    assert options == ["--extra-index-url", "file:///opt/pypi/simple", "--extra-index-url",
                       "file:///opt/pypi-more/simple", "--find-links", "/opt/wheels",
                       "--constraint", "/etc/xdg/pip/constraints.txt"]
    assert env == {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt"}
    assert install.uv_options({}) == ([], {})


def test_a_setting_uv_would_not_follow_keeps_pip(install: ModuleType) -> None:
    for key in ("proxy", "trusted-host", "client-cert", "no-index"):
        plan = install.uv_options(install.pip_settings(LISTING + f"global.{key}='x'\n"))
        assert plan == f"pip is configured with {key}, which uv would not follow"


def test_the_installer_asked_for_is_uv_or_pip_and_nothing_else(install: ModuleType) -> None:
    assert install.requested({}) == "uv" and install.requested({"SPECDEC_INSTALLER": "pip"}) == "pip"
    with pytest.raises(SystemExit, match="SPECDEC_INSTALLER='Pip': use uv \\(the default\\) or pip"):
        install.requested({"SPECDEC_INSTALLER": "Pip"})
