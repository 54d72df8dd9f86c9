"""Secrets never reach what the plugin writes: server commands and environments in the results, the
report, the dry run and the baselines (which get committed), start errors and the log tails attached to
failures.

A secret is the value of a known flag (`--hf-token`, `--api-key`, in either spelling vLLM accepts:
`--hf_token` too), of an environment variable whose name says token, key, secret, password, pass, auth
or credential, or of a name the user adds (ini `specdec_redact`); and anything shaped like a Hugging
Face, OpenAI or GitHub token. Values are replaced, names are kept, so a reader still sees that a token
was given. A count of tokens (`VLLM_MAX_TOKENS`, `TOKENIZERS_PARALLELISM`) is no secret and stays.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

MASK = "<redacted>"
#: `vllm serve` flags whose value is a secret.
SECRET_FLAGS = frozenset({"--api-key", "--hf-token"})
#: Environment names that hold secrets (searched in the upper-cased name): these words anywhere, but a
#: token count or a tokenizer setting is not a token; and a name ending in a bare KEY, PASS or AUTH.
_SECRET_ENV = re.compile(r"TOKEN(?!S|IZER)|SECRET|PASSW(OR)?D|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL"
                         r"|(?:^|_)(?:KEY|PASS|AUTH)$")
#: Values that are tokens whatever carries them.
_TOKEN_SHAPES = re.compile(r"\b(?:hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{20,})")

_extra: set[str] = set()


def extend(names: Iterable[str]) -> None:
    """Add flag names (`--my-secret`) or environment names (`MY_SECRET`) to redact, for this process."""
    _extra.update(flag_name(n) for n in names if n)


def flag_name(arg: str) -> str:
    """A flag as vLLM's parser reads it: `--hf_token` is `--hf-token`."""
    return "--" + arg[2:].replace("_", "-") if arg.startswith("--") else arg


def _secret_flag(arg: str) -> bool:
    name = flag_name(arg)
    return name in SECRET_FLAGS or name in _extra


def _secret_env(name: str) -> bool:
    return bool(_SECRET_ENV.search(name.upper())) or name in _extra


def args(argv: Sequence[str]) -> list[str]:
    """A command with each secret flag's value masked (`--hf-token X` and `--hf-token=X`)."""
    out: list[str] = []
    hide = False
    for arg in argv:
        flag, eq, _ = arg.partition("=")
        if hide:
            out.append(MASK)
        elif eq and _secret_flag(flag):
            out.append(f"{flag}={MASK}")
        else:
            out.append(_TOKEN_SHAPES.sub(MASK, arg))
        hide = not hide and not eq and _secret_flag(arg)
    return out


def env(values: Mapping[str, str]) -> dict[str, str]:
    """Environment variables with secret values masked."""
    return {k: MASK if _secret_env(k) else _TOKEN_SHAPES.sub(MASK, str(v)) for k, v in values.items()}


def secret_values(argv: Sequence[str], environ: Mapping[str, str]) -> set[str]:
    """The secret values a command and its environment carry (for scrubbing text such as a log)."""
    found = {v for k, v in environ.items() if _secret_env(k) and v}
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if eq and _secret_flag(flag) and value:
            found.add(value)
        elif not eq and _secret_flag(arg) and i + 1 < len(argv):
            found.add(argv[i + 1])
    return {v for v in found if len(v) >= 4}  # masking "1" everywhere would garble the text


def text(value: str, secrets: Iterable[str] = ()) -> str:
    """Text (a log tail, an error message) with the given secret values and token shapes masked."""
    for secret in sorted(set(secrets), key=len, reverse=True):
        value = value.replace(secret, MASK)
    return _TOKEN_SHAPES.sub(MASK, value)
