"""OCI image layouts, read without a daemon: ``oci:PATH[:TAG]`` → ``index.json`` → (an image
index, followed to this machine's platform) → the image manifest and its layers.

The manifest's digest is the base's content digest: it covers the config and every layer's
digest, so a changed layer is a changed key. Every blob read is checked against its digest (the
layers while they are unpacked, see ``layers.LayerWriter``). Validation runs down to the layers'
media types and the presence of their blobs, so a bad base fails when the trainer is built.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
from pathlib import Path
from typing import Any

from trl_sandbox.environments import layers
from trl_sandbox.sandbox import ConfigError

INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
# Layer media type -> its compression ("" = a plain tar). skopeo/umoci/buildah write the OCI ones;
# a layout copied with --preserve-digests may keep Docker's.
LAYER_TYPES = {
    "application/vnd.oci.image.layer.v1.tar": "",
    "application/vnd.oci.image.layer.v1.tar+gzip": "gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd": "zstd",
    "application/vnd.oci.image.layer.nondistributable.v1.tar": "",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip": "gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd": "zstd",
    "application/vnd.docker.image.rootfs.diff.tar": "",
    "application/vnd.docker.image.rootfs.diff.tar.gzip": "gzip",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip": "gzip",
}
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_REF_NAME = "org.opencontainers.image.ref.name"
_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64", "ppc64le": "ppc64le",
         "s390x": "s390x", "riscv64": "riscv64"}


def split_ref(ref: str) -> tuple[str, str]:
    """``PATH[:TAG]`` → (path, tag). A trailing ``:TAG`` counts as a tag only when it looks like
    one (no ``/``) and the whole string is not itself an existing path, so a layout directory
    whose name holds a colon still works."""
    path, sep, tag = ref.rpartition(":")
    if sep and path and _TAG.fullmatch(tag) and not os.path.exists(ref):
        return path, tag
    return ref, ""


def blob_path(layout: Path, digest: str) -> Path:
    """Where a blob lives; the digest is checked first since it becomes a path."""
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise ConfigError(f"OCI layout {layout}: {digest!r} is not a sha256 digest; only sha256 blobs are supported")
    return layout / "blobs" / "sha256" / digest.split(":", 1)[1]


def _read_json(layout: Path, digest: str, what: str) -> dict[str, Any]:
    path = blob_path(layout, digest)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"OCI layout {layout}: the {what} blob {digest} cannot be read ({exc}); the layout is "
                          "incomplete: copy the image again (skopeo copy docker://IMAGE oci:PATH:TAG)") from exc
    if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
        raise ConfigError(f"OCI layout {layout}: the {what} blob {digest} does not match its digest (corrupt); "
                          "copy the image again")
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise ConfigError(f"OCI layout {layout}: the {what} blob {digest} is not JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise ConfigError(f"OCI layout {layout}: the {what} blob {digest} is not a JSON object")
    return value


def _pick_platform(layout: Path, manifests: list[dict[str, Any]]) -> dict[str, Any]:
    """An image index's entry for linux on this machine's architecture (or its only entry)."""
    if len(manifests) == 1:
        return manifests[0]
    arch = _ARCH.get(platform.machine().lower(), platform.machine().lower())
    for desc in manifests:
        plat = desc.get("platform") or {}
        if plat.get("os") == "linux" and plat.get("architecture") == arch:
            return desc
    found = sorted(f"{(d.get('platform') or {}).get('os')}/{(d.get('platform') or {}).get('architecture')}"
                   for d in manifests)
    raise ConfigError(f"OCI layout {layout}: the image index has no linux/{arch} image (it has {', '.join(found)}); "
                      f"copy the right platform (skopeo copy --override-arch {arch} ...)")


def resolve_manifest(layout: Path, tag: str) -> str:
    """The digest of the image manifest that ``layout[:tag]`` names, validated down to its layers'
    media types and the presence of their blobs, so a bad base fails when the trainer is built."""
    if not layout.is_dir():
        raise ConfigError(f"environment.base 'oci:{layout}': no such directory; make an OCI image layout there, "
                          "e.g. skopeo copy docker://python:3.12-slim oci:" f"{layout}:latest")
    try:
        index = json.loads((layout / "index.json").read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"environment.base 'oci:{layout}': no index.json, so not an OCI image layout; "
                          "make one with skopeo copy docker://IMAGE oci:PATH:TAG (or umoci init/new)") from exc
    except (OSError, ValueError) as exc:
        raise ConfigError(f"OCI layout {layout}: index.json cannot be read as JSON ({exc})") from exc
    entries = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(entries, list) or not entries or not all(isinstance(d, dict) for d in entries):
        raise ConfigError(f"OCI layout {layout}: index.json lists no manifests; copy an image into it")
    tags = sorted({str((d.get("annotations") or {}).get(_REF_NAME)) for d in entries
                   if (d.get("annotations") or {}).get(_REF_NAME)})
    if tag:
        chosen = [d for d in entries if (d.get("annotations") or {}).get(_REF_NAME) == tag]
        if not chosen:
            raise ConfigError(f"OCI layout {layout}: no image tagged {tag!r} (tags: {', '.join(tags) or 'none'}); "
                              "write oci:PATH:TAG with one of them")
    else:
        chosen = entries
        if len(chosen) > 1:
            raise ConfigError(f"OCI layout {layout} holds {len(chosen)} images; name one with oci:PATH:TAG "
                              f"(tags: {', '.join(tags) or 'none'})")
    desc = chosen[0]
    for _ in range(4):  # an index may point at an index (multi-platform); a few levels at most
        kind = desc.get("mediaType")
        if kind in (INDEX, DOCKER_LIST):
            nested = _read_json(layout, desc.get("digest"), "image index")
            if not isinstance(nested.get("manifests"), list) or not nested["manifests"]:
                raise ConfigError(f"OCI layout {layout}: the image index {desc.get('digest')} lists no images")
            desc = _pick_platform(layout, nested["manifests"])
            continue
        if kind not in (MANIFEST, DOCKER_MANIFEST):
            raise ConfigError(f"OCI layout {layout}: unsupported manifest media type {kind!r}; expected "
                              f"{MANIFEST} (skopeo copy converts other formats)")
        digest = desc.get("digest")
        layer_blobs(layout, digest)  # validates
        return digest
    raise ConfigError(f"OCI layout {layout}: image indexes nested too deep")


def layer_blobs(layout: Path, manifest_digest: str) -> list[tuple[Path, str, str, int]]:
    """The manifest's layers, bottom first: (blob path, digest, compression, size)."""
    manifest = _read_json(layout, manifest_digest, "manifest")
    out = []
    for desc in manifest.get("layers") or []:
        kind = desc.get("mediaType") if isinstance(desc, dict) else None
        if kind not in LAYER_TYPES:
            raise ConfigError(f"OCI layout {layout}: layer media type {kind!r} is not supported (supported: plain, "
                              "gzip and zstd tar layers); convert the image, e.g. skopeo copy --dest-compress-format "
                              "gzip")
        compression = LAYER_TYPES[kind]
        if compression == "zstd" and not layers.have_zstd():
            raise ConfigError(f"OCI layout {layout}: layer {desc.get('digest')} is zstd-compressed; pip install "
                              "zstandard, or convert it (skopeo copy --dest-compress-format gzip)")
        path = blob_path(layout, desc.get("digest"))
        if not path.is_file():
            raise ConfigError(f"OCI layout {layout}: layer blob {desc.get('digest')} is missing; copy the image again")
        out.append((path, desc["digest"], compression, int(desc.get("size") or -1)))
    return out
