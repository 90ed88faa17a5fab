"""What a local sandbox sees: the standard library but not the host's installed packages, a /proc
without host-wide secrets, and no setting that would undo either. Real bubblewrap sandboxes."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

from trl_sandbox import ConfigError, SandboxGRPOConfig
from trl_sandbox.local import LocalProvider
from trl_sandbox.local.mounts import site_dirs
from trl_sandbox.sandbox import ResourceLimits, SandboxSpec

from . import tiny
from .local_helpers import local_host

PYTHON = "/usr/bin/python3"


@pytest.fixture
def planted():
    """A module placed in the sandbox interpreter's first site directory under /usr, removed after."""
    host_dir = next(h for h, _ in site_dirs(PYTHON, []) if h.startswith("/usr/"))
    name = f"trl_sandbox_planted_{uuid.uuid4().hex[:8]}"
    path = os.path.join(host_dir, name + ".py")
    with open(path, "w") as f:
        f.write("SECRET = 'canonical solutions'\n")
    try:
        yield name
    finally:
        os.unlink(path)


def test_host_packages_are_invisible_and_packages_brings_one_back(planted):
    # Positive control: the host's own interpreter imports it.
    host = subprocess.run([PYTHON, "-c", f"import {planted}; print({planted}.SECRET)"], capture_output=True, text=True)
    assert host.stdout.strip() == "canonical solutions", host.stderr
    probe = f"import {planted}; print({planted}.SECRET)"
    with local_host() as h:
        box = h.create()
        hidden = box.py(probe)
        assert hidden.exit_code == 1 and "ModuleNotFoundError" in hidden.stderr, hidden
        # The standard library is all there; the site directories are empty and read-only.
        assert box.py("import json, sqlite3, email.mime.text, xml.dom.minidom; print('ok')").stdout == "ok\n"
        listing = box.py(
            "import os, site\nprint(sum(len(os.listdir(d)) for d in site.getsitepackages() if os.path.isdir(d)))"
        )
        assert listing.stdout.strip() == "0", listing
        assert "Read-only" in box.py(f"open({(site_dirs(PYTHON, [])[0][1] + '/x.py')!r}, 'w')").stderr
    with local_host(packages=[planted]) as h:
        assert h.create().py(probe).stdout.strip() == "canonical solutions"
    with local_host(packages=planted) as h:  # --setting packages=a,b arrives as a string
        assert h.create().py(probe).stdout.strip() == "canonical solutions"


def test_proc_shows_nothing_host_wide():
    with open("/proc/cmdline") as f:
        assert f.read().strip(), "positive control: the host's boot arguments are readable here"
    masked = ("/proc/cmdline", "/proc/kallsyms", "/proc/modules", "/proc/keys", "/proc/key-users",
              "/proc/sched_debug", "/proc/timer_list")
    probe = (
        "import os\n"
        f"for path in {masked!r}:\n"
        "    try:\n"
        "        with open(path, 'rb') as f:\n"
        "            data = f.read()\n"
        "        print(path, len(data))\n"
        "    except OSError as e:\n"
        "        print(path, e.__class__.__name__)\n"
    )
    with local_host() as h:
        out = h.create().py(probe).stdout.splitlines()
    assert len(out) == len(masked)
    for line in out:
        path, what = line.split()
        assert what in ("0", "PermissionError", "FileNotFoundError"), line


@pytest.mark.parametrize("bind, match", [
    ("/", "would cover"),
    (("/", "/host"), "whole /"),
    (("/etc", "/etc2"), "whole /etc"),
    ("/etc", "whole /etc"),
    ("/home", "whole /home"),
    ("/root", "whole /root"),
    ("/proc", "/proc"),
    ("/sys", "/sys"),
    ("/sys/fs/cgroup", "kernel interface"),
    ("/var", "whole /var"),
    (("/usr/share", "/work/share"), "sandbox's own /work"),
    (("/usr/share", "/"), "cover"),
    (("/usr/share", "/dev"), "/dev"),
    ("/definitely/not/here", "does not exist"),
])
def test_binds_that_would_weaken_isolation_are_refused(bind, match):
    with pytest.raises(ConfigError, match=match):
        LocalProvider(extra_ro_binds=[bind])


def test_a_harmless_bind_is_accepted():
    provider = LocalProvider(extra_ro_binds=["/etc/ssl"], cgroups="off")
    assert ("/etc/ssl", "/etc/ssl") in provider._command.binds


@pytest.mark.parametrize("settings, match", [
    ({"packages": ["no_such_package_here"]}, "not installed"),
    ({"packages": ["../etc"]}, "not a top-level module name"),
    ({"work_size_mb": 0}, "work_size_mb=0 must be a positive number"),
    ({"shm_size_mb": -16}, "shm_size_mb=-16 must be a positive number"),
    ({"start_timeout_s": 0}, "start_timeout_s=0 must be a positive number"),
    ({"exec_grace_s": "-1"}, "exec_grace_s='-1' must be a positive number"),
    ({"max_concurrency": 0}, "max_concurrency=0 must be a positive number"),
])
def test_bad_provider_settings_are_config_errors(settings, match):
    with pytest.raises(ConfigError, match=match):
        LocalProvider(**settings)


@pytest.mark.parametrize("field", ["cpu_seconds", "memory_mb", "max_processes", "file_size_mb", "open_files",
                                   "output_bytes"])
@pytest.mark.parametrize("value", [0, -1])
def test_zero_or_negative_limits_are_config_errors(field, value):
    with pytest.raises(ConfigError, match=rf"ResourceLimits\.{field}={value}: it must be a positive number"):
        ResourceLimits(**{field: value})


@pytest.mark.parametrize("field", ["cpus", "memory_mb"])
def test_zero_sandbox_resources_are_config_errors(field):
    with pytest.raises(ConfigError, match=rf"SandboxSpec\.{field}=0"):
        SandboxSpec(**{field: 0})


@pytest.mark.parametrize("field, value", [
    ("sandbox_cpu_seconds", 0), ("sandbox_cpu_seconds", -2.0), ("sandbox_reward_deadline_s", 0),
    ("sandbox_memory_mb", 0), ("sandbox_max_processes", -1), ("sandbox_file_size_mb", 0),
    ("sandbox_output_bytes", 0), ("sandbox_max_attempts", 0), ("sandbox_timeout", 0),
])
def test_trainer_budgets_of_zero_or_less_are_config_errors(tmp_path, field, value):
    with pytest.raises(ConfigError, match=rf"{field}"):
        SandboxGRPOConfig(**tiny.grpo_kwargs(tmp_path), **{field: value})
