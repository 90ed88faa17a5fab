"""What sandboxed code can see and reach: no network, no host environment, no host files, no
privileges, no access to the supervisor. Each test looks from inside and, where it matters,
checks from the host too."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import tempfile
import threading
import uuid

import pytest

from trl_sandbox.sandbox import ConfigError, InfraError

from .local_helpers import Host, host_uid_of, local_host

SECRET_VAR = "TRL_SANDBOX_TEST_SECRET"
SECRET = "s3cr3t-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
def host():
    os.environ[SECRET_VAR] = SECRET  # set before any sandbox exists
    try:
        with local_host() as h:
            yield h
    finally:
        os.environ.pop(SECRET_VAR, None)


@pytest.fixture(scope="module")
def box(host):
    return host.create()


def inside(box, source: str, **kwargs):
    """Run ``source`` in the sandbox and return what it printed as JSON."""
    r = box.py(source, **kwargs)
    assert r.exit_code == 0, r
    return json.loads(r.stdout)


# -- network ----------------------------------------------------------------------------------


def test_no_route_to_anywhere_and_only_loopback(box):
    info = inside(box, """
import json, os
routes = open('/proc/net/route').read().splitlines()[1:] + open('/proc/net/ipv6_route').read().splitlines()
ifaces = [line.split(':')[0].strip() for line in open('/proc/net/dev').read().splitlines()[2:]]
print(json.dumps({'routes': routes, 'ifaces': ifaces}))
""")
    assert info["ifaces"] == ["lo"]
    assert [r for r in info["routes"] if not r.startswith("00000000000000000000000000000001")
            and " lo" not in r and "lo" != r.split()[-1]] == []


def test_outside_addresses_are_unreachable(box):
    # The route table is checked in the same program first: if it were not empty, the program
    # would stop before sending anything, so this test can never put a packet on a real network.
    r = box.py("""
import errno, socket, sys
if open('/proc/net/route').read().splitlines()[1:]:
    sys.exit('routes present: refusing to try')
for family, addr in ((socket.AF_INET, ('192.0.2.1', 80)), (socket.AF_INET6, ('2001:db8::1', 80))):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect(addr)
        print('CONNECTED', addr)
    except OSError as exc:
        print(errno.errorcode.get(exc.errno, exc.errno))
try:
    socket.getaddrinfo('example.com', 80)
    print('RESOLVED')
except OSError:
    print('no dns')
""")
    assert r.exit_code == 0, r
    assert r.stdout.split() == ["ENETUNREACH", "ENETUNREACH", "no", "dns"]


def test_a_server_on_the_host_loopback_cannot_be_reached(box):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted = []

    def accept():
        try:
            conn, _ = server.accept()
            accepted.append(conn)
        except OSError:
            pass

    t = threading.Thread(target=accept)
    t.start()
    try:
        r = box.py(f"""
import socket
try:
    socket.create_connection(('127.0.0.1', {port}), timeout=2)
    print('connected')
except OSError as exc:
    print(type(exc).__name__)
""")
    finally:
        t.join()
        server.close()
    assert r.stdout == "ConnectionRefusedError\n"
    assert accepted == []


# -- environment, files, identity --------------------------------------------------------------


def test_host_environment_never_reaches_the_sandbox(box):
    assert os.environ[SECRET_VAR] == SECRET
    r = box.exec(["sh", "-c", "env; cat /proc/self/environ /proc/[0-9]*/environ 2>/dev/null"])
    assert r.exit_code in (0, 1)
    assert SECRET not in r.stdout and SECRET_VAR not in r.stdout
    env = inside(box, "import os, json; print(json.dumps(dict(os.environ)))")
    assert set(env) <= {"PATH", "HOME", "LANG", "PWD", "LC_CTYPE"}
    assert not any(k.endswith(("_KEY", "_TOKEN")) for k in env)


def test_host_files_are_not_visible(box, tmp_path):
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text(SECRET)
    root_secret = f"/root/.trl-sandbox-test-{uuid.uuid4().hex}"
    with open(root_secret, "w") as f:
        f.write(SECRET)
    try:
        probe = json.dumps([str(secret_file), root_secret, "/etc/shadow", "/etc/hostname", "/work/main/pyproject.toml",
                            "/home", "/root", "/var", "/boot", "/sys/kernel"])
        seen = inside(box, f"""
