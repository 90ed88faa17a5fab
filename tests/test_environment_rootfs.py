"""Prepared environments on a root filesystem base (local provider): an OCI image layout built
here, offline, from a few host files (busybox, the host's python3 with the part of its standard
library a sandbox needs, and their shared libraries), then a layer that deletes a file.

Every test has its positive control: the file the whiteout deletes is there in the first layer
alone; what the setup writes is absent without the setup; a lease's own changes are seen by that
lease; a base that runs is the control of the one that cannot.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

import pytest

from tests.test_environment_bases import PLAIN, D, F, L, descriptor, tar
from trl_sandbox.environments import oci
from trl_sandbox.environments.bases import resolve
from trl_sandbox.environments.cache import remove_tree
from trl_sandbox.environments.spec import parse
from trl_sandbox.pool.sandbox_pool import SandboxPool
from trl_sandbox.sandbox import ConfigError, SandboxSpec
from trl_sandbox.scoring.scorer import Scorer

HOST_PYTHON = os.path.realpath("/usr/bin/python3")
BUSYBOX = shutil.which("busybox")
APPLETS = ("sh", "cat", "ls", "rm", "mkdir", "echo", "test", "chmod", "stat", "wc", "touch", "id")
STDLIB_SKIP = {"test", "idlelib", "tkinter", "lib2to3", "ensurepip", "pydoc_data", "distutils", "turtledemo",
               "site-packages", "dist-packages", "unittest", "config-3.11-x86_64-linux-gnu", "curses", "dbm",
               "sqlite3", "venv", "xmlrpc", "wsgiref", "multiprocessing"}
LIBS_OK = ("libc.so", "libm.so", "libz.so", "libexpat.so", "libffi.so", "libuuid.so", "ld-linux")
SITE = "/usr/local/lib/python3.11/dist-packages"  # on Debian's python3's path, as pip's target would be
SETUP = ["echo built > /usr/local/x", f"mkdir -p {SITE} && echo 'X = 7' > {SITE}/setupmod.py",
         "echo prepared > made-by-setup.txt"]
LOOK = ("cat /usr/local/x 2>&1; test -e /usr/share/doomed.txt && echo doomed-present || echo doomed-gone; "
        "cat readme.txt; ls")


def _ldd(path: str) -> list[str]:
    out = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
    return [part for line in out.splitlines() for part in line.split() if part.startswith("/")]


def _system_layer() -> bytes:
    """busybox, the host's python3 (a Debian build: stdlib in /usr/lib/python3.11) and its libraries."""
    buf = io.BytesIO()
    files: dict[str, str] = {HOST_PYTHON[1:]: HOST_PYTHON, "bin/busybox": BUSYBOX}
    lib = Path("/usr/lib") / os.path.basename(HOST_PYTHON)
    dynload = lib / "lib-dynload"
    needed = set(_ldd(HOST_PYTHON))
    for so in sorted(dynload.glob("*.so")):
        deps = _ldd(str(so))
        if not so.name.startswith(("_test", "xx", "_ctypes_test")) and all(
                any(ok in d for ok in LIBS_OK) for d in deps):
            files[str(so)[1:]] = str(so)
            needed.update(deps)
    for dep in needed:
        real = os.path.realpath(dep)
        files[("lib64/" if "ld-linux" in dep else "lib/x86_64-linux-gnu/") + os.path.basename(dep)] = real
    for path in sorted(lib.rglob("*")):
        rel = path.relative_to(lib)
        if rel.parts[0] in STDLIB_SKIP or path.is_dir() or path.is_symlink() or rel.parts[0] == "lib-dynload":
            continue
        if path.suffix == ".pyc" and ".opt-" in path.name:
            continue
        files[str(path)[1:]] = str(path)
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as archive:
        dirs = sorted({str(Path(name).parents[i]) for name in files for i in range(len(Path(name).parents) - 1)})
        for name in ["etc", "usr/local/bin", "usr/share", "app", *dirs]:
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            archive.addfile(info)
        for name, source in sorted(files.items()):
            info = archive.gettarinfo(source, arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            with open(source, "rb") as f:
                archive.addfile(info, f)
        for member, data in [L("usr/bin/python3", "python3.11"), F("usr/share/doomed.txt", "first layer\n"),
                             F("app/readme.txt", "from the image\n"), F("etc/passwd", "root:x:0:0::/:/bin/sh\n"),
                             *(L(f"bin/{a}", "busybox") for a in APPLETS)]:
            archive.addfile(member, io.BytesIO(data) if member.isfile() else None)
    return buf.getvalue()


def _layout(layout: Path, layers: list[bytes], tag: str) -> str:
    """Add an image of uncompressed ``layers`` (bottom first) under ``tag``; returns its base."""
    layout.mkdir(parents=True, exist_ok=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    descs = [descriptor(layout, data, PLAIN) for data in layers]
    config = {"architecture": "amd64", "os": "linux", "config": {},
              "rootfs": {"type": "layers", "diff_ids": [d["digest"] for d in descs]}}
    manifest = {"schemaVersion": 2, "mediaType": oci.MANIFEST, "layers": descs,
                "config": descriptor(layout, json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json")}
    entry = descriptor(layout, json.dumps(manifest).encode(), oci.MANIFEST,
                       annotations={"org.opencontainers.image.ref.name": tag})
    index = layout / "index.json"
    old = json.loads(index.read_text())["manifests"] if index.exists() else []
    index.write_text(json.dumps({"schemaVersion": 2, "manifests": [*old, entry]}))
    return f"oci:{layout}:{tag}"


def _deleting_layer(extra: str = "a") -> bytes:
    return tar(D("usr/share"), F("usr/share/.wh.doomed.txt"), F("etc/extra", extra), L("app/out", "/var/tmp"))


@pytest.fixture(scope="module")
def images():
    if BUSYBOX is None:
        pytest.fail("busybox is needed to build the test image: apt-get install busybox-static (scripts/setup.sh)")
    root = Path(tempfile.mkdtemp(prefix="trl-sandbox-rootfs-", dir="/var/tmp"))
    os.chmod(root, 0o755)
    system = _system_layer()
    layout = root / "layout"
    out = {"two": _layout(layout, [system, _deleting_layer()], "two"),
           "one": _layout(layout, [system], "one"),
           "byte": _layout(layout, [system, _deleting_layer("b")], "byte")}
    nopy = root / "nopy"  # a directory base that cannot run a sandbox: no python3
    (nopy / "bin").mkdir(parents=True)
    shutil.copy(BUSYBOX, nopy / "bin" / "busybox")
    (nopy / "bin" / "sh").symlink_to("busybox")
    broken = root / "broken.tar"  # a python3 that is not a program
    broken.write_bytes(tar(D("usr"), D("usr/bin"), F("usr/bin/python3", "not an ELF\n", 0o755)))
    out.update(nopy=str(nopy), broken=str(broken), cache=str(root / "cache"))
    yield out
    remove_tree(root)


@pytest.fixture(scope="module")
def pool(images):
    with SandboxPool.open("local", size=1, settings={"environment_cache": images["cache"]}) as pool:
        yield pool


def _run(pool, script, base, setup=SETUP, workdir="/app", timeout=10.0):
    env = {"base": base, "setup": setup, "workdir": workdir, "files": {"row.txt": "from the row\n"}}
    return pool.run(["/bin/sh", "-c", script], timeout=timeout, environment=parse(env))


def test_the_setup_writes_outside_the_workdir_and_the_whiteout_deletes(pool, images):
    result = _run(pool, LOOK + "; cat row.txt made-by-setup.txt; id -u", images["two"])
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.split()
    assert lines[:4] == ["built", "doomed-gone", "from", "the"], result.stdout
    assert "made-by-setup.txt" in lines and "row.txt" in lines and "prepared" in lines
    # Control: the first layer alone has the file the second layer deletes.
    one = _run(pool, LOOK, images["one"])
    assert one.exit_code == 0, one.stderr
    assert "doomed-present" in one.stdout and "built" in one.stdout
    # Control: without the setup, the setup's file is absent (and so is its module).
    bare = _run(pool, LOOK, images["two"], setup=[])
    assert "No such file" in bare.stdout and "doomed-gone" in bare.stdout
    assert "made-by-setup.txt" not in bare.stdout


def test_programs_run_on_the_image_python_with_what_the_setup_installed(pool, images):
    code = "import setupmod, sys; print(setupmod.X, sys.version_info[:2] >= (3, 8))"
    result = _run(pool, f"python3 -c '{code}'; /usr/bin/python3.11 -c '{code}'", images["two"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.split() == ["7", "True", "7", "True"]
    # Control: the image without that setup has no such module.
    bare = _run(pool, f"python3 -c '{code}'", images["two"], setup=["true"])
    assert bare.exit_code == 1 and "ModuleNotFoundError" in bare.stderr
    # The image's system is read-only to programs (only the working directory is theirs).
    ro = _run(pool, "echo x > /usr/local/y", images["two"])
    assert ro.exit_code != 0 and "Read-only" in ro.stderr


def test_leases_of_one_key_are_isolated(pool, images):
    hostile = _run(pool, "rm readme.txt; echo new > planted.txt; chmod 000 row.txt; ls", images["two"])
    assert hostile.exit_code == 0, hostile.stderr
    assert "planted.txt" in hostile.stdout and "readme.txt" not in hostile.stdout  # control: its own changes
    for _ in range(2):
        after = _run(pool, "cat readme.txt row.txt; ls", images["two"])
        assert after.exit_code == 0, after.stderr
        assert "from the image" in after.stdout and "from the row" in after.stdout
        assert "planted.txt" not in after.stdout


def test_two_bases_differing_in_one_layer_byte_are_two_builds(pool, images):
    for tag in ("two", "byte"):
        result = _run(pool, "cat /etc/extra; echo; cat /usr/local/x", images[tag])
        assert result.exit_code == 0, result.stderr
        assert result.stdout.split() == [{"two": "a", "byte": "b"}[tag], "built"]
    cache = Path(images["cache"])
    builds = pool.provider.environments.builds
    specs = {tag: parse({"base": images[tag], "setup": SETUP, "workdir": "/app", "files": {"row.txt": "from the row\n"}})
             for tag in ("two", "byte")}
    keys = {tag: builds.key(spec) for tag, spec in specs.items()}
    assert keys["two"] != keys["byte"] and all((cache / k / "root" / "usr/local/x").is_file() for k in keys.values())
    digests = {resolve(images[tag]).digest for tag in ("two", "byte")}
    assert len(digests) == 2 and all((cache / "bases" / d.replace(":", "-") / "rootfs").is_dir() for d in digests)
    # Control: the same spec again builds nothing.
    before = sorted(p.parent.name for p in cache.glob("*/root"))
    builds.drain()
    assert _run(pool, "true", images["byte"]).exit_code == 0
    assert sorted(p.parent.name for p in cache.glob("*/root")) == before
    assert builds.drain().builds == 0


@pytest.mark.parametrize("which,message", [("nopy", "has no python3"), ("broken", "cannot start")])
def test_a_base_that_cannot_run_a_sandbox_is_a_config_error(pool, images, which, message):
    with pytest.raises(ConfigError, match=message):
        _run(pool, "true", images[which], setup=[])
    builds = pool.provider.environments.builds
    builds.drain()
    # Reported again without another build; a row of it scores infra, not a verdict on the code.
    row = {"prompt": "p", "tests": [{"input": "", "output": "1\n"}],
           "environment": {"base": images[which], "workdir": "/app"}}
    program = "```python\nprint(1)\n```"
    outcome = Scorer(pool, cache_size=0).score([program], [row])[0]
    assert outcome.status == "infra" and outcome.reward is None
    assert builds.drain().builds == 0  # the failure was remembered, not built again
    # Control: the same row on the image that runs passes.
    good = {**row, "environment": {"base": images["two"], "workdir": "/app"}}
    assert Scorer(pool, cache_size=0).score([program], [good])[0].status == "passed"


def test_a_root_outside_the_environment_cache_is_refused(pool, images):
    provider = pool.provider
    with pytest.raises(ConfigError, match="environment cache"):
        pool.loop.run(provider.create(SandboxSpec(image=f"rootfs:{images['nopy']}")))
    with pytest.raises(ConfigError, match="environment cache"):
        pool.loop.run(provider.create(SandboxSpec(image="rootfs:/")))
    # Control: a prepared root in the cache is accepted (as the leases above were made).
    root = next(Path(images["cache"]).glob("*/root"))
    sandbox = pool.loop.run(provider.create(SandboxSpec(image=f"rootfs:{root}")))
    try:
        result = pool.loop.run(sandbox.exec(["/bin/sh", "-c", "cat /etc/extra; ls /usr/bin"], timeout=5))
        assert result.exit_code == 0 and "python3.11" in result.stdout, result.stderr
    finally:
        pool.loop.run(provider.destroy(sandbox.id))


def test_files_never_follow_a_link_of_the_image(pool, images):
    # The image's /app/out is a link to /var/tmp: a row's file under it must not land on the host.
    env = {"base": images["two"], "workdir": "/app", "files": {"out/escaped.txt": "x"}}
    with pytest.raises(ConfigError, match="not a directory of the image"):
        pool.run(["true"], timeout=5, environment=parse(env))
    assert not Path("/var/tmp/escaped.txt").exists()
    # Control: the same file beside the link is written.
    env["files"] = {"in/escaped.txt": "x"}
    result = pool.run(["/bin/sh", "-c", "cat in/escaped.txt; echo; readlink out"], timeout=5, environment=parse(env))
    assert result.exit_code == 0 and result.stdout.split() == ["x", "/var/tmp"], result.stderr
