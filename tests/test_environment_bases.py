"""Environment bases: resolving ``host`` / a directory / a tarball / ``oci:PATH[:TAG]`` and
unpacking them. The OCI layouts are built here byte by byte (blobs, manifest, config, index), so
everything runs offline; umoci, where installed, cross-checks the unpacker on one image."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest

from trl_sandbox.environments import bases, layers, oci
from trl_sandbox.environments.bases import Base, resolve, tree_digest, unpack
from trl_sandbox.sandbox import ConfigError

GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
PLAIN = "application/vnd.oci.image.layer.v1.tar"


# -- building images --------------------------------------------------------------------------


Member = tuple[tarfile.TarInfo, bytes]  # a layer entry and its file's bytes


def F(name: str, data: bytes | str = b"", mode: int = 0o644) -> Member:  # noqa: N802
    info = tarfile.TarInfo(name)
    info.mode, info.mtime = mode, 1_700_000_000
    payload = data.encode() if isinstance(data, str) else data
    info.size = len(payload)
    return info, payload


def D(name: str, mode: int = 0o755) -> Member:  # noqa: N802
    info, _ = F(name, mode=mode)
    info.type = tarfile.DIRTYPE
    return info, b""


def L(name: str, target: str, hard: bool = False) -> Member:  # noqa: N802
    info, _ = F(name, mode=0o777)
    info.type, info.linkname = (tarfile.LNKTYPE if hard else tarfile.SYMTYPE), target
    return info, b""


def FIFO(name: str) -> Member:  # noqa: N802
    info, _ = F(name)
    info.type = tarfile.FIFOTYPE
    return info, b""


def tar(*members: Member) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for info, payload in members:
            archive.addfile(info, io.BytesIO(payload) if info.isfile() else None)
    return buf.getvalue()


def blob(layout: Path, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (layout / "blobs" / "sha256" / digest).write_bytes(data)
    return "sha256:" + digest


def descriptor(layout: Path, data: bytes, media_type: str, **extra) -> dict:
    return {"mediaType": media_type, "digest": blob(layout, data), "size": len(data), **extra}


def image(layout: Path, *layers: list[Member], tag: str = "latest", media_type: str = GZIP,
          index: list[dict] | None = None) -> Path:
    """An OCI image layout at ``layout`` with ``layers`` (bottom first) under ``tag``; more tags
    accumulate in index.json when called again on the same layout."""
    layout.mkdir(parents=True, exist_ok=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    layer_descs, diff_ids = [], []
    for members in layers:
        raw = tar(*members)
        data = gzip.compress(raw, mtime=0) if media_type.endswith("gzip") else raw
        layer_descs.append(descriptor(layout, data, media_type))
        diff_ids.append("sha256:" + hashlib.sha256(raw).hexdigest())
    config = {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": diff_ids},
              "config": {}}
    manifest = {"schemaVersion": 2, "mediaType": oci.MANIFEST,
                "config": descriptor(layout, json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json"),
                "layers": layer_descs}
    entry = descriptor(layout, json.dumps(manifest).encode(), oci.MANIFEST,
                       annotations={"org.opencontainers.image.ref.name": tag})
    old = json.loads((layout / "index.json").read_text())["manifests"] if (layout / "index.json").exists() else []
    entries = index if index is not None else [*old, entry]
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": entries}))
    return layout


def tree(root: Path) -> dict[str, tuple]:
    """What a root filesystem holds: relative path -> (type, mode, content or link target)."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        rel = str(path.relative_to(root))
        if stat.S_ISLNK(st.st_mode):
            out[rel] = ("l", os.readlink(path))
        elif stat.S_ISDIR(st.st_mode):
            out[rel] = ("d", oct(stat.S_IMODE(st.st_mode)))
        else:
            out[rel] = ("f", oct(stat.S_IMODE(st.st_mode)), path.read_bytes())
    return out


