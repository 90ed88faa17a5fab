"""A row's ``environment``: what to prepare before its programs or episodes run, and its content key.

The key hashes everything that built the state (the base's digest, the files, the setup commands,
the network flag, the working directory and the provider kind), never the task's id or the row's
index: rows that declare the same environment share one build, and a group of GRPO completions
of one prompt shares it too. Nothing of a lease (its paths, its sandbox) enters the key or the
prompt.
"""

from __future__ import annotations

import functools
import hashlib
import json
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trl_sandbox.sandbox import ConfigError

# The dataset column that carries an environment.
ENVIRONMENT_COLUMN = "environment"
FIELDS = ("files", "setup", "base", "workdir", "setup_timeout", "setup_network")
KEY_VERSION = "trl-sandbox-environment-1"  # bumped when what a build makes changes


@dataclass(frozen=True)
class EnvironmentSpec:
    """One prepared environment, as a row declares it (see ``parse``)."""

    files: tuple[tuple[str, str], ...] = ()
    setup: tuple[str, ...] = ()
    base: str = "host"
    workdir: str | None = None
    setup_timeout: float = 600.0
    setup_network: bool = False

    @functools.cached_property
    def fingerprint(self) -> str:
        """A SHA-256 of what the row declares that builds the state (``setup_timeout`` is not part
        of it: a slower machine's longer limit builds the same tree). Computed once per spec: a
        spec may carry a whole repository's files, and every program of its rows is keyed by it."""
        payload = {
            "v": KEY_VERSION,
            "files": [list(f) for f in self.files],
            "setup": list(self.setup),
            "network": self.setup_network,
            "workdir": self.workdir,
        }
        text = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()

    def key(self, provider_kind: str, base_digest: str) -> str:
        """The content key: the spec's fingerprint with the provider kind and the base's digest."""
        text = json.dumps([self.fingerprint, provider_kind, base_digest], ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()

    def describe(self) -> str:
        """A short line for logs: never the files' contents."""
        return (f"base={self.base} files={len(self.files)} setup={len(self.setup)} command(s)"
                f"{' network' if self.setup_network else ''}")


def _relative(path: Any) -> str:
    if not isinstance(path, str) or not path or "\0" in path:
        raise ConfigError(f"environment.files: a path must be a non-empty string, not {path!r}")
    norm = posixpath.normpath(path)
    if norm.startswith("/") or norm == ".." or norm.startswith("../") or norm == ".":
        raise ConfigError(f"environment.files: {path!r} must be a path relative to the working directory, "
                          "inside it (no leading '/', no '..')")
    return norm


def parse(value: Any) -> EnvironmentSpec | None:
    """A row's ``environment`` cell (a dict, its JSON text, or empty) as a spec; ``None`` when the
    row has none. Anything malformed is a ``ConfigError`` that names the field and what to write."""
    if value is None or value == "" or value == {}:
        return None
    if isinstance(value, EnvironmentSpec):
        return value
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        return _parse_text(value)
    return _parse(value)


@functools.lru_cache(maxsize=32)
def _parse_text(value: str) -> EnvironmentSpec | None:
    """``parse`` of a JSON cell, once per text: every completion of a row parses the same cell
    (a few recent ones are kept: a cell may hold a whole repository's files)."""
    if not value.lstrip().startswith("{"):
        # TRL's dict of environment factories names a row's factory in a column of this name
        # (``environment: "my_env"``): that is TRL's, not a prepared environment.
        return None
    try:
        loaded = json.loads(value)
    except ValueError as exc:
        raise ConfigError(f"environment: not valid JSON ({exc}); give a dict or its JSON text") from exc
    return None if loaded is None or loaded == {} else _parse(loaded)


def _parse(value: Any) -> EnvironmentSpec | None:
    if not isinstance(value, Mapping):
        raise ConfigError(f"environment must be a dict (or its JSON text) with the fields {', '.join(FIELDS)}; "
                          f"got {type(value).__name__}")
    unknown = sorted(set(value) - set(FIELDS))
    if unknown:
        raise ConfigError(f"environment: unknown field(s) {unknown}; the fields are {', '.join(FIELDS)}")
    files = value.get("files") or {}
    if isinstance(files, (list, tuple)):  # Arrow may turn a dict column into (key, value) pairs
        files = dict(files)
    if not isinstance(files, Mapping):
        raise ConfigError("environment.files must be a dict {relative path: text}")
    parsed_files = []
    for path, text in files.items():
        if text is None:
            continue  # Arrow fills a struct column's missing keys with None
        if not isinstance(text, str):
            raise ConfigError(f"environment.files[{path!r}] must be text, not {type(text).__name__}")
        parsed_files.append((_relative(path), text))
    names = {p for p, _ in parsed_files}
    for path in names:
        parent = posixpath.dirname(path)
        while parent:
            if parent in names:
                raise ConfigError(f"environment.files: {parent!r} is a file, so {path!r} cannot be inside it")
            parent = posixpath.dirname(parent)
    setup = value.get("setup") or ()
    if isinstance(setup, str):
        setup = (setup,)
    if not isinstance(setup, (list, tuple)) or not all(isinstance(c, str) and c.strip() for c in setup):
        raise ConfigError("environment.setup must be a list of shell commands (non-empty strings), run in order")
    base = value.get("base") or "host"
    if not isinstance(base, str):
        raise ConfigError(f"environment.base must be a string ('host', a root filesystem directory or tarball, "
                          f"or 'oci:PATH[:TAG]'), not {base!r}")
    workdir = value.get("workdir") or None
    if workdir is not None:
        if not isinstance(workdir, str) or not workdir.startswith("/") or "\0" in workdir:
            raise ConfigError(f"environment.workdir must be an absolute path, not {workdir!r}")
        workdir = posixpath.normpath(workdir)
        if workdir == "/" or workdir.split("/")[1] in ("proc", "dev", "sys", "run", "tmp", "usr", "etc"):
            raise ConfigError(f"environment.workdir={workdir!r} is a system directory; use e.g. /app or /work")
    timeout = value.get("setup_timeout")
    timeout = 600.0 if timeout is None else timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ConfigError(f"environment.setup_timeout must be a positive number of seconds, not {timeout!r}")
    network = value.get("setup_network")
    network = False if network is None else network
    if not isinstance(network, bool):
        raise ConfigError(f"environment.setup_network must be true or false, not {network!r}")
    return EnvironmentSpec(files=tuple(sorted(parsed_files)), setup=tuple(setup), base=base, workdir=workdir,
                           setup_timeout=float(timeout), setup_network=network)


def row_environment(row: Mapping[str, Any]) -> EnvironmentSpec | None:
    """The environment a dataset row declares, if any."""
    return parse(row.get(ENVIRONMENT_COLUMN))
