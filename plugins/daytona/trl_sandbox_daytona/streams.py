"""Separate stdout and stderr over Daytona's ``process.exec``, which merges them.

Daytona's daemon runs the command text in a shell and returns one combined output. Sessions
would return the streams apart, but cost extra calls per program and lose the daemon's
process-group timeout. Instead the command itself keeps them apart, in the same single call:

    { { rm -f -- STDIN; PROGRAM 2>ERR; } <STDIN; rc=$?;
      printf '%s' '[trl-sandbox:NONCE:stderr]'; cat -- ERR; rm -f -- ERR;
      printf '%s%s]\n' '[trl-sandbox:NONCE:exit=' "$rc"; exit "$rc"; }

and the host splits the output at the *last* pair of markers. The daemon's timeout, ``cwd`` and
``env`` apply unchanged, and the exit code still comes from the daemon (the shell exits with the
program's status).

Why it cannot be fooled by the program: the markers carry a fresh random nonce that is only in
the script text, which the shell reads from the daemon's pipe and parses as one ``{ ... }`` group
before running anything (so the pipe holds nothing of it by the time the program starts), and
``printf`` is a shell builtin (the nonce is never in any process's argv). Markers the program
prints itself come *before* the shell's real ones, and splitting uses the last ones. Output that
orphaned background processes write after the trailer is kept as stdout. If the shell is killed
before it prints the trailer, the result is marked incomplete (``truncated``): what was captured
stays stdout, nothing is guessed.
"""

from __future__ import annotations

import shlex


def _markers(nonce: str) -> tuple[str, str]:
    return f"[trl-sandbox:{nonce}:stderr]", f"[trl-sandbox:{nonce}:exit="


def split_streams_script(program: str, nonce: str, err_path: str, stdin_path: str | None,
                         heredoc: str | None = None, tag: str | None = None) -> str:
    """The shell command that runs ``program`` (already shell-quoted) with split streams.

    ``heredoc`` (base64 text) travels in the command itself as the program's stdin: a here-document
    after the one-line group, read by the shell with the script before anything runs, so stdin
    needs no upload of its own (the lease launcher decodes it).

    With the lease launcher's ``tag``, nothing a program can touch is on the shell's own path: the
    stderr file is made new (never one that exists), opened twice and unlinked before the launcher
    starts, and read back through the shell's own descriptor: a program that replaces the path (a
    FIFO, a file where its directory was) changes nothing. A stderr file that cannot be made is the
    launcher's failure (the sandbox is replaced), never the program's verdict."""
    if not nonce.isalnum():
        raise ValueError("the nonce must be alphanumeric (it is embedded in single quotes)")
    start, end = _markers(nonce)
    err = shlex.quote(err_path)
    if tag is not None:
        if not tag.isalnum():
            raise ValueError("the tag must be alphanumeric")
        opened = (f"if {{ set -C; : >{err}; }} 2>/dev/null; then set +C; exec 8<{err} 9>>{err}; rm -f -- {err}; "
                  f"else printf '%s\n' '[trl-sandbox-lease:{tag}:failed] cannot make the stderr file'; exit 125; fi; ")
        if heredoc is not None:
            delimiter = f"TRL_STDIN_{nonce}"
            run = f"{{ {program} 2>&9 8<&- 9>&-; }} <<'{delimiter}'"
            tail = f"\n{heredoc.rstrip(chr(10))}\n{delimiter}\n"
        else:
            src = shlex.quote(stdin_path) if stdin_path is not None else None
            run = (f"{{ {program} 2>&9 8<&- 9>&-; }} </dev/null" if src is None
                   else f"{{ rm -f -- {src}; {program} 2>&9 8<&- 9>&-; }} <{src}")
            tail = ""
        return (
            f"{{ {opened}{run}; rc=$?; exec 9>&-; printf '%s' '{start}'; cat <&8; exec 8<&-; "
            f"printf '%s%s]\\n' '{end}' \"$rc\"; exit \"$rc\"; }}{tail}"
        )
    if heredoc is not None:
        delimiter = f"TRL_STDIN_{nonce}"  # never in base64 text (no underscore there)
        run = f"{{ {program} 2>{err}; }} <<'{delimiter}'"
        return (
            f"{{ {run}; rc=$?; printf '%s' '{start}'; cat -- {err} 2>/dev/null; rm -f -- {err}; "
            f"printf '%s%s]\\n' '{end}' \"$rc\"; exit \"$rc\"; }}\n{heredoc.rstrip(chr(10))}\n{delimiter}\n"
        )
    if stdin_path is None:
        # The daemon feeds the command text to the shell on its stdin: never let the program read it.
        run = f"{{ {program} 2>{err}; }} </dev/null"
    else:
        src = shlex.quote(stdin_path)
        run = f"{{ rm -f -- {src}; {program} 2>{err}; }} <{src}"
    return (
        f"{{ {run}; rc=$?; printf '%s' '{start}'; cat -- {err} 2>/dev/null; rm -f -- {err}; "
        f"printf '%s%s]\\n' '{end}' \"$rc\"; exit \"$rc\"; }}"
    )


def split_streams(output: str, nonce: str) -> tuple[str, str, bool]:
    """``(stdout, stderr, complete)`` from the combined output of ``split_streams_script``."""
    start, end = _markers(nonce)
    j = output.rfind(end)
    if j < 0:  # no trailer: the shell died first, or the daemon cut the output
        i = output.rfind(start)
        if i < 0:
            return output, "", False
        return output[:i], output[i + len(start):], False
    i = output.rfind(start, 0, j)
    close = output.find("]\n", j)
    late = output[close + 2:] if close >= 0 else ""
    if i < 0:
        return output[:j] + late, "", False
    return output[:i] + late, output[i + len(start):j], True
