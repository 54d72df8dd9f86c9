"""Synthetic prompts of exact token lengths, made as ``vllm bench serve --dataset-name random`` makes them.

Why a re-implementation and not vLLM's own ``RandomDataset``: importing ``vllm.benchmarks.datasets`` takes
7 s and 650 MB (it imports torch) on the CPU machine, in every session that has one synthetic test, and the
plugin must run where vLLM is not installed (endpoint mode). The steps below are RandomDataset.sample's with
no prefix (``vllm/benchmarks/datasets/datasets.py``, ``datasets/utils.py:get_sampling_params``), in the same
order of draws from the same ``numpy.random.default_rng(seed)``, so the same seed and tokenizer give the
same prompts as bench with ``--seed``; tests/functional/test_bench_parity.py compares them with vLLM's code.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from pytest_specdec.errors import ConfigError
from pytest_specdec.measure.datasets import Dataset
from pytest_specdec.measure.types import Prompt

#: The seed of the lengths, offsets and extra tokens: bench serve's ``--seed`` default, so that a session and
#: ``vllm bench serve --dataset-name random --seed 0`` send the same prompts.
SEED = 0
#: The category (and id prefix) of every synthetic prompt: bench serve's dataset name.
CATEGORY = "random"
#: How many prompts a synthetic test without num_prompts sends: bench serve's ``--num-prompts`` default.
BENCH_NUM_PROMPTS = 1000
#: How often a decoded-then-encoded sequence is adjusted to its length (bench's ``max_retry``).
MAX_RETRY = 10


def length_bounds(input_len: int, output_len: int, range_ratio: float, num_special: int) -> tuple[int, int, int, int]:
    """(input low, input high, output low, output high), both ends included, as bench draws them: the
    input's range is around ``input_len`` less the special tokens the server adds."""
    if not 0 <= range_ratio < 1:
        raise ConfigError(f"range_ratio must be in [0, 1), got {range_ratio}")
    real = max(0, int(input_len) - num_special)
    in_lo, in_hi = math.floor(real * (1 - range_ratio)), math.ceil(real * (1 + range_ratio))
    out_lo = max(math.floor(output_len * (1 - range_ratio)), 1)
    out_hi = max(math.ceil(output_len * (1 + range_ratio)), 1)
    if in_lo < 1:
        raise ConfigError(f"input_len={input_len} is too small: with the tokenizer's {num_special} special token(s) "
                          f"and range_ratio {range_ratio:g} a prompt could have no token of its own; raise input_len")
    return in_lo, in_hi, out_lo, out_hi


def _to_length(tok: Any, seq: list[int], target: int, rng: Any) -> tuple[str, list[int]]:
    """bench's gen_prompt_decode_to_target_len: decode, re-encode, then pad with random ids or truncate
    until the text encodes to ``target`` tokens (at most MAX_RETRY times; a miss is kept, as bench keeps it)."""
    tries = MAX_RETRY
    while True:
        text = tok.decode(seq)
        seq = tok.encode(text, add_special_tokens=False)
        if tries <= 0 or len(seq) == target:
            return text, seq
        if len(seq) < target:
            seq.extend(rng.integers(0, tok.vocab_size, size=target - len(seq)).tolist())
        else:
            seq = seq[:target]
        tries -= 1