import json, os
out = {{}}
for p in {probe}:
    try:
        out[p] = 'dir' if os.path.isdir(p) and os.listdir(p) is not None else open(p).read()
    except OSError as exc:
        out[p] = type(exc).__name__
print(json.dumps(out))
""")
    finally:
        os.unlink(root_secret)
    assert all(v in ("FileNotFoundError", "PermissionError") for v in seen.values()), seen
    etc = inside(box, "import os, json; print(json.dumps(sorted(os.listdir('/etc'))))")
    assert "shadow" not in etc and "passwd" in etc
    toolchain_config = {name for name in etc if name.startswith("java-") and name.endswith("-openjdk")}
    assert set(etc) - toolchain_config <= {"passwd", "group", "hosts", "ld.so.cache", "ld.so.conf", "ld.so.conf.d",
                                           "alternatives", "localtime", "nsswitch.conf"}
    # /opt holds only the precompiled C++ header the local provider builds (read-only), if any.
    opt = inside(box, "import os, json; print(json.dumps({d: sorted(os.listdir(d)) for d, _, _ in os.walk('/opt')}))")
    assert set(opt) <= {"/opt", "/opt/trl-sandbox", "/opt/trl-sandbox/pch", "/opt/trl-sandbox/pch/bits"}, opt
    assert set(opt.get("/opt/trl-sandbox/pch/bits", [])) <= {"stdc++.h.gch"}, opt
    passwd = box.exec(["cat", "/etc/passwd"]).stdout
    assert "sandbox:x:1000:1000" in passwd and len(passwd.splitlines()) == 3


def test_nothing_outside_the_scratch_areas_is_writable(box):
    result = inside(box, """
import json, os
out = {}
for p in ['/x', '/usr/x', '/usr/lib/x', '/etc/x', '/etc/passwd', '/bin/x', '/home/x', '/root/x', '/dev/x', '/proc/x',
          '/proc/sys/kernel/hostname', '/sys/x', '/.trl-sandbox/supervisor.py',
          '/.trl-sandbox/_trl_sandbox_supervisor/kernel.py', '/.trl-sandbox/x']:
    try:
        with open(p, 'w') as f:
            f.write('x')
        out[p] = 'WROTE'
    except OSError as exc:
        out[p] = type(exc).__name__
for p in ['/work/ok', '/tmp/ok', '/dev/shm/ok']:
    with open(p, 'w') as f:
        f.write('x')
    out[p] = 'ok'
print(json.dumps(out))
""")
    assert "WROTE" not in result.values(), result
    assert [p for p, v in result.items() if v == "ok"] == ["/work/ok", "/tmp/ok", "/dev/shm/ok"]


def test_runs_as_an_unprivileged_user_inside_and_outside(box):
    info = inside(box, """
import json, os, socket
status = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines())
print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), 'groups': os.getgroups(),
                  'cap': status['CapEff'].strip(), 'nnp': status['NoNewPrivs'].strip(),
                  'host': socket.gethostname(), 'procs': sorted(int(p) for p in os.listdir('/proc') if p.isdigit())}))
""")
    assert (info["uid"], info["gid"]) == (1000, 1000) and set(info["groups"]) <= {1000}
    assert info["cap"] == "0000000000000000" and info["nnp"] == "1"
    assert info["host"] == "sandbox"
    assert info["procs"][0] == 1 and len(info["procs"]) <= 2, "only the supervisor and the program itself"
    if os.geteuid() == 0:
        # bwrap drops to an unprivileged host uid: nothing in the sandbox maps to host root.
        assert host_uid_of(box.bwrap_pid) == 65534
        assert host_uid_of(box.supervisor_pid()) == 65534


def test_no_new_namespaces_mounts_or_privileges(box):
    r = box.exec(["sh", "-c", "unshare -U true; echo u=$?; unshare -n true; echo n=$?; mount -t tmpfs none /tmp 2>&1; echo m=$?"])
    codes = dict(line.split("=") for line in r.stdout.split() if "=" in line)
    assert codes["u"] != "0" and codes["n"] != "0" and codes["m"] != "0"


def test_the_supervisor_is_closed_to_sandboxed_code(box):
    info = inside(box, """