LOWER = [D("etc"), F("etc/keep.txt", "keep"), F("etc/gone.txt", "gone"), D("opt"), D("opt/d"),
         F("opt/d/a.txt", "a"), D("opt/d/sub"), F("opt/d/sub/b.txt", "b"), F("opt/other.txt", "other")]
UPPER = [F("etc/.wh.gone.txt"), D("opt/d", 0o750), F("opt/d/new.txt", "new"), F("opt/d/.wh..wh..opq"),
         F("etc/added.txt", "added")]


def unpacked(layout: Path, dest: Path, ref: str = "") -> Path:
    unpack(resolve(f"oci:{layout}{ref}"), dest)
    return dest


# -- whiteouts --------------------------------------------------------------------------------


def test_second_layer_deletes_a_file_and_makes_a_directory_opaque(tmp_path):
    root = unpacked(image(tmp_path / "img", LOWER, UPPER), tmp_path / "root")
    assert not (root / "etc/gone.txt").exists()
    assert (root / "etc/keep.txt").read_text() == "keep" and (root / "etc/added.txt").read_text() == "added"
    # opaque: what the lower layer put in opt/d is gone; what this layer put there (even before
    # the marker in the archive) stays; siblings of opt/d are untouched
    assert sorted(os.listdir(root / "opt/d")) == ["new.txt"]
    assert (root / "opt/other.txt").read_text() == "other"
    assert stat.S_IMODE((root / "opt/d").stat().st_mode) == 0o750
    assert not [p for p in root.rglob(".wh.*")], "whiteout markers are not files of the image"


def test_controls_without_the_whiteouts_the_files_are_there(tmp_path):
    only_lower = unpacked(image(tmp_path / "one", LOWER), tmp_path / "one-root")
    assert (only_lower / "etc/gone.txt").read_text() == "gone"
    assert (only_lower / "opt/d/sub/b.txt").read_text() == "b"
    no_whiteouts = [m for m in UPPER if ".wh." not in m[0].name]
    both = unpacked(image(tmp_path / "two", LOWER, no_whiteouts), tmp_path / "two-root")
    assert (both / "etc/gone.txt").read_text() == "gone"
    assert sorted(os.listdir(both / "opt/d")) == ["a.txt", "new.txt", "sub"]


def test_a_later_layer_replaces_types_and_a_whiteout_spares_its_own_layer(tmp_path):
    lower = [D("x"), F("x/in.txt", "1"), F("y", "file"), F("z", "z")]
    upper = [F("x", "now a file"), D("y"), F("y/in.txt", "2"), F("z", "z again"), F(".wh.z")]
    root = unpacked(image(tmp_path / "img", lower, upper), tmp_path / "root")
    assert (root / "x").read_text() == "now a file"
    assert (root / "y/in.txt").read_text() == "2"
    assert (root / "z").read_text() == "z again", "a whiteout hides lower layers only"


# -- traversal --------------------------------------------------------------------------------


def refused(tmp_path: Path, *layers: list[Member], match: str) -> None:
    layout = tmp_path / f"bad-{os.urandom(4).hex()}"
    with pytest.raises(ConfigError, match=match):
        unpacked(image(layout, *layers), tmp_path / "root")
    assert not (tmp_path / "root").exists()
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name], "a failed unpack leaves nothing"


def test_dotdot_members_are_refused(tmp_path):
    refused(tmp_path, [D("a"), F("a/../../escaped.txt", "x")], match="'..'")
    refused(tmp_path, [F("../escaped.txt", "x")], match="'..'")
    refused(tmp_path, [F("ok", "x"), L("hard", "../../etc/passwd", hard=True)], match="'..'")
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path.parent / "escaped.txt").exists()


def test_absolute_members_are_contained(tmp_path):
    outside = tmp_path / "outside.txt"
    root = unpacked(image(tmp_path / "img", [F(str(outside), "inside")]), tmp_path / "root")
    assert not outside.exists()
    assert (root / str(outside).lstrip("/")).read_text() == "inside"


