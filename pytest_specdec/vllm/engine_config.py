"""The engine configuration a vLLM server resolved, read from `/server_info` or its start-up log line.

Why: what a server actually ran with (dtype, compilation, scheduler limits, speculative config) is
the thing under test; both sources are flattened to the same keys so baselines compare like with like.
"""

from __future__ import annotations

import ast
import re
from typing import Any

#: vLLM serves /server_info (its resolved VllmConfig as JSON) only with this set; we set it for the servers
#: we own when they listen on loopback (it also adds vLLM's other development routes, e.g. /collective_rpc).
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"
#: The first /server_info call runs vLLM's collect_env (lscpu, pip list, nvidia-smi ...) in a thread.
SERVER_INFO_TIMEOUT_S = 60.0
#: Flat engine-config key ← (section of vLLM's VllmConfig, field), for /server_info?config_format=json.
_FROM_SERVER_INFO: tuple[tuple[str, str, str], ...] = (
    ("model", "model_config", "model"),
    ("served_model_name", "model_config", "served_model_name"),
    ("tokenizer", "model_config", "tokenizer"),
    ("revision", "model_config", "revision"),
    ("dtype", "model_config", "dtype"),
    ("max_model_len", "model_config", "max_model_len"),
    ("seed", "model_config", "seed"),
    ("quantization", "model_config", "quantization"),
    ("enforce_eager", "model_config", "enforce_eager"),
    ("trust_remote_code", "model_config", "trust_remote_code"),
    ("generation_config", "model_config", "generation_config"),
    ("kv_cache_dtype", "cache_config", "cache_dtype"),
    ("block_size", "cache_config", "block_size"),
    ("enable_prefix_caching", "cache_config", "enable_prefix_caching"),
    ("gpu_memory_utilization", "cache_config", "gpu_memory_utilization"),
    ("max_num_batched_tokens", "scheduler_config", "max_num_batched_tokens"),
    ("max_num_seqs", "scheduler_config", "max_num_seqs"),
    ("enable_chunked_prefill", "scheduler_config", "enable_chunked_prefill"),
    ("async_scheduling", "scheduler_config", "async_scheduling"),
    ("tensor_parallel_size", "parallel_config", "tensor_parallel_size"),
    ("pipeline_parallel_size", "parallel_config", "pipeline_parallel_size"),
    ("data_parallel_size", "parallel_config", "data_parallel_size"),
    ("device", "device_config", "device"),
    ("load_format", "load_config", "load_format"),
    ("attention_backend", "attention_config", "backend"),
)
#: The same keys ← the start-up log line's names (VllmConfig.__str__); the line lacks the scheduler's limits.
_FROM_LOG_LINE: tuple[tuple[str, str], ...] = (
    ("model", "model"), ("served_model_name", "served_model_name"), ("tokenizer", "tokenizer"),
    ("revision", "revision"), ("dtype", "dtype"), ("max_model_len", "max_seq_len"), ("seed", "seed"),
    ("quantization", "quantization"), ("enforce_eager", "enforce_eager"),
    ("trust_remote_code", "trust_remote_code"), ("kv_cache_dtype", "kv_cache_dtype"),
    ("enable_prefix_caching", "enable_prefix_caching"), ("enable_chunked_prefill", "enable_chunked_prefill"),
    ("tensor_parallel_size", "tensor_parallel_size"), ("pipeline_parallel_size", "pipeline_parallel_size"),
    ("data_parallel_size", "data_parallel_size"), ("device", "device_config"), ("load_format", "load_format"),
)
#: The speculative config's fields kept (the draft's nested model/parallel/load configs are left out).
SPECULATIVE_KEYS = (
    "method", "model", "num_speculative_tokens", "draft_tensor_parallel_size", "revision", "quantization",
    "max_model_len", "prompt_lookup_min", "prompt_lookup_max", "parallel_drafting",
    "disable_padded_drafter_batch", "rejection_sample_method", "draft_sample_method",
)
#: Methods without a draft model: vLLM puts a placeholder ("ngram") in `model`; its log prints None.
_NO_DRAFT_MODEL = ("ngram", "ngram_gpu", "suffix", "extract_hidden_states", "custom_class")
#: vLLM 0.32's enums as /server_info dumps them (by value) → their names, as the log line prints them.
_CUDAGRAPH_MODES: dict[Any, str] = {0: "NONE", 1: "PIECEWISE", 2: "FULL", (2, 0): "FULL_DECODE_ONLY",
                                    (2, 1): "FULL_AND_PIECEWISE"}
