"""Token counts of the built-in dataset's prompts by the target's tokenizer, against ceil(characters / 4).

    .venv/bin/python -m scripts.token_counts [--model zoo:target] [--dataset builtin]

Per category: prompts, input tokens as the server counts them (the chat template applied with the
generation prompt, `pytest_specdec.measure.counting`, the plugin's own count) with their mean, min and max,
the same tokenizer's count of the messages' contents alone (what the template adds is the difference), the
old estimate (ceil(characters / 4) of the contents) with its mean, min and max, and the ratio of the
tokenizer's mean to the estimate's. Prints a Markdown table (docs/validation.md, "Token counts of the built-in
dataset").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--model", default="zoo:target", help="the target (a folder, zoo:NAME or a cached hub name)")
    parser.add_argument("--dataset", default="builtin", help="[FORMAT:]PATH[#CATEGORY,...] as --specdec-dataset")
    args = parser.parse_args(argv)

    from pytest_specdec.measure import counting, tokens
    from pytest_specdec.measure.datasets import load

    model = args.model
    if model.startswith("zoo:"):
        from pytest_specdec.zoo import zoo_path

        model = str(zoo_path(model[4:]))
    tok = tokens.load(model)
    if tok.hf is None:
        print(f"no tokenizer: {tok.why}", file=sys.stderr)
        return 1
    dataset = load(args.dataset, Path.cwd(), lambda: tok)
    prompts = list(dataset.prompts)
    counted, how = counting.count(tok, prompts)
    if how != "tokenizer":
        print(f"not counted by the tokenizer: {how}", file=sys.stderr)
        return 1
    old = [counting._estimate(p) for p in prompts]
    bare = [sum(tok.count(str(m["content"])) for m in p.messages or ()) for p in prompts]
    print(f"dataset {dataset.name} ({len(prompts)} prompts), target {args.model}: input tokens by its tokenizer "
          f"(chat template applied) against ceil(characters / 4)\n")
    print("| category | prompts | tokenizer mean | min | max | contents only mean | chars/4 mean | min | max | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows: dict[str, list[tuple[int, int, int]]] = {}
    for p, n, b, e in zip(prompts, counted, bare, old, strict=True):
        rows.setdefault(p.category, []).append((n, b, e))
    for category, group in [*sorted(rows.items()), ("all", [x for v in rows.values() for x in v])]:
        ns, bs, es = ([g[i] for g in group] for i in range(3))
        mn, me = sum(ns) / len(ns), sum(es) / len(es)
        print(f"| {category} | {len(group)} | {mn:.1f} | {min(ns)} | {max(ns)} | {sum(bs) / len(bs):.1f} | {me:.1f} "
              f"| {min(es)} | {max(es)} | {mn / me:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