@pytest.mark.parametrize("target", ["abs", "../../..", "."])
def test_writing_through_a_planted_symlink_is_refused(tmp_path, target):
    outside = tmp_path / "outside"
    outside.mkdir()
    link_target = str(outside) if target == "abs" else target
    refused(tmp_path, [L("evil", link_target)], [F("evil/pwned", "x")], match="never followed")
    refused(tmp_path, [L("evil", link_target), F("evil/pwned", "x")], match="never followed")  # one layer
    refused(tmp_path, [L("evil", link_target), D("evil/sub")], match="never followed")
    refused(tmp_path, [L("evil", link_target), F("evil/.wh.x")], match="never followed")
    refused(tmp_path, [L("evil", link_target), F("f", "x"), L("h", "evil/f", hard=True)], match="never followed")
    assert os.listdir(outside) == []


def test_a_member_replaces_a_planted_symlink_instead_of_writing_through_it(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched")
    root = unpacked(image(tmp_path / "img", [L("link", str(victim))], [F("link", "replaced")]), tmp_path / "root")
    assert victim.read_text() == "untouched"
    assert not (root / "link").is_symlink() and (root / "link").read_text() == "replaced"
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    root = unpacked(image(tmp_path / "img2", [L("evil", str(outside))], [F(".wh.evil")]), tmp_path / "root2")
    assert not os.path.lexists(root / "evil") and (outside / "sub").is_dir(), "a whiteout unlinks the link only"


def test_control_benign_nested_paths_links_and_hardlinks_are_written(tmp_path):
    layer = [F("a/b/c/deep.txt", "deep"), L("a/rel", "b/c/deep.txt"), L("a/abs", "/a/b/c/deep.txt"),
             L("a/dangling", "/nowhere"), L("a/hard", "a/b/c/deep.txt", hard=True), F("./dot/x", "dot")]
    root = unpacked(image(tmp_path / "img", layer), tmp_path / "root")
    assert (root / "a/b/c/deep.txt").read_text() == "deep" and (root / "dot/x").read_text() == "dot"
    assert os.readlink(root / "a/rel") == "b/c/deep.txt" and os.readlink(root / "a/abs") == "/a/b/c/deep.txt"
    assert os.readlink(root / "a/dangling") == "/nowhere"
    assert (root / "a/hard").stat().st_ino == (root / "a/b/c/deep.txt").stat().st_ino
    assert stat.S_IMODE((root / "a/b").stat().st_mode) == 0o755, "implied directories get 0755"


def test_special_files_and_setid_bits(tmp_path):
    layer = [F("bin/su", "x", 0o4755), F("bin/wall", "x", 0o2755), D("shared", 0o3777), FIFO("fifo")]
    root = unpacked(image(tmp_path / "img", layer), tmp_path / "root")
    assert stat.S_IMODE((root / "bin/su").stat().st_mode) == 0o755
    assert stat.S_IMODE((root / "bin/wall").stat().st_mode) == 0o755
    assert stat.S_IMODE((root / "shared").stat().st_mode) == 0o1777, "the sticky bit stays"
    assert not (root / "fifo").exists()


def test_a_read_only_directory_still_takes_later_layers_and_keeps_its_mode(tmp_path):
    root = unpacked(image(tmp_path / "img", [D("ro", 0o555), F("ro/a", "a", 0o444)], [F("ro/b", "b")]),
                    tmp_path / "root")
    assert sorted(os.listdir(root / "ro")) == ["a", "b"]
    assert stat.S_IMODE((root / "ro").stat().st_mode) == 0o555
    assert (root / "ro/a").stat().st_mtime == 1_700_000_000, "times are kept (pyc files check them)"
    bases.remove_tree(root)
    assert not root.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_owner_is_this_process_or_the_given_uid(tmp_path):
    lower = [D("d"), F("d/f", "x"), L("d/l", "f")]
    layout = image(tmp_path / "img", lower)
    mine = unpacked(layout, tmp_path / "mine")
    assert {p.lstat().st_uid for p in [mine, *mine.rglob("*")]} == {os.geteuid()}
    unpack(resolve(f"oci:{layout}"), tmp_path / "theirs", uid=54321)
    owned = [tmp_path / "theirs", *(tmp_path / "theirs").rglob("*")]
    assert {(p.lstat().st_uid, p.lstat().st_gid) for p in owned} == {(54321, 54321)}


# -- digests ----------------------------------------------------------------------------------


def test_digest_is_the_manifest_digest_and_follows_the_layers(tmp_path):
    one = resolve(f"oci:{image(tmp_path / 'one', LOWER, UPPER)}")
    again = resolve(f"oci:{image(tmp_path / 'again', LOWER, UPPER)}")
    assert one.kind == "oci" and one.tag == "" and one.location == str(tmp_path / "one")
    assert one.digest == again.digest and one.digest.startswith("sha256:")
    index = json.loads((tmp_path / "one/index.json").read_text())
    assert one.digest == index["manifests"][0]["digest"]
    changed = [*UPPER[:-1], F("etc/added.txt", "addeD")]
    assert resolve(f"oci:{image(tmp_path / 'changed', LOWER, changed)}").digest != one.digest


def test_tree_and_tarball_digests(tmp_path):
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d/f").write_text("x")
    os.symlink("d/f", src / "l")
    copy = tmp_path / "copy"
    shutil.copytree(src, copy, symlinks=True)
    os.utime(copy / "d/f", ns=(0, (src / "d/f").stat().st_mtime_ns))
    os.utime(copy / "d", ns=(0, (src / "d").stat().st_mtime_ns))
    os.utime(copy, ns=(0, src.stat().st_mtime_ns))
    assert tree_digest(src) == tree_digest(copy), "same tree elsewhere, same digest"
    before = resolve(str(src)).digest
    for change in (lambda: (src / "d/f").write_text("y"), lambda: os.chmod(src / "d/f", 0o600),
                   lambda: os.utime(src / "d/f", ns=(0, 5)), lambda: (src / "l").unlink()):
        change()
        assert resolve(str(src)).digest != before
        before = resolve(str(src)).digest
    ball = tmp_path / "root.tar.gz"
    ball.write_bytes(gzip.compress(tar(F("x", "1"))))
    got = resolve(str(ball))
    assert got == Base("tarball", str(ball), "", "sha256:" + hashlib.sha256(ball.read_bytes()).hexdigest())
    assert resolve("host") == Base("host", "", "", "host")


# -- the other bases --------------------------------------------------------------------------


def test_directory_base_is_copied_like_cp_a(tmp_path):
    src = tmp_path / "src"
    (src / "usr/bin").mkdir(parents=True)
    (src / "usr/bin/tool").write_text("#!/bin/sh\n")
    os.chmod(src / "usr/bin/tool", 0o4755)
    os.symlink("/usr/bin/tool", src / "tool")
    os.mkfifo(src / "fifo")
    base = resolve(str(src))
    assert base.kind == "rootfs" and base.digest.startswith("tree-sha256:")
    unpack(base, tmp_path / "root")
    root = tmp_path / "root"
    assert (root / "usr/bin/tool").read_text() == "#!/bin/sh\n"
    assert stat.S_IMODE((root / "usr/bin/tool").stat().st_mode) == 0o755
    assert os.readlink(root / "tool") == "/usr/bin/tool" and not (root / "fifo").exists()
    (src / "usr/bin/tool").write_text("changed")
    with pytest.raises(ConfigError, match="changed since it was resolved"):
        unpack(base, tmp_path / "root2")
    assert not (tmp_path / "root2").exists()


def test_tarball_base_is_one_safe_layer(tmp_path):
    ball = tmp_path / "rootfs.tar.gz"
    ball.write_bytes(gzip.compress(tar(D("etc"), F("etc/os-release", "ID=test"), L("lib", "usr/lib"),
                                       F(".wh.literal", "kept: a tarball is not a layer"))))
    unpack(resolve(str(ball)), tmp_path / "root")
    assert (tmp_path / "root/etc/os-release").read_text() == "ID=test"
    assert os.readlink(tmp_path / "root/lib") == "usr/lib" and (tmp_path / "root/.wh.literal").exists()
    bad = tmp_path / "bad.tar"
    bad.write_bytes(tar(L("lib", str(tmp_path)), F("lib/pwned", "x")))
    with pytest.raises(ConfigError, match="never followed"):
        unpack(resolve(str(bad)), tmp_path / "root-bad")
    assert not (tmp_path / "pwned").exists()
    ball.write_bytes(gzip.compress(tar(F("etc/os-release", "ID=other"))))
    with pytest.raises(ConfigError, match="changed since it was resolved"):
        unpack(Base("tarball", str(ball), "", "sha256:" + "0" * 64), tmp_path / "root-stale")


def test_tags_plain_layers_and_platform_indexes(tmp_path):
    layout = image(tmp_path / "img", [F("v", "1")], tag="one")
    image(layout, [F("v", "2")], tag="two", media_type=PLAIN)
    assert (unpacked(layout, tmp_path / "r2", ":two") / "v").read_text() == "2"
    assert (unpacked(layout, tmp_path / "r1", ":one") / "v").read_text() == "1"
    entries = json.loads((layout / "index.json").read_text())["manifests"]
    arch = oci._ARCH.get(os.uname().machine, os.uname().machine)
    platforms = [{**entries[0], "platform": {"os": "linux", "architecture": "other"}},
                 {**entries[1], "platform": {"os": "linux", "architecture": arch}}]
    nested = descriptor(layout, json.dumps({"schemaVersion": 2, "mediaType": oci.INDEX, "manifests": platforms}).encode(),
                        oci.INDEX, annotations={"org.opencontainers.image.ref.name": "multi"})
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [*entries, nested]}))
    multi = resolve(f"oci:{layout}:multi")
    assert multi.tag == "multi" and multi.digest == entries[1]["digest"]


