"""An exec's stdout and stderr on their way from its pipes to the host."""

import os

from . import state as S
from .protocol import K_RESULT, reply, reply_files


class Output:
    """An exec's stdout and stderr, read as they come. Output beyond the cap is read and dropped,
    so that a writer never blocks on a full pipe.

    Where the kernel can (``os.splice``, Python 3.10+), the bytes go from the pipes into memfds and
    from there to the host without ever being in this process's memory: every later program is
    forked from it, and would find an earlier program's output (a candidate's prints, a verdict)
    in the memory it inherits."""

    def __init__(self, out_r, err_r):
        self.kept = {out_r: 0, err_r: 0}
        self.open = 2
        self.truncated = False
        self.files = {}
        self.chunks = {out_r: [], err_r: []}
        if S.SPLICE:
            for fd in (out_r, err_r):
                self.files[fd] = os.memfd_create("output", os.MFD_CLOEXEC)

    def read(self, fd):
        """Take what ``fd`` has; False at its end."""
        room = S.OUTPUT_CAP - self.kept[fd]
        if fd in self.files:
            if room > 0:
                moved = os.splice(fd, self.files[fd], min(room, 1 << 16))
                self.kept[fd] += moved
            else:
                moved = os.splice(fd, S.DEVNULL, 1 << 16)
                self.truncated = self.truncated or moved > 0
            if not moved:
                self.open -= 1
            return bool(moved)
        data = os.read(fd, 65536)
        if not data:
            self.open -= 1
            return False
        if len(data) > room:
            self.truncated = True
            data = data[:room] if room > 0 else b""
        if data:
            self.chunks[fd].append(data)
            self.kept[fd] += len(data)
        return True

    def send(self, flags, code, duration, out_r, err_r):
        """Answer the host with the result and this output; then close the memfds."""
        try:
            if self.files:
                reply_files(K_RESULT, flags, code, duration, (self.files[out_r], self.kept[out_r]),
                            (self.files[err_r], self.kept[err_r]))
            else:
                reply(K_RESULT, flags, code, duration, b"".join(self.chunks[out_r]), b"".join(self.chunks[err_r]))
        finally:
            self.close()

    def ends_with_memory_error(self, err_r):
        """Whether stderr's last line is a ``MemoryError`` (read into a scrubbed buffer)."""
        if err_r not in self.files:
            return last_line(b"".join(self.chunks[err_r])).startswith(b"MemoryError")
        size = self.kept[err_r]
        tail = bytearray(min(size, 256))
        try:
            os.preadv(self.files[err_r], [tail], size - len(tail))
            end = len(tail)  # no slice of it: each would be a copy left behind in memory
            while end and tail[end - 1] in b" \t\r\n":
                end -= 1
            return tail.startswith(b"MemoryError", tail.rfind(b"\n", 0, end) + 1)
        finally:
            tail[:] = bytes(len(tail))

    def close(self):
        for fd in self.files.values():
            os.close(fd)
        self.files = {}


def last_line(data):
    return data.rstrip().rsplit(b"\n", 1)[-1]
