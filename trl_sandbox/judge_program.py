# ruff: noqa: UP031  (runs on the sandbox's Python, 3.8+: plain %-formatting on purpose)
"""The judge: runs inside the sandbox as ``python3 -c SOURCE``, with this file's text as SOURCE.

Standard library only, Python 3.8+. The source is sent byte-identical for every execution (a
sandbox may cache its compiled form); everything that changes per execution comes on stdin:

    stdin = NONCE (16 bytes, prepended by the runner)
          + u32 length + CANDIDATE PART (pickle: what the candidate process may see)
          + u32 length + JUDGE PART     (pickle: the tests; read only after the candidate is forked)

The host side is ``trl_sandbox.judge``. The judge makes itself non-dumpable (so that the candidate
cannot read its memory or its file descriptors through /proc or ptrace), forks the candidate
process, and talks to it over a pipe pair. The candidate process first zeroes its copy of the
nonce, closes stdin and the real stdout (its prints go to stderr), drops the task's banned
builtins, execs the candidate source and then serves call requests. Everything it sends back is
decoded with an unpickler that refuses every class but three exact value types, so only plain
data (None, bool, int, float, complex, str, bytes, bytearray, list, tuple, dict, set, frozenset,
fractions.Fraction, decimal.Decimal) can come back: no object with a rigged ``__eq__``. Whatever
the candidate does (exit, kill, loop, print), the judge alone writes to the real stdout, once:
``MARKER NONCE_HEX JSON``. The host accepts only a line with the right nonce.

Modes (from the judge part):

``call``  ``{"mode": "call", "func": NAME, "calls": [(args, kwargs), ...]}``: call NAME on each
          input; each result travels back to the host as a pickle that the host decodes the same
          restricted way and compares with the expected value computed from the task's reference.
``check`` ``{"mode": "check", "setup": CODE, "tests": [CODE, ...], "bind": [NAME, ...],
          "bind_defined": [NAME, ...]}``: exec the trusted ``setup`` (e.g. a HumanEval prompt, for
          helpers such as ``poly``) in the judge's own namespace, bind each name of ``bind`` (and of
          ``bind_defined`` that the candidate defines) to a proxy that forwards calls to the
          candidate process, then exec each test; a test passes when it raises nothing.
"""

import _json
import _pickle
import binascii
import gc
import io
import os
import select
import sys
import time

MARKER = b"@@trl-sandbox-verdict@@"
VERSION = 1
NONCE_BYTES = 16
_MAX_TEXT = 2000

# The methods the candidate process's own machinery (reading requests, turning results into plain
# data, writing replies, importing) calls, captured before a ban deletes any of them from its class:
# a task that bans ``.append(`` must not break the judge's reply path.
_list_append = list.append
_dict_items = dict.items
_dict_get = dict.get
_bytes_join = bytes.join
_int_from_bytes = int.from_bytes
_int_to_bytes = int.to_bytes
_str_partition = str.partition


class _Timeout(BaseException):
    """The time budget ran out (BaseException: test code's ``except Exception`` cannot swallow it)."""


class _Exited(BaseException):
    """The candidate process is gone (exited, killed, or closed its pipe)."""


class _Protocol(BaseException):
    """The candidate process sent something that is not a valid message."""


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
            return getattr(__import__(module), name)
        raise _NotPlain("%s.%s" % (module, name))

    def persistent_load(self, pid):
        raise _NotPlain("persistent id")


# -- low-level I/O ----------------------------------------------------------------------------------


def _read_exact(fd, n):
    chunks = []
    while n > 0:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("stdin ended early")
        _list_append(chunks, chunk)
        n -= len(chunk)
    return _bytes_join(b"", chunks)


