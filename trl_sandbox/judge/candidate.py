# ruff: noqa: UP031  (runs on the sandbox's Python, 3.8+: plain %-formatting on purpose)
"""The candidate process's half of the judge: the first part of the judge's source.

``trl_sandbox.judge.verdict.JUDGE_SOURCE`` is this file's text followed by ``judge/resident.py``'s (the
same half where the judge stays resident), ``judge/clock.py``'s,
``judge/conn.py``'s and ``judge/program.py``'s, run as ``python3 -I -c SOURCE`` in the sandbox
(standard library only, Python 3.8+); see ``judge/program.py`` for the protocol. Here: reading and writing framed messages, forking the candidate process, and
what runs in it: the run-time ban layer (banned builtins gone from its namespace and from
``builtins``, banned methods deleted from the builtin classes, imports limited), the candidate's
code, and the loop that serves call requests and sends back results as plain data.
"""

# Everything the judge may import is imported here, before any candidate code exists (the value
# classes of results included); with ``-I`` the interpreter never looks in the current directory,
# the candidate's, so a module the candidate plants there is never the one the judge gets.
import _pickle
import decimal
import fractions
import gc
import os
import sys

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


def _libc():
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True)
    except Exception:
        return None


def _prctl():
    try:
        return _libc().prctl
    except Exception:
        return None


def _nondumpable():
    """prctl(PR_SET_DUMPABLE, 0): /proc/<pid>/{mem,fd,environ} and ptrace become root-only."""
    try:
        return _PRCTL is not None and _PRCTL(4, 0, 0, 0, 0) == 0
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
    if isinstance(value, fractions.Fraction):
        return fractions.Fraction(int(value.numerator), int(value.denominator))
    if isinstance(value, decimal.Decimal):
        return decimal.Decimal(decimal.Decimal.__str__(value))
    raise TypeError("result of type %s is not plain data" % t.__name__)


def _restricted_importer(real_import, allowed):
    allowed = frozenset(allowed)

    def __import__(name, globals=None, locals=None, fromlist=(), level=0):
        if level or _str_partition(name, ".")[0] not in allowed:
            raise ImportError("import of %r is not allowed in this task" % name)
        return real_import(name, globals, locals, fromlist, level)

    return __import__


class _ModuleBlocker:
    """First on ``sys.meta_path``: refuses the task's banned modules and their C accelerators
    (``_heapq`` for ``heapq``), whoever imports them: the candidate, or library code it calls with
    the real ``__import__`` (``typing`` evaluating a string, ``Counter.most_common``)."""

    def __init__(self, names):
        self.names = frozenset(names)

    def banned(self, fullname):
        top = _str_partition(fullname, ".")[0]
        return top in self.names or (top[:1] == "_" and top[1:] in self.names)

    def find_spec(self, fullname, path=None, target=None):
        if self.banned(fullname):
            raise ImportError("module %r is banned in this task" % fullname)
        return None


def _block_modules(names, refuse_reimport=()):
    """Drop the banned modules from ``sys.modules`` (loaded ones would be handed out without asking
    any finder) and put a ``_ModuleBlocker`` in front of the import system. ``refuse_reimport``:
    modules that stay loaded but may not be imported afresh (``builtins``: a new copy of it comes
    from the interpreter's saved copy of its dict, with the banned builtins back in it)."""
    if not names and not refuse_reimport:
        return
    unload = _ModuleBlocker(names)
    for key in list(sys.modules):
        if unload.banned(key):
            del sys.modules[key]
    sys.meta_path[0:0] = [_ModuleBlocker(list(names) + list(refuse_reimport))]


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


# Resolved with the definitions: once per sandbox where the local fork server runs them ahead of
# every program (its warm-up), once per program elsewhere.
_PRCTL = _prctl()
_TYPE_MODIFIED = _type_modified()


def _send(wfd, message):
    data = _pickle.dumps(message, protocol=5)
    _write_all(wfd, _int_to_bytes(len(data), 4, "big") + data)


def _candidate(spec, rfd, wfd, type_modified=None, code=None):
    """Runs in the forked candidate process; never returns. ``code``: the source already compiled
    (``_compiled_ahead``), or None to compile it here."""
    import builtins

    # The candidate, like ``python3 -c``, may import modules from its working directory; only its own
    # process looks there (the judge runs isolated, with everything it needs already imported).
    sys.path.insert(0, "")
    # Everything is read from the spec first: the removal may take dict.get or dict.pop away.
    source, filename = spec["source"], spec.get("filename") or "<string>"
    allowed = spec.get("allowed_imports")
    deletions, removals = spec.get("delete_builtins") or (), spec.get("remove_builtins") or ()
    _block_modules(spec.get("block_modules") or (), ["builtins"] if deletions else ())
    _remove_methods(builtins, spec.get("remove_methods") or (), allowed, type_modified)
    for name in deletions:  # after the imports above: it may delete __import__
        if name in builtins.__dict__:
            del builtins.__dict__[name]
    table = builtins.__dict__  # as in any program, unless the task takes names away from this one
    if removals or allowed is not None:
        table = dict(table)
        for name in removals:
            if name in table:
                del table[name]
        if allowed is not None and "__import__" in table:
            table["__import__"] = _restricted_importer(builtins.__import__, allowed)
    namespace = {"__name__": "__candidate__", "__builtins__": table}
    _send(wfd, _load(namespace, code, source, filename))
    _serve_requests(namespace, rfd, wfd)
    os._exit(0)


def _load(namespace, code, source, filename):
    """Run the candidate's module body in ``namespace``: the message that says how it went."""
    try:
        if code is None:
            code = compile(source, filename, "exec")
        exec(code, namespace)
        defined = [k for k, v in list(_dict_items(namespace)) if isinstance(k, str) and callable(v)]
        return ("loaded", defined)
    except BaseException as exc:
        return ("load_error", type(exc).__name__, _exc_text(exc))


def _serve_requests(namespace, rfd, wfd):
    """Serve the judge's call requests until it closes the pipe (or sends what cannot be read)."""
    # Requests may come several at once (the calls a test certainly makes, sent ahead): one read
    # takes whatever is there, and each is served in turn.
    pending = b""
    while True:
        try:
            while len(pending) < 4:
                chunk = os.read(rfd, 1 << 16)
                if not chunk:
                    raise EOFError("the judge closed the pipe")
                pending += chunk
            end = 4 + _int_from_bytes(pending[:4], "big")
            if len(pending) < end:
                pending += _read_exact(rfd, end - len(pending))
            request = _pickle.loads(pending[4:end])
            pending = pending[end:]
        except BaseException:
            return
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
        _send(wfd, message)


def _close_fds_except(keep):
    """Close every descriptor but ``keep``. From Python 3.10, ``closerange`` is one close_range()
    call whatever the range (listing /proc/self/fd first cost a tenth of a millisecond per
    program); older ones close one descriptor at a time, so they list the open ones first."""
    top = 1024
    try:
        top = max(top, min(os.sysconf("SC_OPEN_MAX"), 65536))
    except Exception:
        pass
    if sys.version_info < (3, 10):  # noqa: UP036  (the sandbox's Python may be 3.8)
        try:
            top = max(int(name) for name in os.listdir("/proc/self/fd")) + 1
        except Exception:
            pass
    low = 0
    for fd in sorted(keep) + [top]:
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1


def _start_candidate(spec, nonce):
    type_modified = _TYPE_MODIFIED if spec.get("remove_methods") else None
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
