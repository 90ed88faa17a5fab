"""Per-sandbox cgroups of the local provider: made, filled, bounding, removed, reaped.

Real bubblewrap sandboxes and the real kernel interfaces. These tests need what this machine and
CI have (root, cgroup v1 controllers or a delegated cgroup v2 subtree); where a test turns a
defence off to show the attack works, it says so.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid

import pytest

from trl_sandbox.local.cgroups import PID_HEADROOM, PREFIX, Cgroups
from trl_sandbox.sandbox import ConfigError

from .local_helpers import local_host, wait_for


def _file(group_dirs: list[str], name: str) -> str:
    path = next((os.path.join(d, name) for d in group_dirs if os.path.exists(os.path.join(d, name))), None)
    assert path, f"no {name} in {group_dirs}"
    return path


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


@pytest.fixture(scope="module")
def host():
    with local_host() as h:
        assert h.provider.isolation_mode != "none", (
            f"these tests need cgroups (root with v1 controllers, or a delegated v2 subtree): "
            f"{h.provider._cgroups.reason}"
        )
        yield h


def test_every_process_of_a_sandbox_is_in_its_group_with_the_limits(host):
    box = host.create(memory_mb=300, limits={"max_processes": 20})
    group = box.sandbox.group
    assert group is not None
    # bwrap and the supervisor started inside; a program's processes are born inside.
    assert {box.bwrap_pid, box.supervisor_pid()} <= group.pids()
    result = box.py("import os, time\nif os.fork() == 0:\n    time.sleep(30)\nprint(os.getpid())\ntime.sleep(0.5)",
                    timeout=5)
    assert result.exit_code == 0
    assert set(box.namespace_members()) <= group.pids()
    assert _read(_file(group.dirs, "pids.max")) == str(20 + PID_HEADROOM)
    if host.provider._cgroups.version == 1:
        assert _read(_file(group.dirs, "cpu.shares")) == "1024"
        assert int(_read(_file(group.dirs, "memory.limit_in_bytes"))) == 300 << 20
    else:
        assert _read(_file(group.dirs, "cpu.weight")) == "100"
        assert int(_read(_file(group.dirs, "memory.max"))) == 300 << 20
    # The cgroup namespace hides where the group is.
    lines = box.py("print(open('/proc/self/cgroup').read())").stdout.split()
    assert lines and all(line.endswith(":/") for line in lines), lines
    box.destroy()
    assert not any(os.path.exists(d) for d in group.dirs)


def test_close_removes_the_run_groups():
    with local_host() as h:
        cgroups = h.provider._cgroups
        # Nothing exists until the first sandbox (a provider built only to list or reap leaves nothing).
        assert not any(os.path.exists(os.path.join(b, cgroups.run)) for b in cgroups.bases.values())
        box = h.create()
        dirs = list(h.provider._cgroups.run_dirs)
        assert dirs and all(os.path.isdir(os.path.join(d, box.id)) for d in dirs)
    assert not any(os.path.exists(d) for d in dirs)


def test_groups_of_a_dead_run_are_reaped_at_start_and_a_live_run_is_left_alone():
    probe = Cgroups("auto")
    try:
        dead = subprocess.Popen(["true"])
        dead.wait()
        stale_run = f"{PREFIX}{dead.pid}-{uuid.uuid4().hex[:8]}"
        live_run = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        made = []
        for base in sorted(set(probe.bases.values())):
            for run in (stale_run, live_run):
                path = os.path.join(base, run, "local-leftover")
                os.makedirs(path)
                made.append(path)
        # A process left in the dead run's group (as if it had outlived its run) is killed too.
        leftover = subprocess.Popen(["sleep", "60"])
        pids_dir = os.path.join(probe.bases["pids"], stale_run, "local-leftover")
        with open(os.path.join(pids_dir, "cgroup.procs"), "w") as f:
            f.write(str(leftover.pid))
        with local_host():
            pass
        assert leftover.wait(timeout=10) == -9
        for path in made:
            assert os.path.exists(path) == (live_run in path), path
    finally:
        for base in sorted(set(probe.bases.values())):
            for path in (os.path.join(base, live_run, "local-leftover"), os.path.join(base, live_run)):
                if os.path.exists(path):
                    os.rmdir(path)
        asyncio.run(probe.close())


FORK_MANY = (
    "import os, time\n"
    "n = 0\n"
    "try:\n"
    "    for _ in range(40):\n"
    "        if os.fork() == 0:\n"
    "            time.sleep(5)\n"
    "            os._exit(0)\n"
    "        n += 1\n"
    "except OSError as e:\n"
    "    print('stopped', n, e.errno)\n"
    "else:\n"
    "    print('forked', n)\n"
)


def test_pids_max_stops_a_fork_bomb_at_the_cap(host):
    """The group's cap binds whatever the rlimits say: set below RLIMIT_NPROC here, it is what stops
    the program (EAGAIN), counted in ``pids.events``; the same program forks all 40 without it."""
    box = host.create(limits={"max_processes": 64})
    group = box.sandbox.group
    with open(_file(group.dirs, "pids.max"), "w") as f:
        f.write("12")
    result = box.py(FORK_MANY, timeout=10)
    assert result.stdout.startswith("stopped"), result
    count, err = result.stdout.split()[1:]
    assert int(err) == 11 and int(count) < 12
    assert int(_read(_file(group.dirs, "pids.events")).split()[-1]) > 0
    assert box.alive()
    box.destroy()
    # Positive control: a sandbox of the same provider with its usual cap forks them all.
    other = host.create(limits={"max_processes": 64})
    assert other.py(FORK_MANY, timeout=10).stdout.strip() == "forked 40"
    other.destroy()


PIN = {
    "memfd": (
        "import os, mmap\nheld = []\nn = 0\n"
        "for _ in range(12):\n"
        "    fd = os.memfd_create('x'); os.ftruncate(fd, 50 << 20)\n"
        "    m = mmap.mmap(fd, 50 << 20); m.write(b'x' * (50 << 20)); m.close(); held.append(fd); n += 50\n"
        "    print('pinned', n, flush=True)\n"
    ),
    "sysv_shm": (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.shmat.restype = ctypes.c_void_p\nn = 0\n"
        "for _ in range(12):\n"
        "    sid = libc.shmget(0, 50 << 20, 0o600)\n"
        "    if sid < 0:\n        raise OSError(ctypes.get_errno(), 'shmget')\n"
        "    ctypes.memset(libc.shmat(sid, None, 0), 1, 50 << 20); n += 50\n"
        "    print('pinned', n, flush=True)\n"
    ),
    "tmpfs": (
        "n = 0\nchunk = b'x' * (1 << 20)\n"
        "for d in ('/work', '/tmp', '/dev/shm'):\n"
        "    for i in range(4):\n"
        "        with open(f'{d}/f{i}', 'wb') as f:\n"
        "            for _ in range(50):\n                f.write(chunk)\n"
        "        n += 50\n"
        "        print('pinned', n, flush=True)\n"
    ),
}


def _pinned(stdout: str) -> int:
    lines = stdout.split()
    return int(lines[-1]) if lines else 0


@pytest.mark.parametrize("kind", sorted(PIN))
def test_memory_a_program_pins_outside_its_address_space_is_bounded_by_the_group(kind):
    """600 MB held in memfd, SysV shm or tmpfs files: a 200 MB sandbox stops it (the program is
    killed or gets an error), the host and the sandbox's group are fine; a 2 GB one holds it all
    (positive control: the group's limit is what stops it)."""
    # tmpfs caps are raised above the pinned total, so only the group can stop the tmpfs case.
    with local_host(work_size_mb=700, tmp_size_mb=700, shm_size_mb=700) as h:
        assert h.provider._cgroups.memory, h.provider._cgroups.reason
        small = h.create(memory_mb=200, limits={"memory_mb": 4096, "file_size_mb": 1024})
        result = small.py(PIN[kind], timeout=30)
        assert _pinned(result.stdout) < 200, result
        assert result.exit_code != 0 and result.oom_killed, result
        peak_file = "memory.max_usage_in_bytes" if h.provider._cgroups.version == 1 else "memory.peak"
        assert int(_read(_file(small.sandbox.group.dirs, peak_file))) <= 200 << 20
        if kind != "tmpfs":
            # The program is the OOM killer's choice, not the supervisor (it scores lower), and what
            # it pinned dies with it: the sandbox lives on and runs the next program.
            assert small.alive(), "the supervisor was killed instead of the program"
            small.reset()
            assert small.py("print('next')").stdout == "next\n"
        # (Files a program left in tmpfs stay charged after it dies, so the supervisor may be the next
        # victim: the sandbox dies, the exec above still says oom_killed, and a pool replaces it.)
        small.destroy()

        big = h.create(memory_mb=2048, limits={"memory_mb": 4096, "file_size_mb": 1024})
        control = big.py(PIN[kind], timeout=30)
        assert control.exit_code == 0 and _pinned(control.stdout) == 600, control
        big.destroy()


def test_usage_reports_the_cpu_the_sandboxes_used(host):
    box = host.create()
    host.provider.usage()
    assert box.py("x = 0\nfor i in range(3_000_000):\n    x += i").exit_code == 0
    usage = host.provider.usage()
    assert usage["sandbox/isolation_mode"] == host.provider.isolation_mode
    assert 0.05 < usage["sandbox/cpu_s"] < 30
    assert host.provider.usage()["sandbox/cpu_s"] < usage["sandbox/cpu_s"]
    box.destroy()


def test_usage_without_cgroups_comes_from_the_process_trees():
    with local_host(cgroups="off") as h:
        assert h.provider.isolation_mode == "none"
        box = h.create()
        assert box.sandbox.group is None
        h.provider.usage()
        assert box.py("x = 0\nfor i in range(3_000_000):\n    x += i").exit_code == 0
        usage = h.provider.usage()
        assert usage["sandbox/isolation_mode"] == "none"
        assert 0.05 < usage["sandbox/cpu_s"] < 30


@pytest.mark.parametrize("setting, match", [
    ("v2-please", "must be one of auto, off, v1, v2"),
    ("v3", "must be one of"),
])
def test_an_unknown_cgroups_setting_is_a_config_error(setting, match):
    with pytest.raises(ConfigError, match=match):
        Cgroups(setting)


def test_a_mode_the_kernel_refuses_is_a_config_error_that_says_what_to_change():
    refused = [mode for mode in ("v1", "v2") if not _usable(mode)]
    assert refused or os.path.exists("/sys/fs/cgroup/cgroup.subtree_control"), "nothing refused here"
    for mode in refused:
        with pytest.raises(ConfigError, match=r"cgroups='auto'.*cgroups='off'"):
            Cgroups(mode)


def _usable(mode: str) -> bool:
    try:
        c = Cgroups(mode)
    except ConfigError:
        return False
    asyncio.run(c.close())
    return True


def test_groups_are_gone_when_a_sandbox_dies_and_is_destroyed(host):
    box = host.create()
    group = box.sandbox.group
    os.kill(box.bwrap_pid, 9)
    assert wait_for(lambda: not box.alive(), timeout=10)
    box.destroy()
    assert not any(os.path.exists(d) for d in group.dirs)
