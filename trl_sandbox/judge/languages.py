"""The languages the I/O judge runs: for each, the source file's name, a compile step (where there is
one) and a run command, and the toolchain a sandbox needs for them.

A plugin adds or replaces languages with the ``trl_sandbox_register_languages`` hook (``trl_sandbox.plugins.hookspecs``):
it calls ``register(Language(...))``. ``{memory_mb}`` in a run command is the test's memory limit,
for runtimes that reserve far more address space than they use (the JVM, V8, Go's runtime): those
set ``memory="flag"`` and get no address-space limit; the flag bounds their heap instead, and where
``runtime_mb`` is set, ``RLIMIT_DATA`` (the writable memory a process maps, which reservations do
not count toward) is the test's limit plus ``runtime_mb``: the runtime's own memory is allowed on
top, an allocation outside the heap the flag bounds (a direct buffer, a typed array) is not.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from trl_sandbox.sandbox import ConfigError


@dataclass(frozen=True)
class Language:
    """One language of the I/O judge."""

    name: str
    file: str  # the source file's name in the build directory
    run: tuple[str, ...]  # run in a copy of the build directory; the test's input on stdin
    compile: tuple[str, ...] | None = None  # run once in the build directory; exit 0 means compiled
    toolchain: tuple[str, ...] = ()  # commands that must exist in the sandbox
    package: str = ""  # what to install when they do not (a Debian package, or how)
    aliases: tuple[str, ...] = ()  # other names datasets use (fence tags, ``language`` values)
    memory: str = "as"  # "as": RLIMIT_AS is the test's memory limit; "flag": the run command bounds it
    # "flag" only: RLIMIT_DATA is the test's limit plus this (what the runtime itself keeps besides the
    # heap its flag bounds); None: no such limit (a runtime whose needs nobody measured).
    runtime_mb: int | None = None
    compile_memory: str = "as"  # the same for the compile step
    env: tuple[tuple[str, str], ...] = ()  # extra environment for compile and run
    class_name: bool = False  # Java: the file is named after the source's public class
    # Directories searched first for includes when the sandbox has them read-only (a precompiled
    # header the local sandbox binds; an image may ship one too).
    cache_include: tuple[str, ...] = ()

    def payload(self, source: str) -> dict:
        file = self.file
        run = list(self.run)
        compile_argv = list(self.compile) if self.compile else None
        if self.class_name:
            found = re.search(r"public\s+(?:final\s+|abstract\s+)*class\s+([A-Za-z_$][\w$]*)", source)
            name = found.group(1) if found else "Main"
            file = f"{name}.java"
            run = [a.replace("{class}", name) for a in run]
            compile_argv = [a.replace("{file}", file) for a in compile_argv] if compile_argv else None
        return {"name": self.name, "file": file, "compile": compile_argv, "run": run, "memory": self.memory,
                "runtime_mb": self.runtime_mb, "compile_memory": self.compile_memory, "env": dict(self.env), "cache_include": list(self.cache_include)}

    def missing(self, which: Callable[[str], str | None] = shutil.which) -> list[str]:
        """The toolchain's commands that ``which`` cannot find."""
        return [tool for tool in self.toolchain if not which(tool)]


# glibc reserves 64 MiB of address space per thread's malloc arena: a JVM's dozen threads would
# spend the sandbox's whole address-space limit on reservations, and so would node's (under the
# default 1 GiB a program's V8 heap could not pass some 36 MB).
_ARENAS_ENV = (("MALLOC_ARENA_MAX", "2"),)
# Go runs as many threads as the host has cores (its collector's idle workers, the build's compiles):
# two, whatever the host, so that a sandbox's process cap and a test's CPU time do not depend on it.
_GO_ENV = (("GOCACHE", "/tmp/go-cache"), ("GOPATH", "/tmp/go"), ("GOFLAGS", "-mod=mod"), ("CGO_ENABLED", "0"),
           ("GOMAXPROCS", "2"))