import ctypes, json, os
out = {}
for p in ['/proc/1/fd', '/proc/1/environ', '/proc/1/mem', '/proc/1/maps', '/proc/1/cwd/.']:
    try:
        out[p] = os.listdir(p) if p.endswith(('fd', '.')) else len(open(p, 'rb').read(100))
    except OSError as exc:
        out[p] = type(exc).__name__
libc = ctypes.CDLL(None, use_errno=True)
out['ptrace'] = libc.ptrace(16, 1, 0, 0)  # PTRACE_ATTACH
out['ptrace_errno'] = ctypes.get_errno()
# A process can still read its own /proc entries.
out['self_fd'] = sorted(os.listdir('/proc/self/fd'))[:3]
out['self_environ'] = len(open('/proc/self/environ', 'rb').read()) > 0
print(json.dumps(out))
""")
    for p in ("/proc/1/fd", "/proc/1/environ", "/proc/1/mem", "/proc/1/maps", "/proc/1/cwd/."):
        assert info[p] == "PermissionError", (p, info[p])
    assert info["ptrace"] == -1 and info["ptrace_errno"] == 1  # EPERM
    assert info["self_fd"] == ["0", "1", "2"] and info["self_environ"]


def test_sandboxes_do_not_see_each_other(host, box):
    other = host.create()
    box.write("mine.txt", "private")
    box.exec(["sh", "-c", "echo shared > /tmp/t; echo shm > /dev/shm/s"])
    r = other.exec(["sh", "-c", "ls -A /work /tmp /dev/shm"])
    assert "mine.txt" not in r.stdout and "t" not in r.stdout.split() and "s" not in r.stdout.split()
    assert box.namespace_members() != other.namespace_members()
    other.destroy()


# -- the supervisor -------------------------------------------------------------------------------


def test_the_supervisors_modules_do_not_shadow_a_programs(box):
    for name in ("main", "protocol", "kernel", "state", "child"):
        box.write(f"{name}.py", f"WHO = 'program {name}'\n")
    r = box.py("import main, protocol, kernel, state, child, sys\n"
               "print(main.WHO, protocol.WHO, kernel.WHO, state.WHO, child.WHO)\n"
               "print([p for p in sys.path if 'trl-sandbox' in p])")
    assert r.stdout == "program main program protocol program kernel program state program child\n[]\n", r
    box.reset()


def test_what_the_supervisor_says_on_its_stderr_reaches_the_host():
    """bwrap's stderr is drained all along; its tail explains a supervisor that died."""
    with local_host() as h:
        h.provider._supervisor_options = {"memory_mode": "bogus"}
        with pytest.raises(InfraError, match="memory_mode must be 'deny' or 'cgroup'"):
            h.create()
        h.provider._supervisor_options = {}
        assert h.create().py("print('fine')").stdout == "fine\n"  # control: the same host, a valid mode


def test_a_kernel_that_refuses_the_isolation_is_a_config_error_at_construction():
    # bwrap without --cap-add: the supervisor cannot own a mount namespace (as on a kernel or
    # container runtime that refuses it). The real bwrap with the same settings works.
    folder = tempfile.mkdtemp(prefix="trl-sandbox-bwrap-")
    os.chmod(folder, 0o755)
    wrapper = os.path.join(folder, "bwrap")
    with open(wrapper, "w") as f:
        f.write("#!/bin/sh\nskip=0\nfor a; do shift\n  if [ $skip = 1 ]; then skip=0; continue; fi\n"
                "  if [ \"$a\" = --cap-add ]; then skip=1; continue; fi\n  set -- \"$@\" \"$a\"\ndone\n"
                f"exec {shutil.which('bwrap')} \"$@\"\n")
    os.chmod(wrapper, stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    try:
        with pytest.raises(ConfigError) as info:
            Host(bwrap=wrapper)
        message = str(info.value)
        assert "kernel check failed" in message and "CONFIG_SECCOMP_FILTER" in message, message
        Host().close()
    finally:
        os.unlink(wrapper)
        os.rmdir(folder)
