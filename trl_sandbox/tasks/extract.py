"""Code extraction: from a model completion to the source that will run.

Modes (a task picks one, a dataset may pick one per row with an ``extract`` column):

``body``
    The original example's rule for prompts that end with a function signature and docstring:
    the model continues the function body, and the kept body is the completion's lines up to the
    first non-indented line. Blank lines are kept; the body is later appended to the prompt.
``continue``
    The completion is appended to the prompt as is (HumanEval's rule).
``fence``
    The last ```` ```python ```` fenced block (```` ```py ````, ```` ```python3 ```` or a bare
    ```` ``` ```` fence also count; an unclosed final fence runs to the end of the completion).
``answer``
    The last ``<answer>...</answer>`` block (its content may itself be fenced).
``raw``
    The whole completion.
``auto``
    ``fence``, else ``answer``, else ``raw``.

Chat-style completions (a list of ``{"role", "content"}`` messages, as TRL passes for
conversational datasets) are reduced to the text of their last assistant message first.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

MODES = ("auto", "body", "continue", "fence", "answer", "raw")

_FENCE = re.compile(r"```[ \t]*(?P<lang>[A-Za-z0-9_+.-]*)[^\n]*\n(?P<code>.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_LANGS = {"python", "py", "python3", "py3", ""}
_ANSWER = re.compile(r"<answer>(?P<code>.*?)(?:</answer>|\Z)", re.DOTALL | re.IGNORECASE)


def completion_text(completion: Any) -> str:
    """The text of a completion: a string, a message dict, or a list of chat messages."""
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        return _content_text(completion.get("content"))
    if isinstance(completion, Sequence):
        messages = [m for m in completion if isinstance(m, Mapping)]
        assistant = [m for m in messages if m.get("role", "assistant") == "assistant"]
        chosen = assistant or messages
        return _content_text(chosen[-1].get("content")) if chosen else ""
    return str(completion)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):  # multimodal style: [{"type": "text", "text": ...}]
        parts = []
        for part in content:
            if isinstance(part, Mapping):
                parts.append(str(part.get("text", "")))
            else:
                parts.append(str(part))
        return "".join(parts)
    return str(content)


def fenced_code(text: str) -> str | None:
    """The last Python fenced block of ``text``, or ``None`` when there is none."""
    found = None
    for match in _FENCE.finditer(text):
        if match.group("lang").lower() in _PYTHON_LANGS:
            found = match.group("code")
    return found


def answer_code(text: str) -> str | None:
    """The content of the last ``<answer>`` block (unfenced if fenced), or ``None``."""
    matches = list(_ANSWER.finditer(text))
    if not matches:
        return None
    content = matches[-1].group("code")
    inner = fenced_code(content)
    return inner if inner is not None else content.strip("\n")


def continuation_body(text: str) -> str:
    """The original example's rule: the completion's lines up to the first non-indented line.

    Blank (whitespace-only) lines do not end the body. Trailing whitespace is dropped.
    """
    kept = []
    for line in text.splitlines():
        if line.strip() and not line[:1].isspace():
            break
        kept.append(line)
    return "\n".join(kept).rstrip()


def extract_code(completion: Any, mode: str = "auto") -> str:
    """The code of ``completion`` under ``mode`` (see the module docstring). May be empty."""
    text = completion_text(completion)
    if mode == "body":
        return continuation_body(text)
    if mode in ("raw", "continue"):
        return text
    if mode == "fence":
        return fenced_code(text) or ""
    if mode == "answer":
        return answer_code(text) or ""
    if mode == "auto":
        for found in (fenced_code(text), answer_code(text)):
            if found is not None:
                return found
        return text
    raise ValueError(f"unknown extraction mode {mode!r}; use one of {', '.join(MODES)}")


def has_code(code: str) -> bool:
    """True when ``code`` has anything but whitespace and comments."""
    for line in code.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            return True
    return False


def assemble(prompt: Any, code: str, mode: str) -> tuple[str, int]:
    """The full program for ``code`` and the number of leading lines that come from the prompt.

    In ``body`` and ``continue`` modes the program is the prompt followed by the code (the prompt
    must then be a string: it is the start of the program). In the other modes the code stands alone.
    """
    if mode in ("body", "continue"):
        prefix = prompt if isinstance(prompt, str) else ""
        if mode == "body" and prefix and not prefix.endswith("\n"):
            prefix += "\n"
        return prefix + code + ("\n" if mode == "body" else ""), prefix.count("\n")
    return code, 0
