"""A container of its own for each sandbox of a fake remote service (tests and benchmarks only).

The real services give every sandbox a container or a VM: a process a command leaves behind lives
on in it (and only in it) until the sandbox is deleted, ``/tmp`` is the sandbox's own, and a
command sees only that sandbox's processes. A fake that ran commands straight on the host would
hide exactly the leftovers a clean lease must deal with, and would let a sweep in one fake sandbox
kill the test runner. So each fake sandbox is one long-lived bubblewrap: its own user (root inside,
as the services' default images run), PID, IPC and UTS namespaces, the host's root read-only, its
own tmpfs ``/tmp``, ``/var/tmp`` and ``/dev/shm``, and ``--die-with-parent``. Each command is
entered into it with ``nsenter`` (as a vendor's daemon starts commands inside the sandbox): its
orphans are adopted by the container's init and stay alive for the next command, exactly like on
the real services, and deleting the sandbox kills the container with everything in it.

``FakeContainer.argv(argv)`` is the host argv that runs ``argv`` inside; ``write``/``read`` move a
file in or out (through a command inside, so paths resolve as the sandbox sees them); ``kill()``
ends the container. ``python3`` inside is this interpreter, as if it were the image's.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

# bwrap's --die-with-parent follows the *thread* that started it: containers are started from this
# one long-lived thread, not from a server's short-lived request threads.
_SPAWNER = ThreadPoolExecutor(1, thread_name_prefix="fake-container-spawner")

_FILE_OP = (
    "import sys, os\n"
    "op, path = sys.argv[1], sys.argv[2]\n"
    "try:\n"
    "    if op == 'write':\n"
    "        data = sys.stdin.buffer.read()\n"
    "        with open(path, 'wb') as fh: fh.write(data)\n"
    "    else:\n"
    "        with open(path, 'rb') as fh: sys.stdout.buffer.write(fh.read())\n"
    "except OSError as exc:\n"
    "    sys.stderr.write(f'{exc.errno} {exc.strerror}'); sys.exit(2)\n"
)


class FileError(OSError):
    pass


def available() -> bool:
    return shutil.which("bwrap") is not None and shutil.which("nsenter") is not None


_PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm")


def _visible_python() -> str:
    """An interpreter the container can see. Its /tmp, /var/tmp and /dev/shm are its own, so a
    virtual environment under the host's /tmp (a fresh clone in ``mktemp -d``) is not there: fall
    back to the interpreter it links to, then the system's."""
    def hidden(path: str) -> bool:
        return any(path == d or path.startswith(d + "/") for d in _PRIVATE_DIRS)
    for path in (sys.executable, os.path.realpath(sys.executable), "/usr/local/bin/python3", "/usr/bin/python3"):
        if path and os.path.exists(path) and not hidden(os.path.abspath(path)) and not hidden(os.path.realpath(path)):
            return path
    raise RuntimeError("the fake sandbox needs a python3 outside /tmp, /var/tmp and /dev/shm")


class FakeContainer:
    def __init__(self) -> None:
        self._bwrap = _SPAWNER.submit(
            subprocess.Popen,
            ["bwrap", "--unshare-user", "--uid", "0", "--gid", "0", "--unshare-pid", "--unshare-ipc",
             "--unshare-uts", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
             "--perms", "1777", "--tmpfs", "/tmp", "--perms", "1777", "--tmpfs", "/var/tmp",
             "--perms", "1777", "--tmpfs", "/dev/shm", "--die-with-parent", "--chdir", "/",
             "--", "sleep", "infinity"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
        ).result()
        self.init = self._find_init()
        self.python = _visible_python()
        bindir = os.path.dirname(self.python)
        self.env = {"PATH": os.pathsep.join([bindir, "/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"]),
                    "HOME": "/tmp", "LANG": "C.UTF-8"}

    def _find_init(self) -> int:
        """The container's PID 1 (bwrap's inner process), as the host numbers it."""
        deadline = time.monotonic() + 10
        path = f"/proc/{self._bwrap.pid}/task/{self._bwrap.pid}/children"
        while time.monotonic() < deadline:
            try:
                with open(path) as fh:
                    children = fh.read().split()
            except OSError:
                children = []
            if children:
                init = int(children[0])
                # Ready once bwrap's init has started the keeper process inside.
                try:
                    with open(f"/proc/{init}/task/{init}/children") as fh:
                        if fh.read().split():
                            return init
                except OSError:
                    pass
            if self._bwrap.poll() is not None:
                raise RuntimeError(f"bwrap failed: {self._bwrap.stderr.read().decode(errors='replace')}")
            time.sleep(0.002)
        raise RuntimeError("the fake sandbox's container did not start")

    def run_outside(self, argv: list[str]) -> str:
        """Run ``argv`` in the container outside every lease, as the service's daemon would
        (``python3`` is the container's interpreter); its stdout."""
        argv = [self.python if a == "python3" else a for a in argv]
        return subprocess.run(self.argv(argv), env=self.env, capture_output=True, text=True, timeout=30).stdout

    def argv(self, argv: list[str], cwd: str = "/") -> list[str]:
        """Host argv running ``argv`` inside the container, as its root, in ``cwd`` (entered inside:
        nsenter's own --wd would open the host's path)."""
        enter = ["nsenter", "-t", str(self.init), "-U", "-m", "-p", "-i", "-u", "-r", "-w", "--preserve-credentials", "--"]
        if cwd in ("", "/"):
            return [*enter, *argv]
        return [*enter, "/bin/sh", "-c", 'cd -- "$1" || exit 1; shift; exec "$@"', "sh", cwd, *argv]

    def _file_op(self, op: str, path: str, data: bytes = b"") -> bytes:
        done = subprocess.run(self.argv([self.python, "-I", "-S", "-c", _FILE_OP, op, path]), input=data,
                              capture_output=True, env=self.env, timeout=60)
        if done.returncode == 2:
            errno, _, message = done.stderr.decode(errors="replace").partition(" ")
            raise FileError(int(errno) if errno.isdigit() else 5, message, path)
        if done.returncode != 0:
            raise FileError(5, f"file operation failed: {done.stderr!r}", path)
        return done.stdout

    def write(self, path: str, data: bytes) -> None:
        self._file_op("write", path, data)

    def read(self, path: str) -> bytes:
        return self._file_op("read", path)

    def isdir(self, path: str) -> bool:
        """Whether ``path`` is a directory as the sandbox sees it (looked up through its root)."""
        return os.path.isdir(f"/proc/{self.init}/root/{path.lstrip('/')}")

    def kill(self) -> None:
        """Delete the sandbox: its init dies, and the kernel kills everything in its namespace."""
        for pid in (self.init, self._bwrap.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self._bwrap.wait(5)
        except subprocess.TimeoutExpired:
            pass
        if self._bwrap.stderr:
            self._bwrap.stderr.close()
