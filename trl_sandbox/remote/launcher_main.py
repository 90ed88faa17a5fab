"""The launcher's entry (``python3 -I -S -c SOURCE SPEC ARGV...``): one program (``launcher.launch``),
or with ``{"probe": True}`` the probe that the provider runs once per new sandbox: what the image
allows (one JSON line), the processes every later sweep spares, and (with ``serve``) the resident
launcher left running where namespaces work. Sent last, after the text of the modules it uses.
"""

import ctypes
import os
import sys

if "launch" not in globals():
    # On the host (tests, linters) the parts are modules; sent to a sandbox, their text runs first.
    from trl_sandbox.remote.launcher import launch
    from trl_sandbox.remote.launcher_cleaning import baseline, dumps, ipc_baseline
    from trl_sandbox.remote.launcher_isolation import (
        MS_NODEV,
        MS_NOEXEC,
        MS_NOSUID,
        _mount,
        enter_namespaces,
        hide_dirs,
        own_user,
        private_namespaces,
        private_sweep,
        seal_filesystem,
    )
    from trl_sandbox.remote.launcher_resident import start_resident


def probe(spec):
    """What this image allows, and the processes present now (spared by every later sweep); with
    ``serve``, a resident launcher left running there (``launcher_resident``) where namespaces work."""
    allowed, hidden = None, False
    where = spec.get("serve")
    try:
        if where:
            os.makedirs(where, mode=0o700, exist_ok=True)
            # A file system of its own where the daemon may mount one: a program that fills
            # /dev/shm's inodes cannot then stop the next exec's answer FIFO from being made.
            if not os.path.ismount(where):
                _mount("tmpfs", where, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=1m,nr_inodes=16384,mode=700")
    except OSError:
        where = where if where and os.path.isdir(where) else None
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read)
        try:
            how = enter_namespaces()
            grandchild = os.fork()
            if grandchild == 0:
                private_namespaces(False)  # each lease's own IPC, UTS and network (loopback up)
                sealed = seal_filesystem("/tmp")
                try:  # the resident only where its directory can be hidden from every program
                    hide_dirs([where] if where else [])
                    hidden = bool(where)
                except OSError:
                    pass
                os.write(write, f"{how} {int(sealed)} {int(hidden)} {int(works(own_user))}".encode())
                os._exit(0)
            os.waitpid(grandchild, 0)
        except OSError:
            pass
        os._exit(0)
    os.close(write)
    answer = b""
    while True:
        chunk = os.read(read, 4096)
        if not chunk:
            break
        answer += chunk
    os.waitpid(child, 0)
    user = False
    if answer:
        how, sealed, hidden, user = answer.decode().split()
        allowed, hidden, user = (how, sealed == "1"), hidden == "1", user == "1"
    can_switch = False
    if os.geteuid() == 0:  # may programs run as another user? (not in a user namespace of one uid)
        child = os.fork()
        if child == 0:
            try:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            except OSError:
                os._exit(1)
            os._exit(0)
        can_switch = os.waitpid(child, 0)[1] == 0
    resident = None
    if where and allowed and hidden and any(os.access(os.path.join(d, "mkfifo"), os.X_OK)
                                 for d in os.environ.get("PATH", "/usr/bin:/bin").split(":")):
        try:
            resident = where if start_resident(where, launch) else None
        except OSError:
            pass
    print(dumps({"isolation": allowed[0] if allowed else "sweep", "read_only_root": bool(allowed and allowed[1]),
                 "uid": os.geteuid(), "switch_user": can_switch, "python": sys.version.split()[0],
                 "user_ns": user, "private": works(private_sweep, False),
                 "spare": baseline(), "ipc": ipc_baseline(), "resident": resident}))


def works(step, *args):
    """Whether ``step`` succeeds here, tried in a fork (which it changes, not us)."""
    child = os.fork()
    if child == 0:
        try:
            step(*args)
        except OSError:
            os._exit(1)
        os._exit(0)
    return os.waitpid(child, 0)[1] == 0


def hide_argv():
    """Blank this process's command line (``/proc/PID/cmdline``): it holds the spec, whose ``tag``
    marks the launcher's own failures, and a program that read it could print that failure line
    to turn its verdict into an infrastructure error. Forks (the namespace's init) inherit it."""
    with open("/proc/self/stat", "rb") as fh:
        stat = fh.read()
    fields = stat[stat.rfind(b")") + 2:].split()
    start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (proc(5) fields 48 and 49)
    if 0 < start < end:
        ctypes.memset(start, 0, end - start)


def main():
    spec = eval(sys.argv[1], {"__builtins__": {}}, {})  # a literal the host wrote (never the program)
    hide_argv()
    if spec.get("probe"):
        probe(spec)
        return
    launch(spec, sys.argv[2:])




if __name__ == "__main__":
    main()