BUILTIN: tuple[Language, ...] = (
    Language("python", "main.py", ("python3", "-I", "main.py"), toolchain=("python3",), package="python3",
             aliases=("python3", "py", "py3", "pypy", "pypy3", "python 3")),
    Language("cpp", "main.cpp", ("./main",), ("g++", "-std=c++17", "-O2", "-pipe", "-o", "main", "main.cpp"),
             toolchain=("g++",), package="g++", aliases=("c++", "cpp17", "c++17", "cxx", "gnu c++", "cc"),
             cache_include=("/opt/trl-sandbox/pch",)),
    Language("c", "main.c", ("./main",), ("gcc", "-std=gnu11", "-O2", "-pipe", "-o", "main", "main.c", "-lm"),
             toolchain=("gcc",), package="gcc"),
    # Few threads (a sandbox caps processes, and threads count): a serial collector, one JIT thread.
    Language("java", "Main.java", ("java", "-Xmx{memory_mb}m", "-Xss16m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                                   "-XX:CICompilerCount=1", "-XX:CompressedClassSpaceSize=64m", "-XX:ReservedCodeCacheSize=32m",
                                   "-cp", ".",
                                   "{class}"),
             ("javac", "-J-Xmx512m", "-J-XX:+UseSerialGC", "-J-XX:TieredStopAtLevel=1", "-J-XX:CICompilerCount=1", "-J-XX:CompressedClassSpaceSize=64m",
              "-J-XX:ReservedCodeCacheSize=64m",
              "-encoding", "UTF-8", "{file}"), toolchain=("java", "javac"),
             package="default-jdk-headless", memory="flag", runtime_mb=384, compile_memory="none", class_name=True, env=_ARENAS_ENV, aliases=("java8", "java11", "java17")),
    Language("rust", "main.rs", ("./main",), ("rustc", "-O", "--edition", "2021", "-o", "main", "main.rs"),
             toolchain=("rustc",), package="rustc", aliases=("rs",), compile_memory="none"),
    # Go's runtime reserves some 700 MB of address space before main runs: no RLIMIT_AS of a test's
    # size lets it start. GOMEMLIMIT makes its collector keep the heap under the limit.
    Language("go", "main.go", ("env", "GOMEMLIMIT={memory_mb}MiB", "./main"), ("go", "build", "-o", "main", "main.go"),
             toolchain=("go",), package="golang", aliases=("golang",), memory="flag", runtime_mb=128,
             compile_memory="none", env=_GO_ENV),
    Language("javascript", "main.js", ("node", "--max-old-space-size={memory_mb}", "--stack-size=65500", "main.js"),
             toolchain=("node",), package="nodejs", memory="flag", runtime_mb=192, aliases=("js", "node", "nodejs"),
             env=_ARENAS_ENV),
)


class LanguageTable:
    """Languages by name and alias (case-insensitive). Built-in ones first, then the plugins'."""

    def __init__(self, languages: Iterable[Language] = ()) -> None:
        self._by_name: dict[str, Language] = {}
        self._alias: dict[str, str] = {}
        for language in languages:
            self.register(language)

    def register(self, language: Language) -> None:
        self._by_name[language.name.lower()] = language
        for alias in (language.name, *language.aliases):
            self._alias[alias.lower()] = language.name.lower()

    def get(self, name: str | None) -> Language:
        key = (name or "python").strip().lower()
        found = self._alias.get(key)
        if found is None:
            raise ConfigError(f"unknown program language {name!r}; the I/O judge knows {', '.join(self.names())} "
                              "(a plugin adds more with the trl_sandbox_register_languages hook)")
        return self._by_name[found]

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def fence_tags(self, language: Language) -> set[str]:
        return {alias for alias, name in self._alias.items() if name == language.name.lower()}


_TABLE: LanguageTable | None = None


def languages() -> LanguageTable:
    """The built-in languages plus every plugin's ``register_languages``."""
    global _TABLE
    if _TABLE is None:
        table = LanguageTable(BUILTIN)
        from trl_sandbox.plugins import plugin_manager

        plugin_manager().hook.trl_sandbox_register_languages(register=table.register)
        _TABLE = table
    return _TABLE


def check_toolchain(language: Language, which: Callable[[str], str | None] = shutil.which) -> None:
    """``ConfigError`` naming the package to install when ``language``'s toolchain is missing here."""
    missing = language.missing(which)
    if missing:
        raise ConfigError(
            f"programs in {language.name} need {', '.join(missing)}, which this machine lacks: install "
            f"{language.package or 'its toolchain'} (on Debian/Ubuntu: apt-get install {language.package}; "
            f"or IO_LANGUAGES={language.name} bash scripts/setup.sh)"
        )