_COMPILATION_MODES: dict[Any, str] = {0: "NONE", 1: "STOCK_TORCH_COMPILE", 2: "DYNAMO_TRACE_ONCE",
                                      3: "VLLM_COMPILE"}


def _enum_name(value: Any, names: dict[Any, str]) -> Any:
    key = tuple(value) if isinstance(value, list) else value
    try:
        return names.get(key, value)
    except TypeError:  # unhashable: not one of ours
        return value


def _dtype(value: Any) -> Any:
    """`torch.float32` (both sources print torch's repr) → `float32`, as `--dtype` spells it."""
    return value[len("torch."):] if isinstance(value, str) and value.startswith("torch.") else value


def _compilation(cc: Any) -> dict[str, Any]:
    """The CUDA-graph and compilation settings of a compilation config (a dict from either source)."""
    if not isinstance(cc, dict):
        return {}
    out: dict[str, Any] = {}
    if "mode" in cc:
        out["compilation_mode"] = _enum_name(cc["mode"], _COMPILATION_MODES)
    elif "level" in cc:  # vLLM before `mode` (CompilationLevel numbers are not CompilationMode's)
        out["compilation_level"] = cc["level"]
    if "cudagraph_mode" in cc:
        out["cudagraph_mode"] = _enum_name(cc["cudagraph_mode"], _CUDAGRAPH_MODES)
    for key in ("cudagraph_capture_sizes", "max_cudagraph_capture_size"):
        if key in cc:
            out[key] = cc[key]
    return out


def _speculative(sc: Any) -> dict[str, Any] | None:
    if not isinstance(sc, dict):
        return None
    if "num_spec_tokens" in sc and "num_speculative_tokens" not in sc:  # the log line's repr
        sc = {**sc, "num_speculative_tokens": sc["num_spec_tokens"]}
    out = {key: sc[key] for key in SPECULATIVE_KEYS if key in sc}
    if out.get("method") in _NO_DRAFT_MODEL:
        out["model"] = None
    return out


def engine_config_from_server_info(info: Any) -> dict[str, Any]:
    """The flat engine config from vLLM's `/server_info?config_format=json` answer ({} when it has none)."""
    if not isinstance(info, dict) or not isinstance(info.get("vllm_config"), dict):
        return {}
    vc = info["vllm_config"]
    system: dict[str, Any] = info["system_env"] if isinstance(info.get("system_env"), dict) else {}
    found: dict[str, Any] = {"config_source": "server_info", "vllm_version": system.get("vllm_version")}
    for key, section, name in _FROM_SERVER_INFO:
        part = vc.get(section)
        if isinstance(part, dict) and name in part:
            found[key] = part[name]
    if "dtype" in found:
        found["dtype"] = _dtype(found["dtype"])
    found.update(_compilation(vc.get("compilation_config")))
    found["speculative_config"] = _speculative(vc.get("speculative_config"))
    return found


_CONFIG_LINE = re.compile(r"Initializing a V1 LLM engine \(v(?P<version>[^)]*)\) with config: (?P<config>.*)$")
_OPEN, _CLOSE = "([{", ")]}"
_ENUM_REPR = re.compile(r"<\w+(?:\.\w+)*\.(\w+): [^<>]*>")  # <CUDAGraphMode.NONE: 0> → 'NONE'
_OTHER_REPR = re.compile(r"<[^<>]*>")  # <function f at 0x...> → its text, quoted
_CALL_REPR = re.compile(r"([A-Za-z_]\w*)\((.*)\)", re.S)  # SpeculativeConfig(method='eagle3', ...)


def _scan(text: str, sep: str) -> tuple[list[str], bool]:
    """`text` split at `sep` outside quoted strings and (...), [...], {...} (nested to any depth), and
    whether every bracket and quote it opens is closed in order."""
    parts: list[str] = []
    stack: list[str] = []
    quote, prev, start, i, ok = "", "", 0, 0, True
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"" and prev in ("", *"=([{,:"):
            quote = ch  # a repr'd string starts a value; a quote inside an unquoted path does not
        elif ch in _OPEN:
            stack.append(_CLOSE[_OPEN.index(ch)])
        elif ch in _CLOSE:
            if stack and stack[-1] == ch:
                stack.pop()
            else:
                ok = False
        elif ch == sep and not stack:
            parts.append(text[start:i])
            start = i + 1
        if not ch.isspace():
            prev = ch
        i += 1
    parts.append(text[start:])
    return parts, ok and not stack and not quote


