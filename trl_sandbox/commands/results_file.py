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
import tempfile
from collections.abc import Iterable
from typing import Any, BinaryIO

from trl_sandbox.sandbox import ConfigError


def line_key(text: str) -> str:
    """What identifies an input line across runs: its content."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


# Errors of the sandbox, not of the program (``exec``'s "error" field starts with the class name).
_INFRA_PREFIXES = ("InfraError", "RateLimitError", "QuotaError", "SandboxError")


def _infra(result: dict[str, Any]) -> bool:
    """A result the sandbox failed to produce: a resumed run tries it again."""
    return result.get("status") == "infra" or str(result.get("error") or "").startswith(_INFRA_PREFIXES)


class ResultsFile:
    """The results of one run. ``path`` ``"-"`` (or None) means standard output, with no journal.

    With ``spool=True`` (``exec``, whose results carry up to 16 MiB of output per stream), a
    result lives on the host only while it is written: the journal holds it (for standard output,
    an anonymous temporary file does), ``finish_spooled`` copies the journal's lines to the output
    in input order, and a resumed run indexes the earlier journal by byte offset and reads an
    entry only when it is reused. The host's memory is then bounded by the results in flight, not
    by the batch. Every journal line is ASCII (``json.dumps`` escapes the rest), so that a line's
    length in characters is its length in bytes.
    """

    _RESUME = ', "_resume": ['

    def __init__(self, path: str | None, *, resume: bool = False, option: str = "--output",
                 spool: bool = False) -> None:
        self.path = None if path in (None, "-") else os.path.abspath(path)
        self.journal_path = self.path + ".partial" if self.path else None
        self._journal: BinaryIO | None = None
        self._offset = 0  # where the next journal line starts
        self._lines: dict[int, tuple[int, int]] = {}  # input index -> (offset, length) of its latest line
        self.reused: dict[int, dict[str, Any]] = {}
        self.journaled = 0
        self._previous: dict[int, tuple[str, int, int]] = {}
        self.spool = spool
        if self.path is None:
            if resume:
                raise ConfigError("--resume needs an output file (results on standard output cannot be resumed)")
            if spool:
                self._journal = tempfile.TemporaryFile("w+b")
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
            self._journal = open(self.journal_path, "ab" if resume else "wb")
        except OSError as exc:
            raise ConfigError(f"{option} {path!r}: cannot write {self.journal_path!r}: {exc.strerror}") from None
        self._offset = self._journal.seek(0, os.SEEK_END)

    def _read_journal(self) -> dict[int, tuple[str, int, int]]:
        """Input index -> (key, offset, length) of the last complete line an earlier run left for it.
        Only each line's tail is parsed here; the entry itself is read when it is reused."""
        found: dict[int, tuple[str, int, int]] = {}
        if not self.journal_path or not os.path.exists(self.journal_path):
            return found
        offset = 0
        with open(self.journal_path, "rb") as fh:
            for line in fh:
                at = line.rfind(self._RESUME.encode())
                if at >= 0:
                    try:
                        index, key = json.loads(line[at + len(self._RESUME) - 1:].rstrip(b"\n")[:-1])
                        found[int(index)] = (str(key), offset, len(line))
                    except (ValueError, TypeError):
                        pass  # a line cut short by the interruption
                offset += len(line)
        return found

    def _entry(self, path: str, offset: int, length: int) -> dict[str, Any] | None:
        with open(path, "rb") as fh:
            fh.seek(offset)
            text = fh.read(length)
        try:
            entry = json.loads(text)
        except ValueError:
            return None
        if not isinstance(entry, dict):
            return None
        entry.pop("_resume", None)
        return entry

    def reusable(self, index: int, key: str) -> dict[str, Any] | None:
        """The earlier result for input ``index`` if its line is unchanged and it was no infra failure."""
        hit = self._previous.get(index)
        if hit is None or hit[0] != key or self.journal_path is None:
            return None
        entry = self._entry(self.journal_path, hit[1], hit[2])
        if entry is None or _infra(entry):
            return None
        if not self.spool:
            self.reused[index] = entry
        else:
            self.reused[index] = {}  # counted; the journal keeps it
        if self._journal is not None:
            self._write(self._journal, index, key, entry)
        return entry

    def add(self, index: int, key: str, result: dict[str, Any]) -> None:
        """Journal one finished result now (called as results complete, in any order)."""
        if self._journal is not None:
            self._write(self._journal, index, key, result)

    def _write(self, fh: BinaryIO, index: int, key: str, result: dict[str, Any]) -> None:
        line = (json.dumps({**result, "_resume": [index, key]}) + "\n").encode("ascii")
        fh.write(line)
        fh.flush()
        self._lines[index] = (self._offset, len(line))
        self._offset += len(line)
        self.journaled += 1

    def finish(self, results: Iterable[dict[str, Any]]) -> None:
        """Write every result in input order and drop the journal."""
        self._finish(json.dumps(result) + "\n" for result in results)

    def finish_spooled(self, count: int) -> None:
        """Write the journaled results of inputs ``0 .. count - 1`` in input order, one at a time
        from the journal, and drop it (``spool=True``)."""
        assert self._journal is not None
        self._journal.flush()
        source = self._journal if self.path is None else open(self.journal_path, "rb")  # type: ignore[arg-type]

        def lines():
            for index in range(count):
                offset, length = self._lines[index]
                source.seek(offset)
                line = source.read(length).decode("ascii")
                yield line[:line.rindex(self._RESUME)] + "}\n"  # exactly json.dumps(result)

        try:
            self._finish(lines())
        finally:
            if source is not self._journal:
                source.close()

    def _finish(self, lines: Iterable[str]) -> None:
        if self.path is None:
            for line in lines:
                sys.stdout.write(line)
            sys.stdout.flush()
            self.close()
            return
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            for line in lines:
                fh.write(line)
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
