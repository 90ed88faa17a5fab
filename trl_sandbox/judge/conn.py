# ruff: noqa: UP031  (runs on the sandbox's Python, 3.8+: plain %-formatting on purpose)
"""The judge's side of its conversation with the candidate process: a part of the judge's
source (``trl_sandbox.judge.verdict.JUDGE_SOURCE`` is ``judge/candidate.py``, ``judge/resident.py``, ``judge/clock.py``, this file
and ``judge/program.py``, run as one program in the sandbox; standard library only, Python 3.8+).

Requests go out as pickles; replies come back through an unpickler that refuses every class but
three exact value types, bounded in size, on the candidate's time budget. After the first
timeout, exit or protocol error the candidate is unusable, and every later call says so.
"""

import _pickle
import io
import os
import select
import sys
import time

if "_exc_text" not in globals():
    # Imported on the host (tests, tools); in the sandbox the parts before this one defined these.
    from trl_sandbox.judge.candidate import _MAX_TEXT, _exc_text


class _Timeout(BaseException):
    """The time budget ran out (BaseException: test code's ``except Exception`` cannot swallow it)."""


class _Exited(BaseException):
    """The candidate process is gone (exited, killed, or closed its pipe)."""


class _Protocol(BaseException):
    """The candidate process sent something that is not a valid message."""


class _Mispredicted(BaseException):
    """A call differs from the one the host predicted and the judge already sent: the judge's own
    fault (the candidate may be running calls the test does not make), reported as a task error."""


# The requests sent ahead go in one write that an empty pipe takes whole (PIPE_BUF is 4096): the
# judge never blocks on it while the candidate's replies wait for it to read them.
_AHEAD_BYTES = 3584


def _canonical(request):
    """A request pickled without the memo: equal calls give equal bytes, whatever objects their
    arguments share (how predicted calls are sent, and how a call is matched with one)."""
    out = io.BytesIO()
    pickler = _pickle.Pickler(out, 4)
    pickler.fast = True
    pickler.dump(request)
    return out.getvalue()


class CandidateError(Exception):
    """An exception raised by the candidate's code (``kind`` "raise"), or a result that is not plain
    data (``kind`` "not_plain"), re-raised in the judge's test code with the same text."""

    def __init__(self, type_name, message, kind="raise"):
        Exception.__init__(self, message)
        self.type_name = type_name
        self.kind = kind


class _NotPlain(Exception):
    pass


# The only classes a result may name: exact numeric value types whose constructors have no effects.
_VALUE_CLASSES = {("builtins", "complex"), ("fractions", "Fraction"), ("decimal", "Decimal")}


class _PlainUnpickler(_pickle.Unpickler):
    """Refuses every class but ``_VALUE_CLASSES`` and every persistent id: only plain data decodes."""

    def find_class(self, module, name):
        if (module, name) in _VALUE_CLASSES:
            return getattr(sys.modules[module], name)  # imported up front (judge/candidate.py)
        raise _NotPlain("%s.%s" % (module, name))

    def persistent_load(self, pid):
        raise _NotPlain("persistent id")


# -- the judge's side of the conversation --------------------------------------------------------------


