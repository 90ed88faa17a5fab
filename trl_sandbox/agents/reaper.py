"""The verifier's command under a reaper: nothing it orphans outlives its orphaning by more than a
few milliseconds, and nothing at all outlives the command.

Why: Harbor's convention is that the verifier's script writes ``/logs/verifier/reward.txt`` last.
When the tests run the agent's code (a program of the agent's run by a test, a package the tests
import in a child process), that code can leave a daemon behind that waits for the script's write
and overwrites it with a 1, before the script has even exited: a review of the built-in
``fix-median`` found this pass every time. Such a daemon is an orphan from the moment the process
that started it ends. The reaper makes itself the child subreaper of the command (``prctl
PR_SET_CHILD_SUBREAPER``), so every orphan of the command becomes its child, and kills each one as
it arrives (it looks every ``POLL_S``); when the command ends it kills whatever is left and exits
with the command's status.

What remains: a process started by the very process whose end precedes the write (a daemon forked
by pytest's own process, when pytest is the command and the tests import the agent's code) is no
orphan until that process exits, and can act in the instant before. See docs/agents.md.
"""

from __future__ import annotations

POLL_S = 0.001
CANNOT_GUARD = 125  # the exit status when the kernel refuses the subreaper (the host raises InfraError)
MARKER = "trl-sandbox reaper: cannot become a subreaper"

# Run as ``python3 -I -c REAPER COMMAND``: only the standard library, none of the task's paths.
REAPER = r'''
import ctypes, os, signal, sys, time

def children(me):
    try:  # the kernel's own list of this process's children (CONFIG_PROC_CHILDREN): one read
        with open(f"/proc/{me}/task/{me}/children", "rb") as f:
            return [int(pid) for pid in f.read().split()]
    except OSError:
        pass
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:
            found.append(int(name))
    return found

def kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass

if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
    sys.stderr.write("@MARKER@\n")
    sys.exit(@CANNOT@)
me = os.getpid()
main = os.fork()
if main == 0:
    os.execv("/bin/sh", ["/bin/sh", "-c", sys.argv[1]])
status = None
while status is None:
    while True:
        try:
            pid, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            pid = 0
        if pid == 0:
            break
        if pid == main:
            status = st
    if status is None:
        for pid in children(me):
            if pid != main:
                kill(pid)
        time.sleep(@POLL@)
while True:
    for pid in children(me):
        kill(pid)
    try:
        os.waitpid(-1, 0)
    except ChildProcessError:
        break
sys.exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
'''.replace("@MARKER@", MARKER).replace("@CANNOT@", str(CANNOT_GUARD)).replace("@POLL@", str(POLL_S))


def reaped(command: str) -> list[str]:
    """The argv that runs ``command`` (a ``/bin/sh -c`` string) under the reaper."""
    return ["/bin/sh", "-c", 'exec python3 -I -c "$1" "$2"', "trl-sandbox-reaper", REAPER, command]
