"""Result lines that are never lost: checked before any work, journaled as they complete.

``trl-sandbox exec`` and ``evaluate`` may run for hours on a paid provider. Their output path is
checked before the first sandbox exists; every result is appended to ``OUTPUT.partial`` (one JSON
line, flushed) the moment it is known; the final file is written in input order at the end and the
journal removed. An interrupted run leaves the journal behind, and ``--resume`` reuses every result
in it whose input line is unchanged (infrastructure failures are run again).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterable
from typing import Any, TextIO

from .sandbox import ConfigError


def line_key(text: str) -> str:
    """What identifies an input line across runs: its content."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


# Errors of the sandbox, not of the program (``exec``'s "error" field starts with the class name).
_INFRA_PREFIXES = ("InfraError", "RateLimitError", "QuotaError", "SandboxError")


def _infra(result: dict[str, Any]) -> bool:
    """A result the sandbox failed to produce: a resumed run tries it again."""
    return result.get("status") == "infra" or str(result.get("error") or "").startswith(_INFRA_PREFIXES)


class ResultsFile:
    """The results of one run. ``path`` ``"-"`` (or None) means standard output, with no journal."""

    def __init__(self, path: str | None, *, resume: bool = False, option: str = "--output") -> None:
        self.path = None if path in (None, "-") else os.path.abspath(path)
        self.journal_path = self.path + ".partial" if self.path else None
        self._journal: TextIO | None = None
        self.reused: dict[int, dict[str, Any]] = {}
        self.journaled = 0
        if self.path is None:
            if resume:
                raise ConfigError("--resume needs an output file (results on standard output cannot be resumed)")
            return
        parent = os.path.dirname(self.path)
        if not os.path.isdir(parent):
            raise ConfigError(f"{option} {path!r}: the directory {parent!r} does not exist; create it first")
        if not os.access(parent, os.W_OK):
            raise ConfigError(f"{option} {path!r}: the directory {parent!r} is not writable")
        if os.path.isdir(self.path):
            raise ConfigError(f"{option} {path!r} is a directory; give a file name")
        self._resume = resume
        self._previous = self._read_journal() if resume else {}
        try:
            self._journal = open(self.journal_path, "a" if resume else "w", encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{option} {path!r}: cannot write {self.journal_path!r}: {exc.strerror}") from None

    def _read_journal(self) -> dict[int, tuple[str, dict[str, Any]]]:
        found: dict[int, tuple[str, dict[str, Any]]] = {}
        for source in (self.journal_path,):
            if not source or not os.path.exists(source):
                continue
            with open(source, encoding="utf-8") as fh:
                for text in fh:
                    try:
                        entry = json.loads(text)
                    except ValueError:
                        continue  # a line cut short by the interruption
                    if isinstance(entry, dict) and isinstance(entry.get("_resume"), list) and len(entry["_resume"]) == 2:
                        index, key = entry.pop("_resume")
                        found[int(index)] = (str(key), entry)
        return found

    def reusable(self, index: int, key: str) -> dict[str, Any] | None:
        """The earlier result for input ``index`` if its line is unchanged and it was no infra failure."""
        hit = getattr(self, "_previous", {}).get(index)
        if hit is None or hit[0] != key or _infra(hit[1]):
            return None
        self.reused[index] = hit[1]
        if self._journal is not None:
            self._write(self._journal, index, key, hit[1])
        return hit[1]

    def add(self, index: int, key: str, result: dict[str, Any]) -> None:
        """Journal one finished result now (called as results complete, in any order)."""
        if self._journal is not None:
            self._write(self._journal, index, key, result)

    def _write(self, fh: TextIO, index: int, key: str, result: dict[str, Any]) -> None:
        fh.write(json.dumps({**result, "_resume": [index, key]}) + "\n")
        fh.flush()
        self.journaled += 1

    def finish(self, results: Iterable[dict[str, Any]]) -> None:
        """Write every result in input order and drop the journal."""
        if self.path is None:
            for result in results:
                sys.stdout.write(json.dumps(result) + "\n")
            sys.stdout.flush()
            return
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            for result in results:
                fh.write(json.dumps(result) + "\n")
        os.replace(tmp, self.path)
        self.close()
        if self.journal_path and os.path.exists(self.journal_path):
            os.remove(self.journal_path)

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None

    def interrupted_note(self) -> str:
        """What to tell the user when the run stops before ``finish``."""
        if not self.journal_path:
            return "results on standard output are lost with the run; use --output FILE to keep them"
        return (f"{self.journaled} finished result(s) are kept in {self.journal_path}; "
                "rerun the same command with --resume to skip them")
