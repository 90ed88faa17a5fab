"""The Dockerfile's syntax, as Docker reads it: logical lines, words, variable substitution.

``logical_lines`` joins continued lines (a trailing backslash), drops comments and blank lines,
reads the parser directives at the top (``# syntax=`` is ignored; ``# escape=`` other than a
backslash is refused) and refuses heredocs (``RUN <<EOF``), which need lines this reader would
otherwise mistake for instructions. ``words`` splits an instruction's arguments the way Docker
does for ``COPY``, ``ENV``, ``WORKDIR``, ``FROM``, ``ARG``: single quotes are literal, double
quotes and bare words substitute ``$NAME``, ``${NAME}``, ``${NAME:-word}`` and ``${NAME:+word}``
(an unset name is empty), a backslash escapes the next character. ``RUN`` is never substituted
here: its shell does it, with the ``ENV`` and ``ARG`` values exported in front of it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from trl_sandbox.sandbox import ConfigError

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# ``<<EOF``, ``<<-EOF``, ``<<"EOF"``: a BuildKit heredoc (a shell's ``<<<`` here-string is not one)
HEREDOC = re.compile(r"(?<![<\\])<<-?\s*([\"']?)[A-Za-z_][A-Za-z0-9_]*\1(?![<\w])")
DIRECTIVE = re.compile(r"#\s*([A-Za-z]+)\s*=\s*(.*?)\s*$")


@dataclass(frozen=True)
class Line:
    """One instruction: its keyword (upper case), its argument text, where it starts."""

    number: int  # 1-based line of the Dockerfile where the instruction starts
    keyword: str
    args: str
    source: str  # e.g. "tasks/fix-bug/environment/Dockerfile", for messages

    def where(self) -> str:
        return f"{self.source} line {self.number} ({self.keyword})"

    def error(self, message: str) -> ConfigError:
        return ConfigError(f"{self.where()}: {message}")


def logical_lines(text: str, source: str = "Dockerfile") -> list[Line]:
    """The instructions of a Dockerfile, continuation lines joined, comments dropped."""
    raw = text.splitlines()
    start = 0
    for start, line in enumerate(raw):  # parser directives: comment lines at the very top
        match = DIRECTIVE.match(line.strip())
        if not match:
            break
        key, value = match.group(1).lower(), match.group(2)
        if key == "escape" and value != "\\":
            raise ConfigError(f"{source} line {start + 1}: the escape directive {value!r} is not supported; "
                              "use the default backslash")
    else:
        start = len(raw)
    lines: list[Line] = []
    pending: list[str] = []
    first = 0
    for index in range(start, len(raw)):
        line = raw[index]
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue  # a comment or a blank line, also inside a continued instruction
        if not pending:
            first = index + 1
        if line.rstrip().endswith("\\"):
            pending.append(line.rstrip()[:-1])
            continue
        pending.append(line)
        lines.append(_instruction("".join(pending), first, source))
        pending = []
    if pending:
        lines.append(_instruction("".join(pending), first, source))
    return lines


def _instruction(text: str, number: int, source: str) -> Line:
    keyword, args = re.match(r"(\S+)\s*(.*)", text.strip(), re.S).groups()
    line = Line(number=number, keyword=keyword.upper(), args=args.strip(), source=source)
    if line.keyword in ("RUN", "COPY", "ADD") and HEREDOC.search(line.args):
        raise line.error("heredocs (<<EOF) are not supported; put the script in a file next to the "
                         "Dockerfile, COPY it and RUN it")
    return line


def exec_form(args: str) -> list[str] | None:
    """The JSON array of an exec-form instruction (``RUN ["a", "b"]``), else ``None`` (the shell
    form, as Docker reads an argument that is not a valid JSON array of strings)."""
    if not args.startswith("["):
        return None
    try:
        value = json.loads(args)
    except ValueError:
        return None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return None


def split_flags(line: Line, allowed: dict[str, str]) -> tuple[dict[str, str], str]:
    """Leading ``--name=value`` flags of an instruction, each checked against ``allowed``
    (name -> why it is refused, or "" when accepted); the rest of the arguments."""
    flags: dict[str, str] = {}
    rest = line.args
    while rest.startswith("--"):
        word, _, rest = rest.partition(" ")
        rest = rest.lstrip()
        name, _, value = word[2:].partition("=")
        if name not in allowed:
            raise line.error(f"the flag --{name} is not supported")
        if allowed[name]:
            raise line.error(f"the flag --{name} is not supported: {allowed[name]}")
        flags[name] = value
    return flags, rest


def words(line: Line, text: str, lookup: Callable[[str], str | None]) -> list[str]:
    """``text`` split into words with Docker's quoting and ``lookup``'s variables."""
    out: list[str] = []
    current: list[str] = []
    started = False
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in " \t":
            if started:
                out.append("".join(current))
                current, started = [], False
            i += 1
            continue
        started = True
        if c == "'":
            end = text.find("'", i + 1)
            if end < 0:
                raise line.error("an unterminated single quote")
            current.append(text[i + 1:end])
            i = end + 1
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                if text[i] == "\\" and i + 1 < n and text[i + 1] in '"\\$':
                    current.append(text[i + 1])
                    i += 2
                elif text[i] == "$":
                    value, i = _substitute(line, text, i, lookup)
                    current.append(value)
                else:
                    current.append(text[i])
                    i += 1
            if i >= n:
                raise line.error("an unterminated double quote")
            i += 1
        elif c == "\\":
            current.append(text[i + 1] if i + 1 < n else "")
            i += 2
        elif c == "$":
            value, i = _substitute(line, text, i, lookup)
            current.append(value)
        else:
            current.append(c)
            i += 1
    if started:
        out.append("".join(current))
    return out


def substitute(line: Line, text: str, lookup: Callable[[str], str | None]) -> str:
    """``text`` with its variables substituted, quotes and spaces kept as they are."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "$":
            value, i = _substitute(line, text, i, lookup)
            out.append(value)
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _substitute(line: Line, text: str, i: int, lookup: Callable[[str], str | None]) -> tuple[str, int]:
    """The value of the variable reference at ``text[i] == "$"`` and the index after it."""
    if text.startswith("${", i):
        end = text.find("}", i + 2)
        if end < 0:
            raise line.error("an unterminated ${...}")
        body = text[i + 2:end]
        match = NAME.match(body)
        if not match:
            raise line.error(f"${{{body}}} is not a variable reference this reader knows")
        name, rest = match.group(0), body[match.end():]
        value = lookup(name)
        if rest == "":
            return value or "", end + 1
        if rest.startswith(":-"):
            return (value if value else rest[2:]), end + 1
        if rest.startswith(":+"):
            return (rest[2:] if value else ""), end + 1
        raise line.error(f"${{{body}}}: only ${{NAME}}, ${{NAME:-word}} and ${{NAME:+word}} are supported")
    match = NAME.match(text, i + 1)
    if not match:
        return "$", i + 1
    return lookup(match.group(0)) or "", match.end()