def synthetic_prompts(tok: Any, num_prompts: int, input_len: int, output_len: int, range_ratio: float = 0.0,
                      seed: int = SEED) -> tuple[list[Prompt], int]:
    """``num_prompts`` completions prompts from the HF tokenizer ``tok``: each its own sampled lengths, its
    ``input_tokens`` the count the server makes (the text's tokens plus the special tokens it adds); with how
    many did not reach their drawn length in MAX_RETRY tries (kept at the length they have, as bench keeps them)."""
    import numpy as np

    if num_prompts < 1:
        raise ConfigError(f"synthetic prompts need num_prompts >= 1, got {num_prompts}")
    num_special = int(tok.num_special_tokens_to_add())
    in_lo, in_hi, out_lo, out_hi = length_bounds(input_len, output_len, range_ratio, num_special)
    rng = np.random.default_rng(seed)
    input_lens = rng.integers(in_lo, in_hi + 1, size=num_prompts)
    output_lens = rng.integers(out_lo, out_hi + 1, size=num_prompts)
    offsets = rng.integers(0, tok.vocab_size, size=num_prompts)
    all_tokens = np.arange(tok.vocab_size)
    allowed = np.array(list(set(all_tokens) - set(tok.all_special_ids)))  # bench's expression: its order too
    prompts, missed = [], 0
    for i in range(num_prompts):
        n = int(input_lens[i])
        seq = allowed[(int(offsets[i]) + i + np.arange(n)) % len(allowed)].tolist()
        text, ids = _to_length(tok, seq, n, rng)
        missed += len(ids) != n
        prompts.append(Prompt(id=f"{CATEGORY}-{i}", prompt=text, max_tokens=int(output_lens[i]), category=CATEGORY,
                              input_tokens=len(ids) + num_special))
    return prompts, missed


def _known(length: int | None) -> int:
    if length is None:
        raise ValueError("a synthetic prompt without its input length: synthetic_prompts draws each length first")
    return length


@dataclass(frozen=True)
class SyntheticDataset(Dataset):
    """Synthetic prompts with what made them: lengths, range, seed and tokenizer are part of the identity, so
    stored nights are compared only with nights of the same workload."""

    params: dict[str, Any] = field(default_factory=dict)
    missed: int = 0  # prompts whose text does not encode to their drawn length (bench's retries ran out)

    def identity(self) -> dict[str, Any]:
        return {**super().identity(), **self.params}

    def describe(self) -> dict[str, Any]:
        # made prompts all know their length (drawn from it): one that did not would be a ValueError here
        lengths = [_known(p.input_tokens) for p in self.prompts]
        return {**self.identity(), "prompts": len(self.prompts), "categories": {CATEGORY: len(self.prompts)},
                "input_tokens": {"min": min(lengths), "max": max(lengths)},
                "output_tokens": {"min": min(p.max_tokens for p in self.prompts),
                                  "max": max(p.max_tokens for p in self.prompts)},
                "missed_length": self.missed}

    def summary(self) -> str:
        p = self.params
        missed = (f"; {self.missed} of them not of their drawn length after {MAX_RETRY} re-encodings (kept, as "
                  "vllm bench serve keeps them; each prompt's input_tokens is its real count)") if self.missed else ""
        return (f"{self.name}: {len(self.prompts)} synthetic prompts (input_len {p['input_len']}, output_len "
                f"{p['output_len']}, range_ratio {p['range_ratio']:g}, seed {p['seed']}, tokenizer "
                f"{p['tokenizer']}){missed}")


def synthetic(target: str, num_prompts: int, input_len: int, output_len: int, range_ratio: float = 0.0,
              seed: int = SEED, tokenizer_name: str | None = None) -> SyntheticDataset:
    """The synthetic dataset made with ``target``'s tokenizer; without it exact lengths cannot be made, so
    that is an error naming the target (never the characters / 4 estimate). ``tokenizer_name`` is how the
    identity names it (a zoo path as ``zoo:NAME``, so where a checkout lives does not make nights unlike)."""
    from pytest_specdec.measure.tokens import load

    tokenizer = load(target)
    if tokenizer.hf is None:
        raise ConfigError(f"specdec: input_len/output_len make prompts of exact token lengths with the target's "
                          f"tokenizer, which cannot be loaded for {target}: {tokenizer.why}; put the tokenizer "
                          f"where the plugin can read it (the model's folder, or the Hugging Face cache) or use a "
                          f"dataset")
    prompts, missed = synthetic_prompts(tokenizer.hf, num_prompts, input_len, output_len, range_ratio, seed)
    params = {"input_len": input_len, "output_len": output_len, "range_ratio": range_ratio, "seed": seed,
              "tokenizer": tokenizer_name or target}
    ds = SyntheticDataset(name=CATEGORY, prompts=tuple(prompts), sha256="", format=CATEGORY, params=params,
                          missed=missed)
    return dataclasses.replace(ds, sha256=ds.prompts_sha256)  # no file: its "file" hash is that of what is sent