def _split_top(text: str, sep: str) -> list[str]:
    return _scan(text, sep)[0]


def _balanced(text: str) -> bool:
    return _scan(text, ",")[1]


def _pairs(text: str) -> dict[str, Any]:
    """`k=v, k2=v2` at the top level → {k: parsed v}; a part without `=` belongs to the value before it."""
    out: dict[str, Any] = {}
    raw: dict[str, str] = {}
    last = None
    for part in _split_top(text, ","):
        key, eq, value = part.partition("=")
        if eq and re.fullmatch(r"\s*\w+\s*", key):
            last = key.strip()
            raw[last] = value
        elif last is not None:
            raw[last] += "," + part
    for key, value in raw.items():
        out[key] = _value(value)
    return out


def _value(raw: str) -> Any:
    """One value of the log line: a Python literal, `Name(k=v, ...)` (→ dict), or else its text."""
    raw = raw.strip()
    call = _CALL_REPR.fullmatch(raw)
    if call and _balanced(call[2]):
        fields = _pairs(call[2])
        if fields or not call[2].strip():
            return fields
        return raw  # a call without k=v fields, like PosixPath('/x'): its text
    literal = _OTHER_REPR.sub(lambda m: repr(m[0][1:-1]), _ENUM_REPR.sub(lambda m: repr(m[1]), raw))
    try:
        return ast.literal_eval(literal)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return raw


def _compilation_from_text(text: str) -> dict[str, Any]:
    """The compilation fields of a compilation_config that is no Python literal, found by pattern."""
    out: dict[str, Any] = {}
    m = re.search(r"['\"]mode['\"]\s*:\s*(?:<\w+\.(\w+):[^>]*>|(\d+))", text)
    if m:
        out["compilation_mode"] = m[1] or _COMPILATION_MODES.get(int(m[2]), int(m[2]))
    m = re.search(r"['\"]cudagraph_mode['\"]\s*:\s*(?:<\w+\.(\w+):[^>]*>|(\d+))", text)
    if m:
        out["cudagraph_mode"] = m[1] or _CUDAGRAPH_MODES.get(int(m[2]), int(m[2]))
    m = re.search(r"['\"]cudagraph_capture_sizes['\"]\s*:\s*(\[[^\]]*\]|None)", text)
    if m:
        literal = re.fullmatch(r"\[[\d,\s]*\]|None", m[1])
        out["cudagraph_capture_sizes"] = ast.literal_eval(m[1]) if literal else m[1]
    m = re.search(r"['\"]max_cudagraph_capture_size['\"]\s*:\s*(\d+|None)", text)
    if m:
        out["max_cudagraph_capture_size"] = None if m[1] == "None" else int(m[1])
    return out


def parse_config_line(config: str) -> dict[str, Any]:
    """`k=v, ...` of vLLM's start-up line → {k: value}; nested (...), [...], {...} values stay whole.

    Values are Python literals where they are one (`1024`, `True`, `'auto'`, lists, dicts with vLLM's
    enums as their names), `Name(k=v, ...)` reprs become dicts, anything else stays its text."""
    return _pairs(config)


def parse_engine_config(log_text: str) -> dict[str, Any]:
    """The flat engine config from vLLM's start-up log line (`... with config: k=v, ...`); {} without one.

    The fallback when /server_info is not served: the line (VllmConfig.__str__) has no
    max_num_batched_tokens or max_num_seqs, so those keys are absent."""
    for line in log_text.splitlines():
        match = _CONFIG_LINE.search(line)
        if not match:
            continue
        parsed = parse_config_line(match["config"])
        found: dict[str, Any] = {"config_source": "log", "vllm_version": match["version"]}
        for key, name in _FROM_LOG_LINE:
            if name in parsed:
                found[key] = parsed[name]
        if "dtype" in found:
            found["dtype"] = _dtype(found["dtype"])
        cc = parsed.get("compilation_config")
        found.update(_compilation(cc) if isinstance(cc, dict) else _compilation_from_text(str(cc or "")))
        found["speculative_config"] = _speculative(parsed.get("speculative_config"))
        return found
    return {}
