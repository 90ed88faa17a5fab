"""What every benchmark records about the machine it ran on: numbers from shared machines only
mean something next to the cores, CPU, versions and load they were measured with."""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path


def machine(modules: Sequence[str] = ()) -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        bwrap = subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip()
    except OSError:
        bwrap = None
    versions = {}
    for module in modules:
        try:
            versions[module] = __import__(module).__version__
        except ImportError:
            versions[module] = None
    return {
        "cores": os.cpu_count(),
        "cpu_model": cpu,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "bwrap": bwrap,
        **versions,
        "loadavg_at_start": os.getloadavg(),
    }
