"""The image map: what a task's ``FROM`` image (or Harbor's ``docker_image``) runs on here.

trl-sandbox builds no container images. A task names an image; the user says what stands for it:
``host`` (the sandbox's own read-only system: the host's ``/usr``, its ``python3``, ``bash``,
``git``) or ``oci:PATH[:TAG]`` (an OCI image layout exported beforehand, e.g. with ``skopeo copy
docker://IMAGE oci:PATH:TAG``), or an absolute path to a root filesystem directory or tarball
(see ``trl_sandbox.environments.bases``). On the command line: ``--image-map NAME=host`` or
``--image-map NAME=oci:PATH``, repeated; in Python: ``image_map={"python:3.11-slim": "host"}``.
The key ``*`` stands for every image the map does not name. ``docker.io/`` and ``library/``
prefixes are ignored on both sides (``ubuntu:22.04`` is ``docker.io/library/ubuntu:22.04``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from trl_sandbox.sandbox import ConfigError

HINT = "pass --image-map NAME=host|oci:PATH (or image_map={NAME: 'host' or 'oci:PATH'} in Python)"


def normalize(image: str) -> str:
    """``docker.io/library/python:3.11`` and ``python:3.11`` are the same image."""
    name = image.strip()
    for prefix in ("docker.io/", "index.docker.io/", "registry-1.docker.io/"):
        if name.startswith(prefix):
            name = name[len(prefix):]
    if name.startswith("library/"):
        name = name[len("library/"):]
    return name


def check_base(value: str, image: str) -> str:
    """A map value as ``environment.base`` takes it, or a ``ConfigError``."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"image map: {image!r} maps to {value!r}; {HINT}")
    if value == "host" or (value.startswith("oci:") and len(value) > 4) or value.startswith("/"):
        return value
    raise ConfigError(f"image map: {image!r} maps to {value!r}, which is neither 'host', 'oci:PATH[:TAG]' nor an "
                      "absolute path to a root filesystem directory or tarball")


def parse_image_map(items: Mapping[str, str] | Iterable[str] | None) -> dict[str, str]:
    """``{"NAME": "host"|"oci:PATH"}`` from a dict or from ``["NAME=host", ...]`` (the CLI's
    repeated ``--image-map``); every value checked."""
    if items is None:
        return {}
    pairs: list[tuple[str, str]] = []
    if isinstance(items, Mapping):
        pairs = [(str(k), v) for k, v in items.items()]
    elif isinstance(items, str):
        raise ConfigError(f"image map: give a dict or a list of NAME=VALUE items, not the string {items!r}")
    else:
        for item in items:
            name, sep, value = str(item).partition("=")
            if not sep or not name.strip():
                raise ConfigError(f"image map: {item!r} is not NAME=host or NAME=oci:PATH")
            pairs.append((name.strip(), value.strip()))
    return {normalize(name): check_base(value, name) for name, value in pairs}


def resolve(image: str, image_map: Mapping[str, str], where: str) -> str:
    """The ``environment.base`` that stands for ``image``, or a ``ConfigError`` that says how to map it."""
    mapping = parse_image_map(image_map)
    name = normalize(image)
    if name in mapping:
        return mapping[name]
    if "*" in mapping:
        return mapping["*"]
    raise ConfigError(f"{where}: the image {image!r} is not in the image map; {HINT}, e.g. --image-map "
                      f"{name}=host to run on the sandbox's own system (its python3, bash, git)")
