"""The lease launcher's ``userns`` mode (a daemon that is neither root nor holds CAP_SYS_ADMIN: the
program's namespaces come inside a user namespace of its own), which the fakes' root containers
never reach: the launcher runs here as ``nobody`` through ``setpriv``, with the conformance kit's
hostile programs (issue 36). No reset: nothing of the host is wiped."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from trl_sandbox.plugins.testing import attacks
from trl_sandbox.remote.lease import Lease

PYTHON = "/usr/bin/python3"


def _nobody_can_unshare() -> bool:
    if os.geteuid() != 0 or not shutil.which("setpriv") or not os.access(PYTHON, os.X_OK):
        return False
    done = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                           "unshare", "-U", "-p", "-f", "true"], capture_output=True)
    return done.returncode == 0


pytestmark = pytest.mark.skipif(not _nobody_can_unshare(),
                                reason="needs root to become nobody, and unprivileged user namespaces")


@pytest.fixture
def tmp_path():
    """A directory nobody may enter (pytest's own are root's alone)."""
    import tempfile

    path = tempfile.mkdtemp(prefix="trl-userns-")
    os.chmod(path, 0o777)
    from pathlib import Path

    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


def _run(tmp_path, argv: list[str], user_ns: bool = True, **spec) -> subprocess.CompletedProcess:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    os.chmod(work, 0o777)
    launcher, tag = Lease(isolation="userns", user_ns=user_ns).argv(argv, work=str(work), cwd=None, limits=None, timeout=3,
                                                     cap=1 << 20, **spec)
    launcher = [PYTHON if a == "python3" else a for a in launcher]
    return subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", *launcher],
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, cwd="/", timeout=30)


def test_userns_mode_holds_the_kernel_the_network_and_pid_1(tmp_path):
    kernel = _run(tmp_path, ["python3", "-c", attacks._KERNEL])
    assert kernel.returncode == 0, kernel
    report = json.loads(kernel.stdout)
    assert all(v != "opened" for k, v in report.items() if k != "hostname"), report

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    try:
        port = str(server.getsockname()[1])
        closed = _run(tmp_path, ["python3", "-c", attacks._REACH, port])
        opened = _run(tmp_path, ["python3", "-c", attacks._REACH, port], network=True)
    finally:
        server.close()
    assert closed.stdout.startswith("refused") and closed.stdout.endswith("own loopback\n"), closed
    assert opened.stdout == "reached\nown loopback\n", f"control: {opened!r}"

    signals = _run(tmp_path, ["python3", "-c", attacks._SIGNAL_INIT])
    assert (signals.returncode, signals.stdout) == (1, "wrong answer True\n"), signals


def test_userns_mode_ipc_objects_die_with_the_lease(tmp_path):
    made = _run(tmp_path, ["python3", "-c", attacks._IPC, "make"])
    found = _run(tmp_path, ["python3", "-c", attacks._IPC, "find"])
    made_report, found_report = json.loads(made.stdout), json.loads(found.stdout)
    assert made_report["shm"] and made_report["mq"], made
    assert found_report == {k: False for k in found_report}, found_report


def test_control_a_plain_process_of_nobody_reaches_the_port(tmp_path):
    """The same program outside the launcher, as nobody, reaches the host's loopback."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    try:
        done = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", PYTHON, "-c",
                               attacks._REACH, str(server.getsockname()[1])], capture_output=True, text=True,
                              timeout=30)
    finally:
        server.close()
    assert done.stdout.startswith("reached"), (done, sys.executable)


def test_userns_mode_runs_the_program_as_uid_1000_without_capabilities(tmp_path):
    """Inside the launcher's own user namespace, the program enters one more: uid 1000, no
    capability, no hostname, no mount. Control: without it the program is uid 0 there."""
    nested = _run(tmp_path, ["python3", "-c", attacks._PRIVILEGE])
    flat = _run(tmp_path, ["python3", "-c", attacks._PRIVILEGE], user_ns=False)
    report, control = json.loads(nested.stdout), json.loads(flat.stdout)
    assert (report["uid"], report["gid"], report["caps"]) == (1000, 1000, 0), report
    assert all(report[k] != "done" for k in ("sethostname", "mount", "sysctl")), report
    assert report["parent_caps"] != 0 and control["uid"] == 0, (report, control)