def _read_message(fd):
    size = int.from_bytes(_read_exact(fd, 4), "big")
    return _read_exact(fd, size)


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _nondumpable():
    """prctl(PR_SET_DUMPABLE, 0): /proc/<pid>/{mem,fd,environ} and ptrace become root-only."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(4, 0, 0, 0, 0) == 0
    except Exception:
        return False


# -- the candidate process ------------------------------------------------------------------------------


def _exc_text(exc):
    try:
        text = str(exc)
    except BaseException:
        text = "<unprintable exception>"
    return text[:_MAX_TEXT]


def _plain(value, memo, depth=0):
    """``value`` as plain builtins (subclasses such as Counter or namedtuple become their base type)."""
    t = type(value)
    if value is None or t is bool or t is int or t is float or t is str or t is bytes:
        return value
    if depth > 200:
        raise TypeError("result is nested too deeply")
    key = id(value)
    if key in memo:
        return memo[key]
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value) if t is not bytearray else bytearray(value)
    if isinstance(value, list):
        out = []
        memo[key] = out
        for item in value:
            _list_append(out, _plain(item, memo, depth + 1))
        return out
    if isinstance(value, tuple):
        out = tuple(_plain(item, memo, depth + 1) for item in value)
        memo[key] = out
        return out
    if isinstance(value, dict):
        out = {}
        memo[key] = out
        for k, v in list(_dict_items(value)):
            out[_plain(k, memo, depth + 1)] = _plain(v, memo, depth + 1)
        return out
    if isinstance(value, frozenset):
        return frozenset(_plain(item, memo, depth + 1) for item in value)
    if isinstance(value, set):
        return set(_plain(item, memo, depth + 1) for item in value)
    if isinstance(value, complex):
        return complex(float(value.real), float(value.imag))
    # A Fraction or Decimal result means its module is loaded; nothing is imported for other results.
    fractions = _dict_get(sys.modules, "fractions")
    if fractions is not None and isinstance(value, fractions.Fraction):
        return fractions.Fraction(int(value.numerator), int(value.denominator))
    decimal = _dict_get(sys.modules, "decimal")
    if decimal is not None and isinstance(value, decimal.Decimal):
        return decimal.Decimal(decimal.Decimal.__str__(value))
    raise TypeError("result of type %s is not plain data" % t.__name__)


def _restricted_importer(real_import, allowed):
    allowed = frozenset(allowed)

    def __import__(name, globals=None, locals=None, fromlist=(), level=0):
        if level or _str_partition(name, ".")[0] not in allowed:
            raise ImportError("import of %r is not allowed in this task" % name)
        return real_import(name, globals, locals, fromlist, level)

    return __import__


def _remove_methods(builtins, names, allowed_imports, type_modified):
    """Delete each attribute in ``names`` from every class in ``builtins`` that defines it
    (``list.sort`` for a ``.sort(`` ban), in this (the candidate's) process only.

    A builtin class's dict refuses ``setattr``; its real dict is reached through the read-only proxy
    (``gc.get_referents``), and ``type_modified`` (``PyType_Modified``, through ctypes) then bumps
    the class's version tag so that no method cache or specialised instruction still finds the
    entry. Modules the candidate may import are imported first: the import system's own Python code
    calls str and list methods that a ban may delete. Returns the ``Class.name`` entries removed."""
    if not names:
        return []
    for module in allowed_imports or ():
        try:
            __import__(module)
        except BaseException:
            pass
    removed = []
    classes = [v for v in list(builtins.__dict__.values()) if isinstance(v, type)]
    for cls in classes:
        real = gc.get_referents(cls.__dict__)[0]
        hit = [name for name in names if name in real]
        for name in hit:
            del real[name]
            _list_append(removed, "%s.%s" % (cls.__name__, name))
        if hit and type_modified is not None:
            type_modified(cls)
    if removed:
        sys._clear_type_cache()
    return removed


def _type_modified():
    """``PyType_Modified`` as a callable taking a class, or ``None`` where ctypes is missing (then only
    the global method cache is cleared; the candidate's own code is compiled after the removal)."""
    try:
        import ctypes

        func = ctypes.pythonapi.PyType_Modified
        func.argtypes = [ctypes.py_object]
        func.restype = None
        return func
    except Exception:
        return None


def _candidate(spec, rfd, wfd, type_modified=None):
    """Runs in the forked candidate process; never returns."""
    import builtins

    def send(message):
        data = _pickle.dumps(message, protocol=5)
        _write_all(wfd, _int_to_bytes(len(data), 4, "big") + data)

    # Everything is read from the spec first: the removal may take dict.get or dict.pop away.
    source, filename = spec["source"], spec.get("filename") or "<string>"
    allowed = spec.get("allowed_imports")
    deletions, removals = spec.get("delete_builtins") or (), spec.get("remove_builtins") or ()
    _remove_methods(builtins, spec.get("remove_methods") or (), allowed, type_modified)
    for name in deletions:  # after the imports above: it may delete __import__
        if name in builtins.__dict__:
            del builtins.__dict__[name]
    table = dict(builtins.__dict__)
    for name in removals:
        if name in table:
            del table[name]
    if allowed is not None and "__import__" in table:
        table["__import__"] = _restricted_importer(builtins.__import__, allowed)
    namespace = {"__name__": "__candidate__", "__builtins__": table}
    try:
        code = compile(source, filename, "exec")
        exec(code, namespace)
        defined = [k for k, v in list(_dict_items(namespace)) if isinstance(k, str) and callable(v)]
        message = ("loaded", defined)
    except BaseException as exc:
        message = ("load_error", type(exc).__name__, _exc_text(exc))
    send(message)
    while True:
        try:
            header = _read_exact(rfd, 4)
            request = _pickle.loads(_read_exact(rfd, _int_from_bytes(header, "big")))
        except BaseException:
            os._exit(0)
        seq, name, args, kwargs = request
        try:
            if name not in namespace:
                raise NameError("name %r is not defined" % name)
            value = namespace[name](*args, **kwargs)
            try:
                payload = _pickle.dumps(_plain(value, {}), protocol=5)
                message = ("ok", seq, payload)
            except BaseException as exc:
                message = ("not_plain", seq, type(exc).__name__, _exc_text(exc))
        except BaseException as exc:
            message = ("raise", seq, type(exc).__name__, _exc_text(exc))
        send(message)


def _close_fds_except(keep):
    top = 1024
    try:
        top = max(int(name) for name in os.listdir("/proc/self/fd")) + 1
    except Exception:
        try:
            top = min(os.sysconf("SC_OPEN_MAX"), 65536)
        except Exception:
            pass
    low = 0
    for fd in sorted(keep) + [top]:
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1


def _start_candidate(spec, nonce):
    type_modified = _type_modified() if spec.get("remove_methods") else None
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            nonce[0:NONCE_BYTES] = bytes(NONCE_BYTES)
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, 0)
            try:
                os.dup2(2, 1)
            except OSError:
                os.dup2(devnull, 1)
            _close_fds_except({0, 1, 2, req_r, resp_w})
            _candidate(spec, req_r, resp_w, type_modified)
        except BaseException:
            pass
        os._exit(0)
    os.close(req_r)
    os.close(resp_w)
    return pid, req_w, resp_r


# -- the judge's side of the conversation --------------------------------------------------------------


class _Conn:
    """The judge's end of the pipe pair. After the first timeout, exit or protocol error the
    candidate is unusable: ``failure`` records what happened and every later call raises."""

    def __init__(self, pid, wfd, rfd, deadline, max_bytes):
        self.pid = pid
        self.wfd = wfd
        self.rfd = rfd
        self.deadline = deadline
        self.max_bytes = max_bytes
        self.seq = 0
        self.failure = None
        os.set_blocking(wfd, False)

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
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise _Timeout()
        return left

    def _read(self, n):
        chunks = []
        while n > 0:
            ready, _, _ = select.select([self.rfd], [], [], self._remaining())
            if not ready:
                raise _Timeout()
            chunk = os.read(self.rfd, min(n, 1 << 20))
            if not chunk:
                raise _Exited()
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def _write(self, data):
        view = memoryview(data)
        while view:
            _, ready, _ = select.select([], [self.wfd], [], self._remaining())
            if not ready:
                raise _Timeout()
            try:
                written = os.write(self.wfd, view)
            except BlockingIOError:
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


# -- modes ------------------------------------------------------------------------------------------

_NOT_RUN = {"ok": False, "kind": "not_run", "message": "not run"}


def _run_call(conn, spec):
    results = []
    name = spec["func"]
    for args, kwargs in spec["calls"]:
        if conn.failure is not None:
            results.append(_NOT_RUN)
            continue
        try:
            reply = conn.call_raw(name, tuple(args), dict(kwargs))
        except _Dead:
            results.append(conn.failure)
            continue
        if reply[0] == "ok":
            try:
                conn.loads(reply[2])
            except Exception as exc:
                results.append({"ok": False, "kind": "not_plain", "type": "TypeError",
                                "message": "result is not plain data (%s)" % _exc_text(exc)})
                continue
            results.append({"ok": True, "value": reply[2]})
        else:
            results.append({"ok": False, "kind": reply[0], "type": reply[2], "message": reply[3]})
    return results


def _run_check(conn, spec, defined):
    namespace = {"__name__": "__judge__"}
    setup = spec.get("setup") or ""
    if setup:
        exec(compile(setup, "<setup>", "exec"), namespace)
    for name in spec.get("bind") or ():
        namespace[name] = _Proxy(conn, name)
    for name in spec.get("bind_defined") or ():
        if name in defined:
            namespace[name] = _Proxy(conn, name)
    results = []
    for test in spec["tests"]:
        if conn.failure is not None:
            results.append(_NOT_RUN)
            continue
        try:
            exec(compile(test, "<test>", "exec"), namespace)
            result = {"ok": True}
        except _Dead:
            result = None
        except CandidateError as exc:
            result = {"ok": False, "kind": exc.kind, "type": exc.type_name, "message": _exc_text(exc)}
        except AssertionError as exc:
            result = {"ok": False, "kind": "assertion", "type": "AssertionError", "message": _exc_text(exc)}
        except BaseException as exc:
            result = {"ok": False, "kind": "wrong", "type": type(exc).__name__, "message": _exc_text(exc)}
        # Test code that swallowed the end of the candidate (a bare ``except:``) still fails.
        results.append(conn.failure if conn.failure is not None else result)
    return results


# -- the verdict ------------------------------------------------------------------------------------


def _to_json(value):
    """Minimal JSON for the verdict (plain data only); bytes become base64 strings."""
    t = type(value)
    if value is None:
        return "null"
    if t is bool:
        return "true" if value else "false"
    if t is int:
        return str(value)
    if t is float:
        return repr(value) if value == value and value not in (float("inf"), float("-inf")) else "null"
    if t is str:
        return _json.encode_basestring_ascii(value)
    if t is bytes:
        return '"' + binascii.b2a_base64(value, newline=False).decode("ascii") + '"'
    if t is dict:
        return "{" + ",".join(_to_json(str(k)) + ":" + _to_json(v) for k, v in value.items()) + "}"
    if t in (list, tuple):
        return "[" + ",".join(_to_json(v) for v in value) + "]"
    return _to_json(str(value))


def main():
    import _signal

    _signal.signal(_signal.SIGPIPE, _signal.SIG_IGN)
    guarded = _nondumpable()
    nonce = bytearray(NONCE_BYTES)
    view = memoryview(nonce)
    got = 0
    while got < NONCE_BYTES:
        n = os.readv(0, [view[got:]])
        if n <= 0:
            raise SystemExit("the judge needs a 16-byte nonce on stdin")
        got += n
    view.release()
    candidate_spec = _pickle.loads(_read_message(0))
    start = time.monotonic()
    deadline = start + float(candidate_spec.get("limit", 1.0))
    pid, wfd, rfd = _start_candidate(candidate_spec, nonce)
    judge_spec = _pickle.loads(_read_message(0))
    conn = _Conn(pid, wfd, rfd, deadline, int(candidate_spec.get("max_bytes", 16 << 20)))
    verdict = {"v": VERSION, "nondumpable": guarded}
    defined = []
    try:
        reply = conn.recv()
        if reply[0] == "loaded" and len(reply) == 2 and type(reply[1]) is list:
            verdict["load"] = {"ok": True}
            defined = [d for d in reply[1] if type(d) is str]
        elif reply[0] == "load_error" and len(reply) == 3:
            verdict["load"] = {"ok": False, "kind": "raise", "type": str(reply[1])[:200], "message": str(reply[2])[:_MAX_TEXT]}
        else:
            verdict["load"] = {"ok": False, "kind": "protocol", "message": "protocol error: a malformed first message"}
    except _Dead:
        verdict["load"] = conn.failure
    verdict["tests"] = []
    if verdict["load"]["ok"]:
        try:
            if judge_spec["mode"] == "call":
                verdict["tests"] = _run_call(conn, judge_spec)
            else:
                verdict["tests"] = _run_check(conn, judge_spec, defined)
        except Exception as exc:  # the task's own setup or tests are broken
            verdict["task_error"] = "%s: %s" % (type(exc).__name__, _exc_text(exc))
    conn.kill()  # nothing the candidate does from here on can reach the verdict
    verdict["elapsed"] = round(time.monotonic() - start, 6)
    # A leading newline: whatever reached the same stream before, the verdict starts its own line.
    line = b"\n" + MARKER + b" " + nonce.hex().encode("ascii") + b" " + _to_json(verdict).encode("ascii") + b"\n"
    _write_all(1, line)
    # The killed candidate is reaped by whoever outlives us (the sandbox's init); no need to wait.


if __name__ == "__main__":
    main()
