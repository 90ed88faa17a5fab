"""The parts of an episode that are not the episode: how a command's result becomes the model's
observation, and how a row's episode columns are read (``environment.py`` uses them)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from trl_sandbox.sandbox import ConfigError, ExecResult, InfraError
from trl_sandbox.scoring.clip import clip_text, utf8_size


def _render(result: ExecResult, limit: int) -> str:
    """A command's result as the model's observation: its status, then stdout and stderr, at most
    ``limit`` bytes of UTF-8 of output in all, each stream cut in its middle with a marker
    ``... [N bytes cut] ...`` (see ``clip.clip_text``).

    The observation stays in the conversation for the rest of the episode, and a command may write
    16 MiB to each stream: each stream is clipped on its own first, so that the host never builds
    the two floods joined (the old ``stdout + stderr`` cost another copy of both).
    """
    out, err = result.stdout, result.stderr
    if out and err:
        # The shorter stream keeps what it needs up to half the room; the other gets the rest.
        half = limit // 2
        out_short = clip_text(out, half)
        err_short = clip_text(err, half)
        if out_short is out:
            err = clip_text(err, max(0, limit - 1 - utf8_size(out)))
        elif err_short is err:
            out = clip_text(out, max(0, limit - 1 - utf8_size(err)))
        else:
            out, err = out_short, clip_text(err, max(0, limit - 1 - half))
        text = out + "\n" + err
    else:
        text = clip_text(out or err, limit)
    status = "timed out" if result.timed_out else f"exit code {result.exit_code}"
    return f"[{status}]\n{text}" if text else f"[{status}]"


def _attempts(value: Any, what: str) -> int | None:
    """An attempt budget: ``None`` or a positive whole number; a ``ConfigError`` saying so otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{what} must be a positive whole number of test runs (or None for no bound), not {value!r}")
    return value


def _text(exc: BaseException) -> str:
    return str(exc).encode("utf-8", "backslashreplace").decode("utf-8")[:500]


def _row_name(row: Mapping[str, Any]) -> str:
    return f"task_id={row.get('task_id')!r}" if row.get("task_id") is not None else "(no task_id)"


def _row_files(row: Mapping[str, Any]) -> dict[str, bytes]:
    """``row["files"]`` (a mapping or its JSON) as path -> bytes; a ``ConfigError`` naming the row if unusable."""
    files = row.get("files") or {}
    try:
        if isinstance(files, str):
            files = json.loads(files)
        if not isinstance(files, Mapping):
            raise TypeError(f"a mapping of path -> text is needed, not {type(files).__name__}")
        return {str(path): (text if isinstance(text, bytes) else str(text).encode()) for path, text in files.items()}
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"dataset row {_row_name(row)}: its 'files' column is unusable: {exc}") from exc


async def _with_deadline(coro, seconds: float):
    import asyncio

    try:
        return await asyncio.wait_for(coro, seconds)
    except asyncio.TimeoutError as exc:
        raise InfraError(f"the sandbox did not answer within {seconds:.0f} s") from exc
