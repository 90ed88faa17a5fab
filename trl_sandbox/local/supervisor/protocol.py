"""The wire format between the host and the supervisor, and the supervisor's end of the channel.

Protocol (integers little-endian):

* host -> supervisor: ``u32 length`` + ``marshal`` dump (version 4) of a tuple whose first item
  is an opcode: ``(CONFIG, dict)`` once, first; ``(EXEC, argv, stdin_len, timeout_s, cwd|None,
  env|None)`` followed by ``stdin_len`` raw bytes of stdin (spliced straight into a memfd, never
  held in the supervisor's memory); ``(WRITE, path, size, mode)`` followed by ``size`` raw bytes of the file's contents (spliced
  into the file); ``(READ, path)``;
  ``(RESET,)``; ``(PING,)``; ``(ENV, key, workdir|None, size_mb)`` (the lease's copy of a prepared
  environment: ``layers.py``).
* supervisor -> host: a fixed 24-byte header ``kind:u8 flags:u8 pad:2 code:i32 duration:f64
  len1:u32 len2:u32`` followed by ``len1 + len2`` bytes. ``kind`` is ``K`` (ok; the first one,
  sent once the configuration is applied, carries the interpreter version), ``R`` (an exec
  result: code = exit code, flags = timed out / out of memory / truncated, payload = stdout then
  stderr), ``D`` (file contents) or ``E`` (an error: code = errno, payload = message). The host
  needs nothing but ``struct`` to read an answer, and interprets nothing the sandbox could forge.

The host imports this module too (for the constants), so it must import nothing but the stdlib.
"""

import marshal
import os
import struct

OP_CONFIG, OP_EXEC, OP_WRITE, OP_READ, OP_RESET, OP_PING, OP_ENV = 1, 2, 3, 4, 5, 6, 7
# Agent grading (``changes.py``): read an episode's changes, apply them, bring the tests, read the verdict.
OP_CHANGES, OP_APPLY, OP_TESTS, OP_VERDICT = 8, 9, 10, 11
K_OK, K_RESULT, K_DATA, K_ERROR = b"K"[0], b"R"[0], b"D"[0], b"E"[0]
F_TIMED_OUT, F_OOM, F_TRUNCATED = 1, 2, 4
F_WALL = 8  # with F_TIMED_OUT: the wall-clock backstop ended it, not its CPU budget
# Prepared environments (``layers.py``): where the host binds its cache of prepared trees, and the
# mount point of a lease's writable layer.
ENV_ROOT = "/run/trl-sandbox-envs"
ENV_LAYER = "/run/trl-sandbox-layer"
HEADER = struct.Struct("<BBxxidII")
LENGTH = struct.Struct("<I")

CTL_IN = CTL_OUT = -1  # the host channel, moved off fds 0/1 by main.startup()


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def reply(kind, flags=0, code=0, duration=0.0, part1=b"", part2=b""):
    write_all(CTL_OUT, b"".join((HEADER.pack(kind, flags, code, duration, len(part1), len(part2)), part1, part2)))


def reply_files(kind, flags, code, duration, part1, part2):
    """``reply`` with each part the first ``n`` bytes of a file ``(fd, n)``, moved by the kernel."""
    (fd1, n1), (fd2, n2) = part1, part2
    write_all(CTL_OUT, HEADER.pack(kind, flags, code, duration, n1, n2))
    for fd, n in ((fd1, n1), (fd2, n2)):
        done = 0
        while done < n:
            moved = os.splice(fd, CTL_OUT, n - done, offset_src=done)
            if moved <= 0:
                raise OSError("the host channel took no more bytes")
            done += moved


def read_exact(n):
    """Exactly ``n`` bytes from the host, or None at end of file. Unbuffered on purpose: a
    read-ahead buffer would swallow the start of the raw stdin frame that follows an exec."""
    chunks = []
    while n > 0:
        chunk = os.read(CTL_IN, n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_request():
    head = read_exact(4)
    if head is None:
        return None
    (size,) = LENGTH.unpack(head)
    body = read_exact(size)
    if body is None:
        return None
    return marshal.loads(body)


SCRUB = None  # a reusable buffer, zeroed after every use, for kernels or Pythons without splice


def receive_stdin(n):
    """Move the ``n`` raw stdin bytes that follow an exec request into a fresh memfd.

    They never become a Python object here: os.splice moves them from the host pipe to the
    memfd inside the kernel. Every program is forked from this process, so anything kept in
    its memory (a judge's nonce, a dataset's hidden tests) would be readable by the next one.
    """
    fd = os.memfd_create("stdin", os.MFD_CLOEXEC)
    try:
        receive_raw(n, fd)
    except BaseException:
        os.close(fd)
        raise
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def receive_raw(n, fd):
    """Move the next ``n`` raw bytes of the host channel into ``fd`` (a file, or /dev/null to drop
    them), inside the kernel where it can (see ``receive_stdin``). Whatever ``fd`` refuses (a full
    disk) is still taken off the channel, which must stay in step, and the error raised after."""
    global SCRUB
    left = n
    failure = None
    splice = getattr(os, "splice", None)
    while left > 0:
        moved = 0
        target = fd if failure is None else DROP[0]
        if splice is not None:
            try:
                moved = splice(CTL_IN, target, left)
            except OSError as exc:
                if target == fd and exc.errno not in (22, 95):  # EINVAL, EOPNOTSUPP: no splice here
                    failure = exc
                else:
                    splice = None
                continue
        else:
            if SCRUB is None:
                SCRUB = bytearray(1 << 16)
            view = memoryview(SCRUB)[: min(left, len(SCRUB))]
            try:
                moved = os.readv(CTL_IN, [view])
                if failure is None and moved > 0:
                    try:
                        write_all(fd, view[:moved])
                    except OSError as exc:
                        failure = exc
            finally:
                view[:] = bytes(len(view))
                view.release()
        if moved <= 0:
            raise EOFError("the host channel ended inside a raw frame")
        left -= moved
    if failure is not None:
        raise failure


DROP = [-1]  # /dev/null, where receive_raw drops what a failed write could not take (main.startup)


def read_fd(fd):
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
