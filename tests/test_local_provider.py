"""The local provider's contract: exec results, files, reset, cwd/env, the provider API, errors."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from trl_sandbox.local import LocalProvider, LocalSandbox
from trl_sandbox.sandbox import ConfigError, InfraError, Provider, Sandbox, SandboxSpec

from .local_helpers import Host, local_host, wait_for


@pytest.fixture(scope="module")
def host():
    with local_host() as h:
        yield h


@pytest.fixture(scope="module")
def box(host):
    return host.create(tags={"suite": "provider"})


# -- construction and the plugin --------------------------------------------------------------


def test_local_is_registered_through_the_plugin_hook():
    from trl_sandbox.plugins import make_provider, providers

    assert providers()["local"].obj is LocalProvider
    provider = make_provider("local", {})
    assert isinstance(provider, Provider)
    caps = provider.capabilities
    assert caps.fast_python and caps.separate_stderr and caps.network_isolation
    assert caps.max_concurrency and caps.max_concurrency >= 4


def test_missing_bwrap_is_a_config_error_that_says_how_to_install_it():
    with pytest.raises(ConfigError, match="apt-get install bubblewrap"):
        LocalProvider(bwrap="/nonexistent/bwrap")


def test_interpreters_that_the_sandbox_cannot_see_are_config_errors():
    with pytest.raises(ConfigError, match="does not exist"):
        LocalProvider(python="/usr/bin/no-such-python")
    with pytest.raises(ConfigError, match="absolute"):
        LocalProvider(python="python3")
    if not sys.executable.startswith("/usr/"):
        with pytest.raises(ConfigError, match="extra_ro_binds"):
            LocalProvider(python=sys.executable)


def test_network_is_refused_at_create(host):
    with pytest.raises(ConfigError, match="network"):
        host.run(host.provider.create(SandboxSpec(network=True)))


def test_sandbox_satisfies_the_protocol(box):
    assert isinstance(box.sandbox, Sandbox)
    assert isinstance(box.sandbox, LocalSandbox)
    assert box.sandbox.python_version.startswith("python 3.")


# -- exec results -----------------------------------------------------------------------------


def test_exit_codes_and_separate_streams(box):
    r = box.py("import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)")
    assert (r.exit_code, r.stdout, r.stderr) == (3, "out\n", "err\n")
    assert not r.timed_out and not r.oom_killed and not r.truncated
    assert 0 < r.duration_s < 5
    assert box.py("pass").ok
    assert box.py("raise SystemExit('bye')").exit_code == 1
    assert box.py("raise SystemExit('bye')").stderr == "bye\n"
    assert box.py("import sys; sys.exit(None)").exit_code == 0
    assert box.py("import os; os._exit(7)").exit_code == 7
    assert box.exec(["sh", "-c", "echo hi; echo oops >&2; exit 4"]).exit_code == 4
    assert box.exec(["sh", "-c", "kill -TERM $$"]).exit_code == -signal.SIGTERM


def test_exceptions_print_the_tracebacks_the_interpreter_would(box):
    r = box.py("def f():\n    1/0\nf()")
    assert r.exit_code == 1
    assert r.stderr.startswith("Traceback (most recent call last):\n  File \"<string>\", line 3, in <module>")
    assert r.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "supervisor" not in r.stderr
    r = box.py("def (")
    assert r.exit_code == 1 and "SyntaxError" in r.stderr and "Traceback" not in r.stderr


def test_stdin_is_given_or_empty(box):
    echo = "import sys; data = sys.stdin.read(); print(len(data), data.upper())"
    assert box.py(echo, stdin="hello").stdout == "5 HELLO\n"
    assert box.py(echo, stdin=b"abc\n").stdout == "4 ABC\n\n"
    assert box.py(echo).stdout == "0 \n"
    r = box.py("input()")
    assert r.exit_code == 1 and "EOFError" in r.stderr
    assert box.exec(["cat"], stdin=b"x" * 300_000).stdout == "x" * 300_000


def test_python_program_from_stdin(box):
    r = box.exec(["python3", "-", "a", "b"], stdin="import sys; print(sys.argv)")
    assert r.stdout == "['-', 'a', 'b']\n"
    r = box.exec(["python3"], stdin="print(6 * 7)")
    assert r.stdout == "42\n"


def test_python_argv_forms(box):
    assert box.exec(["python3", "-c", "import sys; print(sys.argv)", "x", "y"]).stdout == "['-c', 'x', 'y']\n"
    assert box.exec(["python", "-u", "-c", "print(1)"]).stdout == "1\n"
    assert box.exec(["/usr/bin/python3", "-Ic", "import sys; print(sys.path[0] != '')"]).stdout == "True\n"
    assert box.exec(["python3", "-c", "import sys; print(repr(sys.path[0]))"]).stdout == "''\n"
    box.write("pkg/main.py", "import sys, helper\nprint(sys.argv, __file__, __name__, helper.X)\n")
    box.write("pkg/helper.py", "X = 5\n")
    r = box.exec(["python3", "pkg/main.py", "arg"])
    assert r.stdout == "['pkg/main.py', 'arg'] /work/pkg/main.py __main__ 5\n"
    # Forms the fork server does not take run the real interpreter.
    r = box.exec(["python3", "-m", "json.tool"], stdin='{"a": 1}')
    assert r.exit_code == 0 and '"a": 1' in r.stdout
    assert box.exec(["python3", "-O", "-c", "assert False; print('optimised')"]).stdout == "optimised\n"
    r = box.exec(["python3", "missing.py"])
    assert r.exit_code == 2 and "missing.py" in r.stderr


def test_module_state_is_fresh_for_every_exec(box):
    r = box.py("import json, builtins, sys\njson.MARK = 1\nbuiltins.MARK = 2\nsys.modules['planted'] = json\nprint('set')")
    assert r.stdout == "set\n"
    r = box.py("import json, builtins, sys\nprint(hasattr(json, 'MARK'), hasattr(builtins, 'MARK'), 'planted' in sys.modules)")
    assert r.stdout == "False False False\n"
    draws = {box.py("import random; print(random.random())").stdout for _ in range(3)}
    assert len(draws) == 3, "every exec must start from fresh entropy"


def test_output_threads_and_atexit_are_finished_like_an_interpreter_exit(box):
    r = box.py(
        "import atexit, threading, time\n"
        "atexit.register(lambda: print('atexit'))\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()\n"
        "print('main', end='')"
    )
    assert r.exit_code == 0
    assert r.stdout == "mainthread\natexit\n"


def test_undecodable_output_is_replaced_not_fatal(box):
    r = box.exec(["python3", "-c", "import sys; sys.stdout.buffer.write(b'ok\\xff\\xfe'); print('é', file=sys.stderr)"])
    assert r.stdout == "ok\ufffd\ufffd" and r.stderr == "é\n"


def test_timeout_is_a_flag_not_an_exception(box):
    start = time.monotonic()
    r = box.py("while True: pass", timeout=0.5)
    assert r.timed_out and r.exit_code == -signal.SIGKILL and not r.ok
    assert 0.45 < r.duration_s < 5 and time.monotonic() - start < 8
    assert box.py("print(1)").ok


def test_a_timeout_is_cpu_time_and_the_wall_clock_a_backstop(host, box):
    """The budget counts the program's CPU, not the time it waited; one that sleeps or blocks still
    ends, at the backstop (wall_factor x timeout + wall_margin_s), and is counted apart."""
    host.provider.usage()
    waited = box.exec(["sh", "-c", "sleep 0.5; echo done"], timeout=0.3)  # 0.5 s of waiting, no CPU
    assert waited.ok and waited.stdout == "done\n", waited
    start = time.monotonic()
    slept = box.exec(["sleep", "60"], timeout=0.3)
    assert slept.timed_out and slept.exit_code == -signal.SIGKILL, slept
    assert 1.0 < slept.duration_s < 20 and time.monotonic() - start < 30  # ends at 4 x 0.3 + 2 s
    spun = box.py("while True: pass", timeout=0.3)
    assert spun.timed_out and spun.duration_s < slept.duration_s
    assert host.provider.usage()["sandbox/wall_timeouts"] == 1.0  # the sleeper, not the spinner


def test_output_is_capped_per_stream(host):
    box = host.create(limits={"output_bytes": 1000})
    r = box.py("import sys\nsys.stdout.write('a' * 5000)\nsys.stderr.write('b' * 10)")
    assert r.truncated and r.stdout == "a" * 1000 and r.stderr == "b" * 10 and r.exit_code == 0
    r = box.py("print('short')")
    assert not r.truncated
    box.destroy()


# -- files, cwd, env --------------------------------------------------------------------------


def test_write_and_read_files(box):
    box.write("a/b/c.bin", bytes(range(256)) * 10)
    assert box.read("a/b/c.bin") == bytes(range(256)) * 10
    assert box.read("/work/a/b/c.bin") == bytes(range(256)) * 10
    assert box.exec(["sh", "-c", "wc -c < a/b/c.bin"]).stdout.strip() == "2560"
    box.py("open('made.txt', 'w').write('from inside')")
    assert box.read("made.txt") == b"from inside"
    with pytest.raises(FileNotFoundError):
        box.read("nope.txt")
    for bad in ("../etc/passwd", "/etc/passwd", "a/../../x", "/work/../etc/shadow"):
        with pytest.raises(ValueError, match="outside"):
            box.read(bad)
        with pytest.raises(ValueError, match="outside"):
            box.write(bad, b"x")


def test_cwd_and_env(box):
    box.write("sub/f.txt", "in sub")
    assert box.exec(["cat", "f.txt"], cwd="sub").stdout == "in sub"
    assert box.py("import os; print(os.getcwd())", cwd="sub").stdout == "/work/sub\n"
    assert box.py("import os; print(os.getcwd())", cwd="/tmp").stdout == "/tmp\n"
    assert box.py("import os; print(os.getcwd())").stdout == "/work\n"
    r = box.exec(["pwd"], cwd="no/such/dir")
    assert r.exit_code == 127 and "no/such/dir" in r.stderr
    assert box.exec(["sh", "-c", "echo $FOO"], env={"FOO": "bar"}).stdout == "bar\n"
    assert box.py("import os; print(os.environ['FOO'])", env={"FOO": "baz"}).stdout == "baz\n"
    assert box.py("import os; print(os.environ.get('FOO'))").stdout == "None\n"
    # PYTHON* variables need a real interpreter start: they still apply.
    assert box.py("import sys; print(sys.flags.optimize)", env={"PYTHONOPTIMIZE": "1"}).stdout == "1\n"


def test_spec_env_is_the_only_environment(host):
    box = host.create(env={"TASK_SEED": "7"})
    env = box.py("import os; print(sorted(os.environ.items()))").stdout
    assert "('TASK_SEED', '7')" in env
    assert {k for k, _ in eval(env)} <= {"TASK_SEED", "PATH", "HOME", "LANG", "PWD", "LC_CTYPE"}
    assert box.exec(["sh", "-c", "echo $TASK_SEED $HOME"]).stdout == "7 /work\n"
    box.destroy()


def test_non_python_commands(box):
    assert box.exec(["/bin/echo", "a", "b c"]).stdout == "a b c\n"
    assert box.exec(["sh", "-c", "echo $((6*7))"]).stdout == "42\n"
    r = box.exec(["no-such-command"])
    assert r.exit_code == 127 and "no-such-command" in r.stderr
    box.write("notexec.sh", "echo hi")
    assert box.exec(["./notexec.sh"]).exit_code == 126
    assert box.exec([]).exit_code == 127


def test_bad_arguments_raise_before_anything_runs(box):
    with pytest.raises(TypeError):
        box.exec("python3 -c pass")
    with pytest.raises(ValueError):
        box.exec(["true"], timeout=0)


# -- reset, persistence, lifecycle ------------------------------------------------------------


def test_files_persist_between_execs_until_reset(host):
    box = host.create()
    box.py("open('keep.txt', 'w').write('1'); open('/tmp/t', 'w').write('2'); open('/dev/shm/s', 'w').write('3')")
    box.exec(["sh", "-c", "mkdir -p locked/inner && touch locked/inner/f && chmod 000 locked/inner locked && chmod 000 /work"])
    assert box.exec(["sh", "-c", "cat /tmp/t /dev/shm/s"]).stdout == "23"
    box.reset()
    r = box.exec(["sh", "-c", "ls -A /work /tmp /dev/shm; stat -c %a /work /tmp"])
    assert r.stdout.split() == ["/dev/shm:", "/tmp:", "/work:", "755", "1777"]
    assert box.py("print('still works')").stdout == "still works\n"
    box.destroy()


def test_a_reset_goes_with_the_next_request(host):
    """A pool resets a sandbox after every lease: the reset waits for the sandbox's next request
    and travels in the same write, answered first, so a job costs one round trip, not two."""
    box = host.create()
    box.write("left.txt", "from the last lease")
    supervisor = box.supervisor_pid()
    os.kill(supervisor, signal.SIGSTOP)
    try:
        host.run(box.sandbox.reset(), timeout=2.0)  # answered without the (stopped) supervisor
        # Control: a request that needs the supervisor waits for it.
        listing = host.loop.submit(box.sandbox.exec(["python3", "-c", "import os; print(os.listdir('.'))"], timeout=10))
        time.sleep(0.3)
        assert not listing.done()
    finally:
        os.kill(supervisor, signal.SIGCONT)
    assert listing.result(10).stdout == "[]\n"  # the reset ran first
    box.write("kept.txt", "this lease's")
    assert box.read("kept.txt") == b"this lease's"  # nothing due: nothing reset
    box.reset()
    with pytest.raises(OSError):
        box.read("kept.txt")  # a file operation takes the reset along too
    box.destroy()


def test_a_sandbox_that_dies_with_a_reset_due_fails_as_the_hosts_not_the_programs(host):
    """No program ran: the exec raises ``InfraError`` (a pool replaces the sandbox and runs the job
    elsewhere), never a result that a task would score against the program."""
    box = host.create()
    box.reset()
    os.kill(box.supervisor_pid(), signal.SIGKILL)
    with pytest.raises(InfraError):
        box.py("print('never runs')")
    # Control: a supervisor that dies during an exec gives that exec a result saying so.
    other = host.create()
    running = host.loop.submit(other.sandbox.exec(["python3", "-c", "import time; time.sleep(10)"], timeout=20))
    assert wait_for(lambda: len(other.namespace_members()) == 2)
    os.kill(other.supervisor_pid(), signal.SIGKILL)
    assert running.result(10).exit_code is None
    box.destroy()
    other.destroy()


def test_list_destroy_and_tags(host):
    a = host.create(tags={"run": "r1", "role": "a"})
    b = host.create(tags={"run": "r1", "role": "b"})
    listed = host.run(host.provider.list({"run": "r1"}))
    assert {i.id for i in listed} == {a.id, b.id}
    assert {i.state for i in listed} == {"running"}
    assert [i.id for i in host.run(host.provider.list({"run": "r1", "role": "b"}))] == [b.id]
    bwrap = a.bwrap_pid
    a.destroy()
    assert not os.path.exists(f"/proc/{bwrap}") or wait_for(lambda: not os.path.exists(f"/proc/{bwrap}"))
    assert not a.alive()
    with pytest.raises(InfraError):
        a.py("pass")
    assert [i.id for i in host.run(host.provider.list({"run": "r1"}))] == [b.id]
    host.run(host.provider.destroy(a.id))  # idempotent
    b.destroy()


def test_lifetime_is_enforced(host):
    box = host.create(lifetime_s=0.5)
    assert box.py("print(1)").ok
    assert wait_for(lambda: not box.alive(), timeout=5)
    with pytest.raises(InfraError, match="lifetime"):
        box.py("pass")
    box.destroy()


def test_lifetime_expiring_during_an_exec_is_an_infrastructure_error(host):
    box = host.create(lifetime_s=0.5)
    with pytest.raises(InfraError):
        box.py("import time; time.sleep(5)", timeout=10)
    box.destroy()


def test_supervisor_killed_from_outside_is_an_error_result_then_infra_errors(host):
    box = host.create()
    supervisor = box.supervisor_pid()
    fut = host.loop.submit(box.sandbox.exec(["python3", "-c", "import time; time.sleep(10)"], timeout=20))
    assert wait_for(lambda: len(box.namespace_members()) == 2), "the program should be running"
    os.kill(supervisor, signal.SIGKILL)
    r = fut.result(10)
    assert r.exit_code is None and "died" in r.stderr and not r.ok
    assert not box.alive()
    with pytest.raises(InfraError):
        box.py("pass")
    with pytest.raises(InfraError):
        box.reset()
    fresh = host.create()
    assert fresh.py("print('fresh')").stdout == "fresh\n"
    box.destroy()
    fresh.destroy()


def test_concurrent_sandboxes_run_side_by_side(host):
    import asyncio

    boxes = [host.create() for _ in range(3)]

    async def many():
        jobs = [b.sandbox.exec(["python3", "-c", f"print({i} * {j})"], timeout=10) for i, b in enumerate(boxes) for j in range(5)]
        return await asyncio.gather(*jobs)

    results = host.run(many())
    assert [r.stdout for r in results] == [f"{i * j}\n" for i in range(3) for j in range(5)]
    for b in boxes:
        b.destroy()


def test_a_second_provider_is_independent():
    host = Host()
    try:
        box = host.create(tags={"x": "y"})
        assert box.py("print(2)").stdout == "2\n"
    finally:
        host.close()
    assert not os.path.exists(f"/proc/{box.bwrap_pid}") or wait_for(lambda: not os.path.exists(f"/proc/{box.bwrap_pid}"))


def test_an_exec_cancelled_by_its_caller_retires_the_sandbox(host):
    import asyncio

    box = host.create()

    async def cancelled():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(box.sandbox.exec(["sleep", "5"], timeout=10), 0.2)

    host.run(cancelled())
    assert not box.alive(), "its answer is still on the way: the channel cannot be reused"
    with pytest.raises(InfraError):
        box.py("pass")
    box.destroy()


def test_extra_read_only_binds():
    import shutil
    import tempfile

    data = tempfile.mkdtemp(prefix="trl-sandbox-bind-")
    try:
        os.chmod(data, 0o755)
        with open(os.path.join(data, "table.csv"), "w") as f:
            f.write("a,b\n1,2\n")
        os.chmod(os.path.join(data, "table.csv"), 0o644)
        with pytest.raises(ConfigError, match="outside"):
            LocalProvider(extra_ro_binds=[(data, "/work/data")])
        host = Host(extra_ro_binds=[(data, "/data")])
        try:
            box = host.create()
            assert box.exec(["cat", "/data/table.csv"]).stdout == "a,b\n1,2\n"
            r = box.exec(["sh", "-c", "echo x > /data/new"])
            assert r.exit_code != 0 and "Read-only" in r.stderr
            box.reset()
            assert box.exec(["ls", "/data"]).stdout == "table.csv\n"
        finally:
            host.close()
    finally:
        shutil.rmtree(data)


def test_compiled_code_follows_the_source(box):
    for version in ("one", "two", "two", "three", "one"):
        box.write("prog.py", f"print({version!r})\n")
        assert box.exec(["python3", "prog.py"]).stdout == f"{version}\n"
        assert box.py(f"print({version!r})").stdout == f"{version}\n"
    for _ in range(3):  # a cached syntax error is reported like a fresh one
        r = box.py("x = (")
        assert r.exit_code == 1 and "SyntaxError" in r.stderr and "Traceback" not in r.stderr


PROBE = (
    "import os, signal, sys\n"
    "s = (sys.stdin, sys.stdout, sys.stderr)\n"
    "print([(f.name, f.encoding, f.errors, f.line_buffering, f.write_through, f.seekable(), f.isatty(),"
    " type(f.buffer).__name__) for f in s], sys.argv, sys.path, __name__, sys.stdin is sys.__stdin__,"
    " sorted(globals()), type(__loader__).__name__, globals().get('__file__'), globals().get('__cached__'),"
    " [signal.getsignal(n) for n in (signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD, signal.SIGTERM)],"
    " os.getcwd(), os.getpgid(0) == os.getpid(), sorted(os.environ))\n"
)


@pytest.mark.parametrize("form", ["-c", "-u -c", "-I -c", "script", "stdin"])
def test_forked_interpreter_looks_like_a_fresh_one(box, form):
    box.write("probe.py", PROBE)
    tail = {"script": ["probe.py", "x"], "stdin": ["-", "x"]}.get(form, [PROBE, "x"])
    flags = form.split()[:-1] if form.endswith("-c") else []
    if form.endswith("-c"):
        tail = ["-c", *tail]
    stdin = PROBE if form == "stdin" else "in"
    fresh = box.exec(["python3", "-O", *flags, *tail], stdin=stdin)  # -O: a real interpreter start
    forked = box.exec(["python3", *flags, *tail], stdin=stdin)
    assert forked.ok and fresh.ok, (forked, fresh)
    assert forked.stdout == fresh.stdout


def test_which_argv_forms_take_the_fork_server(box):
    probe = "import sys; print('typing' in sys.modules)"  # pre-imported only in the fork server
    box.write("p.py", probe)
    forked = [["python3", "-c", probe], ["python", "-I", "-c", probe], ["/usr/bin/python3", "-uc", probe],
              ["python3", "p.py"], ["python3", "-B", "-s", "p.py"], ["python3", "-"], ["python3"]]
    fresh = [["python3", "-O", "-c", probe], ["python3", "-X", "dev", "-c", probe], ["python3", "-W", "ignore", "p.py"]]
    for argv in forked:
        assert box.exec(argv, stdin=probe).stdout == "True\n", argv
    for argv in fresh:
        assert box.exec(argv, stdin=probe).stdout == "False\n", argv
    assert box.exec(["python3", "-c", probe], env={"PYTHONHASHSEED": "0"}).stdout == "False\n"


def test_closing_pools_leaves_asyncio_child_watching_undisturbed(caplog):
    """Stopping a sandbox signals bwrap without reaping it behind asyncio's child watcher.

    ``Popen.kill()`` polls with ``waitpid`` first; when it won the race against the watcher
    thread, asyncio logged "Unknown child process pid ..., will report returncode 255".
    """
    import logging

    from trl_sandbox.pool.sandbox_pool import SandboxPool

    caplog.set_level(logging.WARNING, logger="asyncio")
    for _ in range(8):
        with SandboxPool.open("local", size=2) as pool:
            for _ in range(5):
                assert pool.run(["python3", "-c", "print(1)"], timeout=5).stdout == "1\n"
    assert not [r.getMessage() for r in caplog.records if r.name == "asyncio"]


def test_a_pool_resets_a_local_sandbox_at_check_in_and_replaces_a_dead_one():
    """The pool takes a local sandbox back without a task of its own (``defer_reset``): the next
    lease still starts clean, and a sandbox that died meanwhile is still replaced, not reused."""
    from trl_sandbox.pool.sandbox_pool import SandboxPool

    with SandboxPool.open(LocalProvider(), size=1) as pool:
        wrote = pool.run(["sh", "-c", "echo x > left.txt; ls"], timeout=10)
        assert wrote.stdout == "left.txt\n"
        assert pool.run(["ls"], timeout=10).stdout == ""  # reset between the two leases
        (sandbox,) = list(pool._members.values())
        assert sandbox.defer_reset() is True  # the fast path is the one taken for local sandboxes
        os.kill(sandbox._proc.pid, signal.SIGKILL)  # bwrap, and the sandbox with it
        assert wait_for(lambda: sandbox._proc.returncode is not None or not sandbox._usable(), timeout=10)
        assert pool.run(["echo", "ok"], timeout=10).stdout == "ok\n"  # on a replacement
        assert sandbox.defer_reset() is False  # (control: a dead sandbox is not reset at once)
        (replacement,) = list(pool._members.values())
        assert replacement.id != sandbox.id