def test_unpack_needs_a_new_destination(tmp_path):
    base = resolve(f"oci:{image(tmp_path / 'img', [F('x')])}")
    (tmp_path / "taken").mkdir()
    with pytest.raises(FileExistsError):
        unpack(base, tmp_path / "taken")
    with pytest.raises(ConfigError, match="no root filesystem"):
        unpack(bases.HOST, tmp_path / "host")
    unpack(base, tmp_path / "new/nested")
    assert (tmp_path / "new/nested/x").exists()


# -- what a user is told ----------------------------------------------------------------------


def test_config_errors_say_what_to_do(tmp_path, monkeypatch):
    def says(base: str, *words: str) -> None:
        with pytest.raises(ConfigError) as caught:
            resolve(base)
        for word in words:
            assert word in str(caught.value), (base, str(caught.value))

    says(str(tmp_path / "missing"), "does not exist", "oci:PATH[:TAG]")
    says(f"oci:{tmp_path / 'missing'}", "no such directory", "skopeo copy")
    (tmp_path / "empty").mkdir()
    says(f"oci:{tmp_path / 'empty'}", "no index.json", "skopeo copy")
    layout = image(tmp_path / "img", [F("x")], tag="one")
    image(layout, [F("y")], tag="two")
    says(f"oci:{layout}:three", "no image tagged 'three'", "one, two")
    says(f"oci:{layout}", "holds 2 images", "oci:PATH:TAG")
    says(str(layout), "is an OCI image layout", f"oci:{layout}")
    (tmp_path / "notar.tar").write_text("hello")
    says(str(tmp_path / "notar.tar"), "not a tar archive")
    says("", "'host'")

    odd = image(tmp_path / "odd", [F("x")])
    manifest_digest = json.loads((odd / "index.json").read_text())["manifests"][0]["digest"]
    manifest = json.loads(oci.blob_path(odd, manifest_digest).read_bytes())
    for kind, words in (("application/vnd.oci.image.layer.v1.tar+zstd", ("zstd", "zstandard")),
                        ("application/vnd.example.weird", ("not supported", "--dest-compress-format"))):
        manifest["layers"][0]["mediaType"] = kind
        entry = descriptor(odd, json.dumps(manifest).encode(), oci.MANIFEST)
        (odd / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [entry]}))
        monkeypatch.setattr(layers, "have_zstd", lambda: False)
        says(f"oci:{odd}", *words)
    entry = {"mediaType": "application/vnd.docker.distribution.manifest.v1+json", "digest": entry["digest"]}
    (odd / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [entry]}))
    says(f"oci:{odd}", "unsupported manifest media type")

    broken = image(tmp_path / "broken", [F("x", "payload")])
    base = resolve(f"oci:{broken}")
    layer = oci.layer_blobs(broken, base.digest)[0][0]
    layer.write_bytes(gzip.compress(tar(F("x", "tampered")), mtime=0))
    with pytest.raises(ConfigError, match="corrupt or changed"):
        unpack(base, tmp_path / "root")
    layer.write_bytes(b"not gzip at all")
    with pytest.raises(ConfigError, match="not a readable tar archive"):
        unpack(base, tmp_path / "root")
    layer.unlink()
    says(f"oci:{broken}", "missing", "copy the image again")
    assert not (tmp_path / "root").exists()


