"""Python programs without an interpreter start per test, for the I/O judge (``judge/io_runner.py``).

A fresh ``python3`` costs 10 to 40 ms before the program's first line; a test of an easy problem
costs about 1 ms. So the runner forks a warm interpreter (the "zygote") as soon as it has read the
program and before it reads any test: the zygote's memory holds the program's own source and
nothing of the tests, and every test's process is a fork of it that runs the compiled program in a
fresh ``__main__`` with fresh standard streams, exactly as ``python3 -I main.py`` would (exit
status, tracebacks, ``SystemExit``, ``atexit``, threads joined). The zygote gets each test's
descriptors over a socket pair, forks, reports the child's pid and then its wait status and CPU
time. A program that kills or stops the zygote only loses its own speed: the runner falls back to a
fresh interpreter per test, and a stopped zygote is a stopped program (its time limit ends it).
Standard library only; sent into the sandbox with the runner's text.
"""

import json
import os
import socket
import sys

if "enter" not in globals():
    from trl_sandbox.judge.io_process import enter, guard

WARM_ARGV = ["python3", "-I", "main.py"]


def run_program(code):
    """In the test's process: be ``python3 -I main.py`` and never return."""
    import io
    import types

    status = 0
    try:
        sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)),
                                                     encoding="utf-8")
        sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)),
                                                       encoding="utf-8")
        sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
                                                       encoding="utf-8", errors="backslashreplace", line_buffering=True)
        os.environ["HOME"] = os.getcwd()  # the rest of the environment the zygote set once
        sys.argv = ["main.py"]
        main = types.ModuleType("__main__")
        main.__file__ = "main.py"
        import builtins

        main.__builtins__ = builtins
        sys.modules["__main__"] = main
        try:
            exec(code, main.__dict__)
        except SystemExit as exc:
            code_ = exc.code
            if code_ is None:
                status = 0
            elif isinstance(code_, int):
                status = code_ & 0xFF
            else:
                sys.stderr.write(f"{code_}\n")
                status = 1
        except BaseException as exc:  # noqa: BLE001 - what the interpreter does with an uncaught exception
            import traceback

            # From the program's own first frame, as a fresh interpreter prints it.
            traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
            status = 1
        threading = sys.modules.get("threading")
        if threading is not None and hasattr(threading, "_shutdown"):
            threading._shutdown()
        import atexit

        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                status = status or 120
    finally:
        os._exit(status)


def zygote(sock, source_r):
    """The zygote: read the program, then one fork per request until the runner closes its end."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    if guard() is not None:
        os._exit(0)  # no test may run unguarded: the runner starts them cold, under its own filter
    data = b""
    while True:
        chunk = os.read(source_r, 1 << 16)
        if not chunk:
            break
        data += chunk
    os.close(source_r)
    if not data:
        os._exit(0)  # not a warm language
    loaded = json.loads(data.decode("utf-8", "surrogatepass"))
    del data
    try:
        code = compile(loaded["source"], "main.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        sock.send(b"no")
        os._exit(0)
    os.environ.clear()
    os.environ.update(loaded["env"])
    del loaded
    sock.send(b"ok")
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, 256, 3)
        except OSError:
            os._exit(0)
        if not message or len(fds) != 3:
            os._exit(0)
        cwd, cpu, memory_mb = message.decode().split("\0")
        pid = os.fork()
        if pid == 0:
            sock.close()
            enter(cwd, fds[0], fds[1], fds[2], float(cpu), int(memory_mb))
            run_program(code)
        for fd in fds:
            os.close(fd)
        sock.send(f"pid {pid}".encode())
        _, raw, usage = os.wait4(pid, 0)
        sock.send(f"end {raw} {usage.ru_utime + usage.ru_stime}".encode())


class WarmGone(OSError):
    """The zygote could not start a test (the program never ran): start it cold."""


class Warm:
    """The runner's side. The zygote is forked first thing, before the runner reads anything of
    its stdin: its memory never holds the nonce or a test, only what ``load`` sends it."""

    def __init__(self):
        self.pid = self.child = None
        if not hasattr(socket, "send_fds"):
            return  # Python < 3.9: every test starts cold
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        source_r, source_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            ours.close()
            os.close(source_w)
            try:
                zygote(theirs, source_r)
            finally:
                os._exit(0)
        theirs.close()
        os.close(source_r)
        self.pid, self.sock, self.source_w = pid, ours, source_w

    def load(self, source, env):
        """Hand the zygote the program and its environment; False when it cannot serve (the program
        does not compile: the fresh interpreter reports that, traceback and all)."""
        if self.pid is None:
            return False
        try:
            data = json.dumps({"source": source, "env": env}).encode("utf-8", "surrogatepass")
            while data:
                data = data[os.write(self.source_w, data[:1 << 16]):]
            os.close(self.source_w)
            self.source_w = None  # its number is reused: never close it twice
            ok = self.answer(10.0) == b"ok"
        except OSError:
            ok = False
        if not ok:
            self.stop()
        return ok

    def answer(self, within):
        """The zygote's next message; a stopped or stuck zygote is an ``OSError`` after ``within`` s."""
        import select

        if not select.select([self.sock], [], [], within)[0]:
            raise OSError("the warm interpreter does not answer")
        return self.sock.recv(64)

    @property
    def ready(self):
        return self.pid is not None

    def start(self, cwd, stdin_fd, out_fd, err_fd, cpu, memory_mb):
        """Raises ``OSError`` when the zygote is gone or does not answer: the test starts cold."""
        self.child = None
        try:
            socket.send_fds(self.sock, [f"{cwd}\0{cpu or 0}\0{memory_mb or 0}".encode()], [stdin_fd, out_fd, err_fd])
            reply = self.answer(5.0).decode().split()
            self.child = int(reply[1])
        except (OSError, IndexError, ValueError) as exc:
            self.stop()
            raise WarmGone(f"the warm interpreter is gone: {exc}") from None

    def waitable(self):
        return [self.sock] if self.pid is not None and self.child is not None else []

    def poll(self, final=False):
        import select

        if self.pid is None or self.child is None:
            return (9, 0.0) if final or self.pid is None else None
        if not select.select([self.sock], [], [], 2.0 if final else 0)[0]:
            if final:  # killed, yet the zygote does not report it: it is stopped or stuck
                self.stop()
                return 9, 0.0
            return None
        try:
            reply = self.sock.recv(64).decode().split()
            return int(reply[1]), float(reply[2])
        except (OSError, IndexError, ValueError):
            self.stop()
            return 9, 0.0

    def reaped(self):
        """The zygote died and the runner reaped it: forget it without signalling its number."""
        self.pid = -1
        self.stop()

    def stop(self):
        """Lose the zygote (it died, or a program stopped or killed it): later tests start cold."""
        if self.pid is not None:
            try:
                if self.pid > 0:
                    os.kill(self.pid, 9)  # not reaped before this: the number is still the zygote's
            except OSError:
                pass
            self.sock.close()
            if self.source_w is not None:
                os.close(self.source_w)
                self.source_w = None
        self.pid = None
