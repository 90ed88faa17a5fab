"""A Dockerfile made of the common instructions, as a prepared environment (``environment`` column).

trl-sandbox builds no images: a task's Dockerfile is read as a recipe for
``trl_sandbox.environments.spec`` (files written into the working directory, then setup commands
run there, on a base the image map names). What each instruction becomes:

``FROM IMAGE [AS NAME]``
    ``base``, through the caller's image map (``images.resolve``): an unmapped image is a
    ``ConfigError`` that says to pass ``--image-map NAME=host|oci:PATH``. ``--platform`` is
    accepted and ignored (the map decides what runs). A second ``FROM`` (a multi-stage build) and
    ``COPY --from`` are refused.
``WORKDIR PATH``
    the last one is ``workdir``: the agent, the setup and the tests all see the tree there (e.g.
    ``/app``). An earlier one must be that directory, inside it (created by a ``mkdir -p`` setup
    step) or above it (``/``): a ``RUN`` under it starts with ``cd`` there. Any other is refused:
    only the tree under the working directory is prepared. A Dockerfile without ``WORKDIR`` takes
    the caller's default (Harbor's ``[environment] workdir``), else it is refused.
``COPY``/``ADD SRC... DEST``
    files of the task's environment directory (the build context, ``.dockerignore`` honoured;
    ``..``, absolute sources, symlinks and binary files refused) placed in ``files`` at their
    destination relative to the working directory; a destination outside it is refused. An
    executable source file (or ``--chmod=OCTAL``) adds a ``chmod`` setup step; an empty directory
    a ``mkdir -p`` step. ``--chown`` and ``--link`` are accepted and ignored (every file belongs to
    the sandbox's one user). ``ADD`` of a URL or of an archive (which Docker would fetch or unpack)
    is refused: fetch or unpack it into the environment directory and ``COPY`` the result.
``RUN``
    one ``setup`` command each, run by ``/bin/sh -c`` as Docker does, with the ``ENV`` and ``ARG``
    values in force exported in front (and ``cd`` to its ``WORKDIR`` when that differs). The exec
    form (``RUN ["python3", "-m", "venv", ".venv"]``) runs the same argv, quoted. ``RUN --mount``
    and other flags are refused.
``ENV K=V ...`` / ``ENV K V``
    exported to every later ``RUN`` and returned as ``env`` (the row's ``env`` column: what the
    agent's commands and the verifier should see too). Variables are substituted as Docker does;
    one the Dockerfile never set is empty, except ``PATH``, which starts as Docker's default.
``ARG NAME[=default]``
    a build variable with its default (no ``--build-arg`` exists here); an ``ARG`` before
    ``FROM`` is seen by ``FROM`` only, unless redeclared after it, as in Docker.
``LABEL``, ``MAINTAINER``, ``EXPOSE``
    accepted and ignored: metadata, or a port nobody can reach (programs have no network).
``CMD``/``ENTRYPOINT``
    accepted only as a keep-alive (``sleep infinity``, ``tail -f /dev/null``, a bare shell): the
    sandbox starts no main process, so one that starts a service the task relies on is refused.
Anything else (``USER``, ``SHELL``, ``VOLUME``, ``HEALTHCHECK``, ``ONBUILD``, ``STOPSIGNAL``, an
unknown word) is a ``ConfigError`` naming the instruction and its line, and saying why.

One difference from Docker remains: every ``COPY``'d file is in place before the first ``RUN``
(the environment writes its files first), so a ``RUN`` that made a file a later ``COPY``
overwrites leaves its own version. Nothing outside the working directory survives the build.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trl_sandbox.agents import images
from trl_sandbox.agents.dockerfile_syntax import NAME, Line, exec_form, logical_lines, split_flags, words
from trl_sandbox.environments.spec import parse
from trl_sandbox.sandbox import ConfigError

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # Docker's, for an image without one
IGNORED = ("LABEL", "MAINTAINER", "EXPOSE")
KEEP_ALIVE = (["sleep", "infinity"], ["tail", "-f", "/dev/null"], ["bash"], ["sh"], ["/bin/bash"], ["/bin/sh"])
REFUSED = {
    "USER": "every command runs as the sandbox's one unprivileged user; a task whose agent and setup run as "
            "different users cannot be reproduced",
    "SHELL": "setup commands run with /bin/sh -c; write `bash -c '...'` in the RUN line instead",
    "VOLUME": "nothing is mounted into a prepared environment; keep the data under the WORKDIR",
    "HEALTHCHECK": "no service runs beside the agent; start it from the task's commands",
    "ONBUILD": "the environment is not a base for other builds",
    "STOPSIGNAL": "the sandbox starts no main process to stop",
}
# COPY/ADD flags: accepted ("") or why refused
COPY_FLAGS = {"chown": "", "chmod": "", "link": "", "from": "multi-stage builds are not supported",
              "parents": "copy each directory explicitly", "exclude": "use .dockerignore",
              "checksum": "ADD of remote files is not supported",
              "keep-git-dir": "ADD of git repositories is not supported"}
ARCHIVES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst", ".gz", ".bz2", ".xz")


@dataclass
class DockerfileEnvironment:
    """What a Dockerfile became: the ``environment`` dict, the ``ENV`` values, the image it names."""

    environment: dict[str, Any]
    env: dict[str, str]
    image: str
    workdir: str


@dataclass
class _Step:
    kind: str  # "run", "chmod", "mkdir"
    line: Line
    cwd: str = "/"
    command: str = ""
    exports: dict[str, str] = field(default_factory=dict)
    paths: list[str] = field(default_factory=list)  # absolute
    mode: str = ""


def from_dockerfile(text: str, *, image_map: Mapping[str, str], context: str | Path | None = None,
                    default_workdir: str | None = None, setup_timeout: float | None = None,
                    setup_network: bool = False, source: str = "Dockerfile",
                    hidden: tuple[str, ...] = ()) -> DockerfileEnvironment:
    """The environment a Dockerfile describes (see the module's docstring); ``context`` is the
    directory ``COPY`` reads from (the task's environment directory). ``hidden``: paths of the
    context the environment must never hold (a terminal-bench task's tests and oracle, which sit
    beside its Dockerfile): a ``COPY`` that names one is refused, a directory copy skips them."""
    reader = _Reader(source, Path(context) if context is not None else None, hidden)
    for line in logical_lines(text, source):
        reader.read(line)
    if reader.image is None:
        raise ConfigError(f"{source}: no FROM instruction; the first instruction must be FROM IMAGE")
    workdir = reader.workdirs[-1] if reader.workdirs else default_workdir
    if workdir is None:
        raise ConfigError(f"{source}: no WORKDIR; add `WORKDIR /app` (the directory the agent, the setup and "
                          "the tests work in) after FROM")
    workdir = posixpath.normpath(workdir)
    base = images.resolve(reader.image, image_map, f"{source} line {reader.from_line} (FROM)")
    files = {_inside(path, workdir, line, "COPY puts a file at"): text for path, (text, line) in reader.files.items()}
    setup = [command for step in reader.steps if (command := _render(step, workdir))]
    environment: dict[str, Any] = {"files": files, "setup": setup, "base": base, "workdir": workdir,
                                   "setup_network": setup_network}
    if setup_timeout is not None:
        environment["setup_timeout"] = setup_timeout
    parse(environment)  # what spec.parse refuses is refused here, at load time
    return DockerfileEnvironment(environment=environment, env=dict(reader.env), image=reader.image, workdir=workdir)


def _inside(path: str, workdir: str, line: Line, what: str) -> str:
    """``path`` (absolute) relative to ``workdir``, or a ``ConfigError``."""
    if path == workdir or not path.startswith(workdir.rstrip("/") + "/"):
        raise line.error(f"{what} {path}, outside the working directory {workdir}: only the tree under the "
                         f"last WORKDIR is prepared; put it under {workdir}")
    return path[len(workdir.rstrip("/")) + 1:]


def _render(step: _Step, workdir: str) -> str:
    if step.kind == "mkdir":  # a WORKDIR or an empty directory COPY makes; the working directory exists
        made = [_inside(p, workdir, step.line, f"{step.line.keyword} makes a directory at") for p in step.paths
                if p != workdir and not workdir.startswith(p.rstrip("/") + "/")]
        return ("mkdir -p -- " + " ".join(shlex.quote(p) for p in made)) if made else ""
    if step.kind == "chmod":
        return f"chmod {step.mode} -- " + " ".join(shlex.quote(_inside(p, workdir, step.line, "COPY puts a file at"))
                                                   for p in step.paths)
    lines = []
    if step.exports:
        lines.append("export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in step.exports.items()))
    if step.cwd != workdir:
        inside = step.cwd.startswith(workdir.rstrip("/") + "/")
        above = workdir.startswith(step.cwd.rstrip("/") + "/")
        if not (inside or above):
            raise step.line.error(f"runs in {step.cwd}, outside the working directory {workdir}: only the tree "
                                  f"under the last WORKDIR is prepared")
        lines.append(f"cd {shlex.quote(step.cwd)} || exit 1")
    lines.append(step.command)
    return "\n".join(lines)


class _Reader:
    """Reads instructions in order and keeps what they add up to."""

    def __init__(self, source: str, context: Path | None, hidden: tuple[str, ...] = ()):
        self.source, self.context, self.hidden = source, context, hidden
        self.image: str | None = None
        self.from_line = 0
        self.global_args: dict[str, str] = {}
        self.args: dict[str, str] = {}
        self.env: dict[str, str] = {}
        self.cwd = "/"
        self.workdirs: list[str] = []
        self.dirs: set[str] = {"/"}
        self.files: dict[str, tuple[str, Line]] = {}
        self.steps: list[_Step] = []
        self.ignore = _dockerignore(context)

    def lookup(self, name: str) -> str | None:
        if name in self.env:
            return self.env[name]
        if name in self.args:
            return self.args[name]
        return DEFAULT_PATH if name == "PATH" else None

    def read(self, line: Line) -> None:
        keyword = line.keyword
        if self.image is None and keyword not in ("FROM", "ARG"):
            raise line.error("the first instruction must be FROM (only ARG may come before it)")
        handler = getattr(self, "do_" + keyword.lower(), None)
        if handler is not None:
            handler(line)
        elif keyword in IGNORED:
            pass
        elif keyword in REFUSED:
            raise line.error(f"{keyword} is not supported: {REFUSED[keyword]}")
        else:
            raise line.error(f"the instruction {keyword} is not supported; a task's Dockerfile may use FROM, "
                             "WORKDIR, COPY, ADD (local files), RUN, ENV, ARG, LABEL, EXPOSE and a keep-alive CMD")

    def do_from(self, line: Line) -> None:
        if self.image is not None:
            raise line.error("multi-stage builds (a second FROM) are not supported; build the result once, "
                             "export it as an OCI layout and map the task's image to it with --image-map")
        _, rest = split_flags(line, {"platform": ""})
        parts = words(line, rest, lambda name: self.global_args.get(name))
        if len(parts) == 3 and parts[1].lower() == "as":
            parts = parts[:1]
        if len(parts) != 1:
            raise line.error("write FROM IMAGE[:TAG] [AS NAME]")
        self.image, self.from_line = parts[0], line.number

    def do_arg(self, line: Line) -> None:
        if not line.args:
            raise line.error("write ARG NAME[=default]")
        for word in words(line, line.args, self.lookup if self.image else self.global_args.get):
            name, has_default, value = word.partition("=")
            if not NAME.fullmatch(name):
                raise line.error(f"{name!r} is not a variable name")
            if self.image is None:
                self.global_args[name] = value
            else:
                self.args[name] = value if has_default else self.global_args.get(name, "")

    def do_env(self, line: Line) -> None:
        parts = words(line, line.args, self.lookup)
        if not parts:
            raise line.error("write ENV NAME=VALUE")
        if "=" not in parts[0]:  # the old form: ENV NAME the value
            pairs = [(parts[0], " ".join(parts[1:]))]
        else:
            pairs = []
            for word in parts:
                name, sep, value = word.partition("=")
                if not sep:
                    raise line.error(f"{word!r}: write ENV NAME=VALUE [NAME=VALUE ...]")
                pairs.append((name, value))
        for name, value in pairs:
            if not NAME.fullmatch(name):
                raise line.error(f"{name!r} is not a variable name")
            self.env[name] = value

    def do_workdir(self, line: Line) -> None:
        parts = words(line, line.args, self.lookup)
        if len(parts) != 1:
            raise line.error("write WORKDIR /path")
        self.cwd = posixpath.normpath(posixpath.join(self.cwd, parts[0]))
        if self.cwd == "/":
            return
        self.workdirs.append(self.cwd)
        if self.cwd not in self.dirs:
            self.steps.append(_Step("mkdir", line, paths=[self.cwd]))
        self.dirs.add(self.cwd)

    def do_run(self, line: Line) -> None:
        if line.args.startswith("--"):
            raise line.error("RUN flags (--mount, --network, --security) are not supported")
        argv = exec_form(line.args)
        command = shlex.join(argv) if argv is not None else line.args
        if not command.strip():
            raise line.error("an empty RUN")
        exports = {**self.args, **self.env}
        self.steps.append(_Step("run", line, cwd=self.cwd, command=command, exports=exports))

    def do_cmd(self, line: Line) -> None:
        argv = exec_form(line.args)
        if argv is None:
            try:
                argv = shlex.split(line.args)
            except ValueError:
                argv = [line.args]
        if argv and argv not in KEEP_ALIVE:
            raise line.error(f"{line.keyword} {line.args} is not supported: the sandbox starts no main process; "
                             "a service the task needs must be started by its own commands. Only a keep-alive "
                             "(sleep infinity, tail -f /dev/null, a shell) is accepted")

    do_entrypoint = do_cmd

    def do_add(self, line: Line) -> None:
        self.do_copy(line)

    def do_copy(self, line: Line) -> None:
        flags, rest = split_flags(line, COPY_FLAGS)
        mode = flags.get("chmod", "")
        if mode and not (mode.isdigit() and set(mode) <= set("01234567")):
            raise line.error(f"--chmod={mode}: give an octal mode such as 755")
        parts = exec_form(rest)
        parts = parts if parts is not None else words(line, rest, self.lookup)
        if len(parts) < 2:
            raise line.error(f"write {line.keyword} SRC... DEST")
        *sources, dest = parts
        for src in sources:
            if "://" in src or src.startswith("git@"):
                raise line.error(f"{src!r}: fetching from the network is not supported; download it into the "
                                 "task's environment directory and COPY it")
            if line.keyword == "ADD" and src.lower().endswith(ARCHIVES):
                raise line.error(f"{src!r}: ADD would unpack this archive; unpack it into the task's environment "
                                 "directory and COPY the result")
        found = [item for src in sources for item in self._sources(line, src)]
        target = posixpath.normpath(posixpath.join(self.cwd, dest))
        into_dir = dest.endswith("/") or dest in (".", "./") or target in self.dirs or len(found) > 1
        if len(found) > 1 and not (dest.endswith("/") or target in self.dirs):
            raise line.error(f"copies several sources: the destination {dest!r} must be a directory ending in '/'")
        executable: list[str] = []
        copied: list[str] = []
        for path, is_dir in found:
            if is_dir:
                for rel, file in self._walk(line, path):
                    copied.append(self._put(line, posixpath.join(target, rel), file, executable))
                self.dirs.add(target)
            else:
                where = posixpath.join(target, path.name) if into_dir else target
                copied.append(self._put(line, where, path, executable))
        if mode:
            self.steps.append(_Step("chmod", line, paths=[p for p in copied if p], mode=mode))
        elif executable:
            self.steps.append(_Step("chmod", line, paths=executable, mode="+x"))

    def _sources(self, line: Line, src: str) -> list[tuple[Path, bool]]:
        if self.context is None:
            raise line.error("COPY needs the task's environment directory (the build context)")
        rel = posixpath.normpath(src)
        if rel.startswith("/") or rel == ".." or rel.startswith("../"):
            raise line.error(f"{src!r} is outside the build context; COPY files of the task's environment directory")
        root = self.context.resolve()
        glob = any(c in rel for c in "*?[")
        paths = sorted(root.glob(rel)) if glob else [root / rel]
        if not paths or not paths[0].exists():
            raise line.error(f"{src!r} is not in the task's environment directory {self.context}")
        out = []
        for path in paths:
            if path.is_symlink() or not path.resolve().is_relative_to(root):
                raise line.error(f"{src!r} is a symlink; COPY regular files and directories only")
            rel_path = path.relative_to(root).as_posix()
            if any(rel_path == h or rel_path.startswith(h + "/") for h in self.hidden):
                if glob:
                    continue  # a wildcard skips them, as a directory copy does
                raise line.error(f"{src!r} would put {rel_path}, which the task keeps hidden from the agent (its "
                                 "tests or its solution), into the environment")
            if not self._ignored(rel_path):
                out.append((path, path.is_dir()))
            elif not glob:
                raise line.error(f"{src!r} is excluded by the context's .dockerignore")
        return out

    def _walk(self, line: Line, top: Path) -> list[tuple[str, Path | None]]:
        """``(relative path, file)`` for every file under ``top``; ``None`` marks an empty directory."""
        root = self.context.resolve()
        out: list[tuple[str, Path | None]] = []
        for dirpath, dirnames, filenames in os.walk(top):
            here = Path(dirpath)
            dirnames[:] = sorted(d for d in dirnames if not self._ignored((here / d).relative_to(root).as_posix()))
            kept = sorted(f for f in filenames if not self._ignored((here / f).relative_to(root).as_posix()))
            for name in dirnames + kept:
                if (here / name).is_symlink():
                    raise line.error(f"{(here / name).relative_to(root)} is a symlink; COPY regular files only")
            out.extend(((here / f).relative_to(top).as_posix(), here / f) for f in kept)
            if not dirnames and not kept and here != top:
                out.append((here.relative_to(top).as_posix(), None))
        return out

    def _put(self, line: Line, where: str, path: Path | None, executable: list[str]) -> str:
        if path is None:  # an empty directory
            self.steps.append(_Step("mkdir", line, paths=[where]))
            self.dirs.add(where)
            return ""
        data = path.read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise line.error(f"{path.name} is a binary file; a prepared environment's files are text: make it in "
                             "a RUN step instead") from None
        self.files[where] = (text, line)
        self.dirs.add(posixpath.dirname(where))
        if path.stat().st_mode & 0o111:
            executable.append(where)
        return where

    def _ignored(self, rel: str) -> bool:
        return any(fnmatch.fnmatch(rel, pattern) or rel.startswith(pattern.rstrip("/") + "/")
                   for pattern in self.ignore + list(self.hidden))


def _dockerignore(context: Path | None) -> list[str]:
    """The patterns of the context's ``.dockerignore`` (``!`` exceptions are refused)."""
    if context is None or not (context / ".dockerignore").is_file():
        return []
    patterns = []
    for raw in (context / ".dockerignore").read_text(encoding="utf-8").splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        if pattern.startswith("!"):
            raise ConfigError(f"{context / '.dockerignore'}: exceptions ({pattern}) are not supported")
        patterns.append(posixpath.normpath(pattern.lstrip("/")))
    return patterns
