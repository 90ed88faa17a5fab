"""The resident launcher: one warm interpreter per remote sandbox that starts each exec's launcher as
a fork, so that a clean lease costs a shell and a fork, not a second Python interpreter per program.

A fresh ``python3`` with ``ctypes`` costs about 15 ms of CPU before the launcher does anything: as
much as the program it isolates. So where the image allows PID namespaces, the probe that prepares
a new sandbox leaves this process running (in a session of its own, beyond the reach of every
program: each runs in its own PID namespace, and the resident's directory is hidden under an empty
read-only tmpfs in each program's mount namespace). An exec is then a small ``sh`` script
(``trl_sandbox.remote.lease.CLIENT``) that makes a FIFO for the answer, writes its own pid into the
resident's request FIFO and waits. The resident forks a handler, which reads the exec's spec and
argv from the script's command line and its environment from ``/proc``, opens the script's own
standard streams through ``/proc/PID/fd`` and forks the launcher proper (``launch``), exactly as a
fresh launcher would run, then answers the exit status (or the signal) on the script's FIFO. The
script leaves with that status; the launcher's own lines (``failed``, ``timeout``) were written to
its stdout as before.

Whatever goes wrong before the launcher starts (the resident is gone, a stream cannot be reopened)
fails the exec as the sandbox's fault, before the program ran (the provider raises
``SandboxGoneError`` and the pool runs the program on another sandbox): never twice, never as the
program's result. A script killed by the daemon's time limit takes its program with it (the
handler follows the script's pid). A request is taken by renaming its answer FIFO, so a repeated
pid runs nothing, and a pid without one costs no fork. The resident is only started where the probe
could hide its directory from programs. Standard library only, Python 3.8+, Linux; sent with the
launcher.
"""

import os
import select
import time

RESIDENT_DIR = "/dev/shm/.trl-sandbox-lease"
MARK = b"trl-sandbox-lease"  # the script's $0: what follows it on its command line is SPEC ARGV...


def start_resident(where, launch):
    """From the probe: leave a resident serving ``where``; True once it is ready."""
    ready_r, ready_w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(ready_r)
        os.setsid()
        if os.fork() == 0:
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            try:
                serve(where, launch, ready_w)
            finally:
                os._exit(0)
        os._exit(0)
    os.close(ready_w)
    os.waitpid(child, 0)
    answer = os.read(ready_r, 16)
    os.close(ready_r)
    return answer == b"ok"


def serve(where, launch, ready):
    import _signal as signal

    os.makedirs(where, mode=0o700, exist_ok=True)
    os.chmod(where, 0o700)
    fifo = os.path.join(where, "q")
    if os.path.lexists(fifo):
        os.unlink(fifo)
    os.mkfifo(fifo, 0o600)
    requests = os.open(fifo, os.O_RDWR)  # never at end of file: we hold a writer too
    with open(os.path.join(where, "pid.new"), "w") as fh:
        fh.write(f"{os.getpid()}\n")
    os.rename(os.path.join(where, "pid.new"), os.path.join(where, "pid"))
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # handlers are reaped by the kernel
    os.write(ready, b"ok")
    os.close(ready)
    pending = b""
    while True:
        try:
            chunk = os.read(requests, 4096)
        except InterruptedError:
            continue
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            # Only a request whose script made its answer FIFO: no fork for anything else.
            if not line.strip().isdigit() or not os.path.exists(os.path.join(where, f"c.{int(line)}")):
                continue
            if os.fork() == 0:
                os.close(requests)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                handle(int(line), where, launch)


def handle(client, where, launch):
    """Run one exec for the script ``client``, answer its status on ``where/c.CLIENT``, exit."""
    answer = "F"  # before the launcher starts: the exec fails as the sandbox's, never runs twice
    reply = os.path.join(where, f"c.{client}")
    # One handler takes a request (the rename); a repeated pid finds nothing to take.
    try:
        os.rename(reply, reply + ".taken")
    except OSError:
        os._exit(0)
    reply += ".taken"
    try:
        with open(f"/proc/{client}/cmdline", "rb") as fh:
            words = fh.read().split(b"\0")
        words = [w.decode("utf-8", "surrogateescape") for w in words[words.index(MARK) + 1:-1]]
        spec = eval(words[0], {"__builtins__": {}}, {})  # the literal the host wrote into the script
        with open(f"/proc/{client}/environ", "rb") as fh:
            env = dict(e.decode("utf-8", "surrogateescape").partition("=")[::2] for e in fh.read().split(b"\0") if e)
        # The script's copies of its streams (its own 0 and 1 move around ``read`` and ``echo``).
        streams = [os.open(f"/proc/{client}/fd/{n}", os.O_RDONLY if n == 5 else os.O_WRONLY) for n in (5, 6, 7)]
        child = os.fork()
        if child == 0:
            for n, fd in enumerate(streams):
                os.dup2(fd, n)
            os.environ.clear()
            os.environ.update(env)
            try:
                launch(spec, words[1:])
            finally:
                os._exit(125)
        answer = "125"
        os.close(streams[0])
        os.close(streams[2])
        try:
            status = follow(child, client)
        except Exception as exc:  # noqa: BLE001 - the launcher's own failure, never the program's
            status = None
            os.write(streams[1], f"[trl-sandbox-lease:{spec.get('tag', '')}:failed] resident: {exc}\n".encode())
        if status is not None:
            answer = f"S{os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else str(os.WEXITSTATUS(status))
        os.close(streams[1])
    except Exception:  # noqa: BLE001 - anything before the fork: the script falls back to the launcher
        pass
    try:
        fd = os.open(reply, os.O_WRONLY | os.O_NONBLOCK)  # the script holds it open: never blocks
        os.write(fd, (answer + "\n").encode())
        os.close(fd)
    except OSError:
        pass
    try:
        os.unlink(reply)
    except OSError:
        pass
    os._exit(0)


def follow(child, client):
    """The launcher's wait status; None when the script died first (the daemon's time limit): then
    the launcher is killed, and with it the program's namespace."""
    fds = []
    try:
        fds = [os.pidfd_open(child), os.pidfd_open(client)]
    except (AttributeError, OSError):
        pass
    while True:
        pid, status = os.waitpid(child, os.WNOHANG)
        if pid:
            break
        if fds:
            select.select(fds, [], [], 1.0)
        else:
            time.sleep(0.005)
        if not os.path.exists(f"/proc/{client}") or _zombie(client):
            try:
                os.kill(child, 9)
            except OSError:
                pass
            os.waitpid(child, 0)
            status = None
            break
    for fd in fds:
        os.close(fd)
    return status


def _zombie(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return True
