"""The forked child: become the program, with fresh standard streams, the rlimits, and a clean
kernel (``kernel.enter_program``), then run it as a fresh interpreter (or ``execve``) would.

The supervisor's stack is already unwound when this runs (see ``main.main``): the frames that
handled earlier requests are gone.
"""

import _signal
import atexit
import builtins
import errno
import gc
import mmap
import os
import resource
import signal
import sys

from . import kernel
from . import state as S

# Exit status of a child that could not be started (command not found, bad cwd), as in a shell.
EXIT_NOT_FOUND, EXIT_CANNOT_RUN = 127, 126


def child_fail(message, code):
    try:
        os.write(2, f"trl-sandbox: {message}\n".encode("utf-8", "replace"))
    finally:
        os._exit(code)


OOM_PROGRAM = 1000  # every program's processes and every candidate: the OOM killer's first choice
PR_GET_DUMPABLE = 3


def set_oom_score(value, keep=False):
    """Set this process's ``oom_score_adj`` to ``value`` and read it back; raise if that fails.
    With ``keep``, return the open file (the forker sets its candidates' score through it).

    The OOM killer's order in a sandbox: programs and candidates first (``OOM_PROGRAM``), then the
    judge and the forker (``S.OOM_HELPER``), the supervisor last (the score it was started with).
    A process forked from the non-dumpable supervisor is non-dumpable too, and then its /proc/self
    files belong to a root that the sandbox's user namespace does not map: it cannot open its own
    ``oom_score_adj`` (the write used to fail, unnoticed, and every process kept the supervisor's
    score). So it is dumpable for the write, and non-dumpable again after. Nothing else of the
    sandbox runs meanwhile (a program's child before its program, the judge and the forker when
    they start), and raising the score needs no privilege."""
    prctl = kernel.libc().prctl
    was = prctl(PR_GET_DUMPABLE, 0, 0, 0, 0)
    if was != 1:
        kernel.check(prctl(kernel.PR_SET_DUMPABLE, 1, 0, 0, 0), "PR_SET_DUMPABLE")
    try:
        fd = os.open("/proc/self/oom_score_adj", os.O_RDWR)
        try:
            os.write(fd, b"%d" % value)
            got = int(os.pread(fd, 16, 0))
        finally:
            if not keep:
                os.close(fd)
    finally:
        if was != 1:
            kernel.check(prctl(kernel.PR_SET_DUMPABLE, was, 0, 0, 0), "PR_SET_DUMPABLE")
    if got != value:
        raise OSError(f"oom_score_adj is {got}, not {value}")
    return fd if keep else None


def child_setup(job):
    """Common to both kinds of child: descriptors, signals, cwd, environment."""
    plan, code, argv, cwd, env, stdin_fd, out_w, err_w = job
    try:
        set_oom_score(OOM_PROGRAM)
    except (OSError, ValueError) as exc:
        os.dup2(err_w, 2)
        child_fail(f"cannot set the OOM score: {exc}", EXIT_CANNOT_RUN)
    if not S.USE_PIDFD:
        _signal.set_wakeup_fd(-1)
        _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
    os.dup2(stdin_fd, 0)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.closerange(3, S.FD_LIMIT)
    if cwd:
        try:
            os.chdir(os.path.join(S.WORK, cwd))
        except OSError as exc:
            child_fail(f"cannot change directory to {cwd!r}: {exc.strerror}", EXIT_NOT_FOUND)
    if env:
        os.environ.update(env)


def apply_limits(skip=()):
    setrlimit = resource.setrlimit
    skipped = [getattr(resource, n) for n in skip]
    for name, soft, hard in S.RLIMITS:
        if name in skipped:
            continue
        try:
            setrlimit(name, (soft, hard))
        except (ValueError, OSError):
            pass