class _Conn:
    """The judge's end of the pipe pair. After the first timeout, exit or protocol error the
    candidate is unusable: ``failure`` records what happened and every later call raises."""

    def __init__(self, pid, wfd, rfd, clock, max_bytes):
        self.pid = pid
        self.wfd = wfd
        self.rfd = rfd
        self.clock = clock
        self.max_bytes = max_bytes
        self.seq = 0
        self.failure = None
        self.ahead = []  # predicted requests, in order, not yet matched with a call of the test
        self.ahead_sent = False
        self.pending = b""  # bytes read past the last message (the replies come in a stream)
        os.set_blocking(wfd, False)

    def predict(self, calls):
        """The calls the test will make first, worked out by the host from its text
        (``trl_sandbox.judge.prefetch``). They are sent together at the test's first call, if it is
        the first of them; the candidate then answers one after another without waiting for us."""
        ahead, size = [], 0
        try:
            for i, (name, args, kwargs) in enumerate(calls, 1):
                data = _canonical((self.seq + i, str(name), tuple(args), dict(kwargs)))
                size += 4 + len(data)
                if size > _AHEAD_BYTES:
                    break
                ahead.append(data)
        except Exception:
            ahead = []
        self.ahead = ahead if len(ahead) > 1 else []

    @staticmethod
    def loads(data):
        """Decode plain data only: every class lookup raises."""
        return _PlainUnpickler(io.BytesIO(data)).load()

    def _fail(self, exc):
        if self.failure is None:
            if isinstance(exc, _Timeout):
                self.failure = {"ok": False, "kind": "timeout", "message": "timed out"}
            elif isinstance(exc, _Protocol):
                self.failure = {"ok": False, "kind": "protocol", "message": "protocol error: " + _exc_text(exc)}
                self.kill()
            else:
                self.failure = {"ok": False, "kind": "exited", "message": self._exit_description()}
        raise _Dead()

    def _remaining(self):
        left = self.clock.wait_s(self.pid)
        if left is None:
            raise _Timeout()
        return left

    def _read(self, n):
        if len(self.pending) >= n:
            data, self.pending = self.pending[:n], self.pending[n:]
            return data
        chunks, have = [self.pending], len(self.pending)
        while have < n:
            ready, _, _ = select.select([self.rfd], [], [], self._remaining())
            if not ready:
                continue  # the budget is looked at again (and raises when it is spent)
            # Replies stream in: whatever is there already is read with this one (small reads
            # ahead; a large message is read to its size, a megabyte at a time).
            chunk = os.read(self.rfd, min(max(n - have, 1 << 16), 1 << 20))
            if not chunk:
                raise _Exited()
            chunks.append(chunk)
            have += len(chunk)
        data = b"".join(chunks)
        self.pending = data[n:]
        return data[:n]

    def _write(self, data):
        view = memoryview(data)
        while view:
            try:  # the pipe is empty between calls: a request usually goes in one write, at once
                written = os.write(self.wfd, view)
            except BlockingIOError:
                _, ready, _ = select.select([], [self.wfd], [], self._remaining())
                continue
            except OSError:
                raise _Exited() from None
            view = view[written:]

    def recv(self):
        """The next message (a tuple of plain data whose first item is a str)."""
        if self.failure is not None:
            raise _Dead()
        try:
            size = int.from_bytes(self._read(4), "big")
            if size > self.max_bytes:
                raise _Protocol("a message of %d bytes is over the limit of %d" % (size, self.max_bytes))
            data = self._read(size)
            try:
                message = self.loads(data)
            except _NotPlain as exc:
                raise _Protocol("a message that is not plain data (%s)" % exc) from None
            except Exception as exc:
                raise _Protocol("an undecodable message (%s)" % type(exc).__name__) from None
            if type(message) is not tuple or not message or type(message[0]) is not str:
                raise _Protocol("a malformed message")
            return message
        except (_Timeout, _Exited, _Protocol) as exc:
            self._fail(exc)

    def call_raw(self, name, args, kwargs):
        """One call: the candidate's reply, ``("ok", seq, pickle)`` or ``(kind, seq, type, text)``."""
        if self.failure is not None:
            raise _Dead()
        self.seq += 1
        if not (self.ahead and self._take_predicted(name, args, kwargs)):
            data = _pickle.dumps((self.seq, name, args, kwargs), protocol=4)
            try:
                self._write(len(data).to_bytes(4, "big") + data)
            except (_Timeout, _Exited) as exc:
                self._fail(exc)
        reply = self.recv()
        try:
            if reply[1] != self.seq:
                raise _Protocol("a reply out of sequence")
            if reply[0] == "ok" and len(reply) == 3 and type(reply[2]) is bytes:
                return reply
            if reply[0] in ("raise", "not_plain") and len(reply) == 4:
                return (reply[0], reply[1], str(reply[2])[:200], str(reply[3])[:_MAX_TEXT])
            raise _Protocol("a malformed reply")
        except _Protocol as exc:
            self._fail(exc)
        except Exception:
            self._fail(_Protocol("a malformed reply"))

    def _take_predicted(self, name, args, kwargs):
        """Whether this call is the next predicted one: then its request is sent with all of them
        (the first time) or already on its way. A first call that differs drops the prediction
        (nothing was sent: the call goes alone); a later one is the judge's error."""
        try:
            data = _canonical((self.seq, name, args, kwargs))
        except Exception:
            data = None
        if data != self.ahead[0]:
            sent, self.ahead = self.ahead_sent, []
            if sent:
                raise _Mispredicted("call %d of the test is not the one predicted and sent ahead" % self.seq)
            return False
        if not self.ahead_sent:
            self.ahead_sent = True
            try:  # at most _AHEAD_BYTES (predict): an empty pipe takes them whole
                self._write(b"".join(len(d).to_bytes(4, "big") + d for d in self.ahead))
            except (_Timeout, _Exited) as exc:
                self.ahead = []
                self._fail(exc)
        del self.ahead[0]
        return True

    def call(self, name, args, kwargs):
        """One call from test code: the plain result, or the candidate's exception re-raised."""
        reply = self.call_raw(name, args, kwargs)
        if reply[0] == "ok":
            try:
                return self.loads(reply[2])
            except _NotPlain as exc:
                raise CandidateError("TypeError", "result is not plain data (%s)" % exc, "not_plain") from None
            except Exception as exc:
                raise CandidateError("TypeError", "undecodable result (%s)" % type(exc).__name__, "not_plain") from None
        raise CandidateError(reply[2], reply[3], reply[0])

    def kill(self):
        try:
            os.kill(self.pid, 9)
        except OSError:
            pass

    def _exit_description(self):
        for _ in range(100):
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except OSError:
                return "the candidate process is gone"
            if pid:
                if os.WIFEXITED(status):
                    return "the candidate process exited with status %d" % os.WEXITSTATUS(status)
                if os.WIFSIGNALED(status):
                    return "the candidate process was killed by signal %d" % os.WTERMSIG(status)
                return "the candidate process stopped"
            time.sleep(0.0005)
        return "the candidate process closed its pipe"


class _Dead(BaseException):
    """Raised by every call once the candidate is unusable (see ``_Conn.failure``)."""


class _Proxy:
    """Stands in for a candidate function inside the judge's test code."""

    def __init__(self, conn, name):
        self._conn = conn
        self.__name__ = name
        self.__qualname__ = name

    def __call__(self, *args, **kwargs):
        return self._conn.call(self.__name__, args, kwargs)

    def __repr__(self):
        return "<candidate function %s>" % self.__name__
