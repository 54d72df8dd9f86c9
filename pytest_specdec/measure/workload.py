"""The prompts a test sends: a dataset loaded once per session, a seeded sample of it, max_tokens applied,
for the completions API chat prompts rendered with the target's own chat template, and each prompt's input
tokens counted by the target's tokenizer (`counting.py`; lengths estimated from reference answers too)."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_specdec.errors import ConfigError

if TYPE_CHECKING:
    from pytest_specdec.measure.datasets import Dataset
    from pytest_specdec.measure.prompts import PromptSource
    from pytest_specdec.measure.types import Api, Prompt


class Workload:
    """Datasets (loaded once) and the tokenizer that renders chat prompts for the completions API."""

    def __init__(self, rootpath: Path, progress: Callable[[str], None]) -> None:
        self.rootpath = rootpath
        self.progress = progress
        self.datasets: dict[str, Dataset] = {}
        self._tokenizer: Any = None  # the target's, for completions prompts rendered from chat
        #: per spec server key, the prompt ids a learning drafter's server was sent (see `source`)
        self.sent: dict[str, set[str]] = {}
        self._targets: dict[str, str] = {}  # dataset name -> the target it was first loaded for
        #: (dataset key, api, prompt id) -> (input tokens, how counted)
        self._counted: dict[tuple[str, str, str], tuple[int, str]] = {}

    def _key(self, name: str, target: str) -> str:
        """Where a dataset is kept: its name, or for a second target (a preset's own) name and target, since
        that target's tokenizer counts its lengths."""
        return name if self._targets.setdefault(name, target) == target else f"{name} (target {target})"

    def dataset(self, name: str, target: str) -> Dataset:
        """The dataset a spec names (loaded once per target, whose tokenizer counts lengths estimated from
        reference answers); what loading skipped, defaulted or estimated is shown once."""
        key = self._key(name, target)
        if key not in self.datasets:
            from pytest_specdec.measure import tokens
            from pytest_specdec.measure.datasets import load

            self.datasets[key] = load(name, self.rootpath, lambda: tokens.load(target))
            self.progress(f"specdec: dataset {self.datasets[key].summary()}")
        return self.datasets[key]

    def synthetic(self, target: str, num_prompts: int | None, input_len: int, output_len: int,
                  range_ratio: float, tokenizer_name: str | None = None) -> Dataset:
        """Synthetic prompts of exact token lengths made with ``target``'s tokenizer (made once per set of
        parameters; `datasets/synthetic.py`), as ``vllm bench serve --dataset-name random --seed 0`` makes them;
        without num_prompts bench's default number."""
        from pytest_specdec.measure.datasets.synthetic import BENCH_NUM_PROMPTS

        num_prompts = BENCH_NUM_PROMPTS if num_prompts is None else num_prompts
        key = f"random:{target}:{num_prompts}:{input_len}:{output_len}:{range_ratio!r}"
        if key not in self.datasets:
            from pytest_specdec.measure.datasets.synthetic import synthetic

            self.datasets[key] = synthetic(target, num_prompts, input_len, output_len, range_ratio,
                                           tokenizer_name=tokenizer_name)
            self.progress(f"specdec: dataset {self.datasets[key].summary()}")
        return self.datasets[key]

    def prompts(self, dataset: str, num_prompts: int | None, max_tokens: int | None, api: Api,
                target: str) -> list[Prompt]:
        """The dataset's prompts (a seeded sample of num_prompts, so every session sends the same ones),
        max_tokens applied."""
        ds = self.dataset(dataset, target)
        prompts = list(ds.prompts)
        if num_prompts is not None:
            prompts = random.Random(0).sample(prompts, num_prompts)
        if max_tokens is not None:
            prompts = [dataclasses.replace(p, max_tokens=max_tokens) for p in prompts]
        if api == "completions":
            prompts = self._as_completions(prompts, target)
        return self._count(self._key(dataset, target), ds, prompts, api, target)

    def _count(self, key: str, ds: Dataset, prompts: list[Prompt], api: Api, target: str) -> list[Prompt]:
        """The prompts with their input tokens (`counting.count`, each prompt once per API), recorded in the
        dataset's results block; the first count of a dataset is shown with how it was made. A prompt whose
        length is known already (a synthetic one's, exact) is kept as it is."""
        from pytest_specdec.measure import counting, tokens

        todo = [p for p in prompts if p.input_tokens is None]
        new = [p for p in todo if (key, api, p.id) not in self._counted]
        if new:
            n, how = counting.count(tokens.load(target), new)
            self._counted.update({(key, api, p.id): (c, how) for p, c in zip(new, n, strict=True)})
            if not ds.inputs.tokens:
                self.progress(f"specdec: dataset {ds.name}: input tokens counted by {how}: mean "
                              f"{sum(n) / len(n):.1f}, min {min(n)}, max {max(n)} over {len(n)} prompts")
        for p in todo:
            n_p, how_p = self._counted[(key, api, p.id)]
            ds.inputs.add(how_p, [p], [n_p])
        return [p if p.input_tokens is not None else counting.counted(p, *self._counted[(key, api, p.id)])
                for p in prompts]

    def source(self, prompts: list[Prompt], speculative_config: dict[str, Any] | None, server_key: str,
               whole_dataset: Callable[[], list[Prompt]], exhausted: Callable[[], None]) -> PromptSource:
        """Fixed prompts, or for a drafter that learns across requests (suffix decoding, unless its global
        cache is off) prompts its server has never been sent, drawn from the whole dataset; ``exhausted``
        is called when none is left (the session then retires the server)."""
        from pytest_specdec.measure.prompts import FixedPrompts, FreshPrompts

        config = speculative_config or {}
        if config.get("method") != "suffix" or config.get("suffix_decoding_max_cached_requests") == 0:
            return FixedPrompts(prompts)
        seen = self.sent.setdefault(server_key, set())
        return FreshPrompts(whole_dataset(), len(prompts), seen, exhausted, seed=len(seen))

    def _as_completions(self, prompts: list[Prompt], target: str) -> list[Prompt]:
        """Chat prompts rendered with the target's own chat template, for the completions API.

        The rendered text already holds the template's special tokens (BOS), so the request says
        add_special_tokens=false, as vLLM's chat endpoint does; the token stream then matches chat's.
        """
        if all(p.messages is None for p in prompts):
            return prompts
        if self._tokenizer is None:
            try:
                from transformers import AutoTokenizer
            except ImportError as exc:
                raise ConfigError(f"api='completions' with chat prompts renders them with the target's chat "
                                  f"template, which needs transformers ({exc}): install pytest-specdec[cpu] or "
                                  "[gpu], or use api='chat'") from exc
            self._tokenizer = AutoTokenizer.from_pretrained(target)
        tok = self._tokenizer
        if not getattr(tok, "chat_template", None):
            raise ConfigError(
                f"api='completions' with chat prompts needs the target's chat template to render them, but "
                f"{target} has none: use a dataset with plain `prompt` fields, or api='chat'"
            )
        out = []
        for p in prompts:
            if p.messages is None:
                out.append(p)
                continue
            text = tok.apply_chat_template(p.messages, tokenize=False, add_generation_prompt=True)
            out.append(dataclasses.replace(p, messages=None, prompt=text, add_special_tokens=False))
        return out