def run_exec_child(job):
    argv = job[2]
    os.setpgid(0, 0)
    child_setup(job)
    if S.VERIFIER:
        try:
            kernel.read_only_proc()
        except OSError as exc:
            child_fail(f"cannot give the verifier a read-only /proc: {exc}", EXIT_CANNOT_RUN)
    # Python ignores these two; a program started by execve gets the default dispositions.
    _signal.signal(_signal.SIGPIPE, _signal.SIG_DFL)
    _signal.signal(_signal.SIGXFSZ, _signal.SIG_DFL)
    apply_limits()
    kernel.enter_program()
    try:
        os.execvpe(argv[0], argv, os.environ)
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in argv or env
        reason = exc.strerror if isinstance(exc, OSError) else str(exc)
        child_fail(f"cannot execute {argv[0]!r}: {reason}",
                   EXIT_NOT_FOUND if getattr(exc, "errno", None) == errno.ENOENT else EXIT_CANNOT_RUN)


def run_python_child(job):
    """Become a fresh ``__main__``, run the program, and exit as the interpreter would."""
    source, filename, sys_argv, path0, unbuffered, _ = job[0]
    code = job[1]
    # Its own process group before it runs anything (the parent sets it too, but may be late: a
    # child forked before that would stay in PID 1's group, out of reach of the group's kill).
    os.setpgid(0, 0)
    child_setup(job)
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__ = S.STREAMS[unbuffered]
    sys.argv = sys_argv
    sys.path = S.BASE_PATH if path0 is None else [path0] + S.BASE_PATH
    main = type(sys)("__main__")  # with the attributes the interpreter gives its __main__
    namespace = main.__dict__
    namespace["__annotations__"] = {}
    namespace["__builtins__"] = builtins
    if filename == "<string>":
        namespace["__loader__"] = sys.modules["_frozen_importlib"].BuiltinImporter
    else:
        namespace["__file__"] = filename
        namespace["__cached__"] = None
        if filename == "<stdin>":
            namespace["__loader__"] = sys.modules["_frozen_importlib"].BuiltinImporter
        else:
            namespace["__loader__"] = sys.modules["_frozen_importlib_external"].SourceFileLoader("__main__", filename)
    sys.modules["__main__"] = main
    _signal.signal(_signal.SIGINT, _signal.default_int_handler)
    gc.enable()
    status_page = S.STATUS
    try:  # the exec's status page is this process's alone: its own forks (an I/O judge's tests,
        # which would share one page from test to test) get none, as after execve
        status_page.madvise(mmap.MADV_DONTFORK)
    except (AttributeError, OSError, ValueError):
        pass
    apply_limits()
    kernel.enter_program()
    kernel.PREPARED.prctl(kernel.PR_SET_DUMPABLE, 1, 0, 0, 0)  # as after execve: /proc/self is its own again
    status = 0
    interrupted = False
    try:
        if code is None:  # compiled here, under the limits; warnings go to the program's stderr
            code = compile(source, filename, "exec", dont_inherit=True)
        elif isinstance(code, BaseException):
            raise code
        del job, source
        if callable(code):  # a warm program's main() (forkserver.do_exec)
            if "_SOLE" in code.__globals__:
                # The judge, run as a plain exec: nothing but it and its candidate's processes
                # is in the sandbox (judge_program._SOLE); this child's copy of its globals.
                code.__globals__["_SOLE"] = True
            code()
        else:
            exec(code, namespace)
    except SystemExit as exc:
        status = exit_status(exc)
    except BaseException as exc:
        if isinstance(exc, MemoryError):
            status_page[0] = 1
        interrupted = isinstance(exc, KeyboardInterrupt)
        status = 1
        tb = exc.__traceback__
        tb = tb.tb_next if tb is not None else None  # hide this frame, as the interpreter does
        try:
            sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        except BaseException:
            pass
    status = finish(status)
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status)


def exit_status(exc):
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(str(code) + "\n")
    except BaseException:
        pass
    return 1


def finish(status):
    """What Py_FinalizeEx does that a program can observe: join threads, atexit, flush."""
    threading = sys.modules.get("threading")  # only there if the program imported it
    if threading is not None:
        try:
            threading._shutdown()
        except SystemExit as exc:
            status = exit_status(exc)
        except BaseException:
            pass
    if atexit._ncallbacks():
        try:
            atexit._run_exitfuncs()
        except BaseException:
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            if stream is sys.stdout:
                status = 120
    return status