# -- cross-check with umoci -------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("umoci") is None, reason="umoci is not installed (scripts/setup.sh installs it)")
def test_umoci_built_image_unpacks_like_umoci_unpacks_it(tmp_path):
    def run(*args: str) -> None:
        subprocess.run(["umoci", *args], check=True, capture_output=True, timeout=60)

    layout = tmp_path / "layout"
    run("init", "--layout", str(layout))
    run("new", "--image", f"{layout}:img")
    bundle = tmp_path / "bundle"
    run("unpack", "--rootless", "--image", f"{layout}:img", str(bundle))
    rootfs = bundle / "rootfs"
    (rootfs / "etc/d/sub").mkdir(parents=True)
    for rel, text in (("etc/keep", "k"), ("etc/gone", "g"), ("etc/d/a", "a"), ("etc/d/sub/b", "b")):
        (rootfs / rel).write_text(text)
    os.symlink("keep", rootfs / "etc/link")
    os.link(rootfs / "etc/keep", rootfs / "etc/hard")
    run("repack", "--image", f"{layout}:img", str(bundle))
    bundle = tmp_path / "bundle2"  # a bundle remembers the manifest it came from: the next layer starts anew
    run("unpack", "--rootless", "--image", f"{layout}:img", str(bundle))
    rootfs = bundle / "rootfs"
    (rootfs / "etc/gone").unlink()
    shutil.rmtree(rootfs / "etc/d")
    (rootfs / "etc/d").mkdir()
    (rootfs / "etc/d/new").write_text("n")
    run("repack", "--image", f"{layout}:img", str(bundle))

    base = resolve(f"oci:{layout}:img")
    assert len(oci.layer_blobs(layout, base.digest)) == 2
    unpack(base, tmp_path / "ours")
    run("raw", "unpack", "--rootless", "--image", f"{layout}:img", str(tmp_path / "theirs"))
    ours, theirs = tree(tmp_path / "ours"), tree(tmp_path / "theirs")
    assert ours == theirs
    assert "etc/gone" not in ours and ours["etc/d/new"][2] == b"n" and "etc/d/a" not in ours
    assert (tmp_path / "ours/etc/hard").stat().st_ino == (tmp_path / "ours/etc/keep").stat().st_ino
