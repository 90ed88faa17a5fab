"""Compiled toolchain files the local sandbox shares read-only with every program: today the
precompiled ``<bits/stdc++.h>`` that most competitive C++ includes.

Compiling ``#include <bits/stdc++.h>`` costs g++ about 1.5 s of CPU per program; with the header
precompiled it costs about 0.3 s. The precompiled header is built here, on the host, from the
system's own header by the system's own g++ (no program's text is involved), once per machine and
compiler version, in the background the first time a local provider starts; it is bound read-only
at ``PCH_INSIDE``, where the I/O judge's C++ command looks first (``-I``). g++ uses it only when it
matches the compile's flags and compiler exactly, and reads the real header otherwise, so a stale
or missing file costs time, never a verdict. A program cannot write there: the bind is read-only.

The cache lives in ``$TRL_SANDBOX_CACHE``, else ``/var/cache/trl-sandbox`` for root (the sandbox's
host user, nobody, must be able to read it; root's home is closed to it), else
``$XDG_CACHE_HOME/trl-sandbox`` or ``~/.cache/trl-sandbox``.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import threading
from pathlib import Path

log = logging.getLogger("trl_sandbox.local.toolchain_cache")

PCH_INSIDE = "/opt/trl-sandbox/pch"
PCH_FLAGS = ("-std=c++17", "-O2")  # the I/O judge's C++ flags: a header built with others is ignored
_PATH = "/usr/local/bin:/usr/bin:/bin"
_started: set[Path] = set()


def cache_root() -> Path:
    if os.environ.get("TRL_SANDBOX_CACHE"):
        return Path(os.environ["TRL_SANDBOX_CACHE"])
    if os.geteuid() == 0:
        return Path("/var/cache/trl-sandbox")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "trl-sandbox"


def _header(gxx: str) -> str | None:
    """Where ``#include <bits/stdc++.h>`` resolves for this g++ (None: it has no such header)."""
    try:
        done = subprocess.run([gxx, *PCH_FLAGS, "-x", "c++", "-E", "-H", "-"], input=b"#include <bits/stdc++.h>\n",
                              capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    for line in done.stderr.decode(errors="replace").splitlines():
        if line.startswith(". ") and line.endswith("bits/stdc++.h"):
            return line[2:].strip()
    return None


def _build(gxx: str, header: str, target: Path) -> None:
    lock_path = target.parent.parent / ".building"
    with open(lock_path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return  # another process is building it
        if target.exists():
            return
        for stale in target.parent.glob(f".{target.name}.*"):  # a build whose process died
            stale.unlink(missing_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}")
        try:
            done = subprocess.run([gxx, *PCH_FLAGS, "-x", "c++-header", header, "-o", str(partial)],
                                  capture_output=True, timeout=600)
            if done.returncode == 0:
                partial.chmod(0o644)
                os.replace(partial, target)  # appears whole, or not at all
            else:
                log.warning("precompiling <bits/stdc++.h> failed (C++ compiles stay slower): %s",
                            done.stderr.decode(errors="replace")[-300:])
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("precompiling <bits/stdc++.h> failed (C++ compiles stay slower): %s", exc)
        finally:
            partial.unlink(missing_ok=True)


@functools.cache
def pch_dir(wait: bool = False) -> Path | None:
    """The directory to bind at ``PCH_INSIDE`` (made now), or None without g++ or a writable cache.
    A missing precompiled header is built in a background thread (``wait``: in this one)."""
    gxx = shutil.which("g++", path=_PATH)
    if gxx is None:
        return None
    header = _header(gxx)
    if header is None:
        return None
    try:
        version = subprocess.run([gxx, "--version"], capture_output=True, timeout=30).stdout
        stamp = f"{os.stat(header).st_mtime_ns}"
    except (OSError, subprocess.SubprocessError):
        return None
    key = hashlib.sha256(b"\0".join([version, header.encode(), stamp.encode(), " ".join(PCH_FLAGS).encode()])).hexdigest()[:16]
    root = cache_root() / "pch" / key
    try:
        (root / "bits").mkdir(parents=True, exist_ok=True)
        for path in (cache_root(), cache_root() / "pch", root, root / "bits"):
            if path.stat().st_uid == os.geteuid():
                path.chmod(0o755)
    except OSError as exc:
        log.warning("no toolchain cache at %s (C++ compiles stay slower): %s", root, exc)
        return None
    target = root / "bits" / "stdc++.h.gch"
    if not target.exists() and root not in _started:
        _started.add(root)
        if wait:
            _build(gxx, header, target)
        else:
            threading.Thread(target=_build, args=(gxx, header, target), name="trl-sandbox-pch", daemon=True).start()
    return root
