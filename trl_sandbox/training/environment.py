"""SandboxEnvironment: stateful multi-turn episodes for TRL's ``environment_factory``.

TRL builds environment instances, calls ``reset(**row)`` at the start of every rollout, exposes
the public methods as tools, and calls ``get_reward()`` at the end; it never closes them. So an
instance never owns a sandbox: it checks one out of the trainer's pool for the episode and gives
it back once the episode is scored (or at the next ``reset``, or when the pool closes, which
reclaims everything). All of a batch's episodes hold a sandbox at once and the judge needs one
more, so the pool grows to the number of episodes under way plus ``JUDGE_HEADROOM``; without
that, the last episode or the judge would wait forever for a sandbox no one gives back.

Every tool call has a deadline; what the model's commands do inside the sandbox is returned as
text. Once the pool has been up, a sandbox that cannot be had or is lost never raises out of
``reset`` or ``get_reward`` (that would end training): tools then report the failure to the
model, and the episode's reward is ``None``, an infrastructure failure that TRL leaves out.
Before any sandbox was ever up, the first ``reset`` raises the setup error instead.

Usage: ``SandboxGRPOTrainer(..., environment_factory=SandboxEnvironment)``; the trainer binds
its pool and sizes it so that every rollout of a batch can hold a sandbox at once.
"""

from __future__ import annotations

import logging
import shlex
import threading
import weakref
from collections import Counter
from collections.abc import Mapping
from typing import Any

from trl_sandbox.environments.builds import SetupFailed
from trl_sandbox.environments.spec import row_environment
from trl_sandbox.pool.sandbox_pool import SandboxPool
from trl_sandbox.sandbox import (
    TASK_COLUMN,
    ConfigError,
    InfraError,
    Outcome,
    Sandbox,
    SandboxOutageError,
)
from trl_sandbox.scoring.clip import clip_bytes, clip_text
from trl_sandbox.scoring.scorer import Scorer
from trl_sandbox.tasks.resolve import resolve_task
from trl_sandbox.training.episode_parts import (
    _attempts,
    _render,
    _row_files,
    _row_name,
    _text,
    _with_deadline,
)

log = logging.getLogger("trl_sandbox")

#: Fresh sandboxes an episode's reset tries before it gives up on the episode (which then scores None).
RESET_ATTEMPTS = 3

#: Sandboxes kept beyond those held by episodes, for the judge of ``run_tests`` and ``get_reward``
#: (one judging while the one used before it is being reset).
JUDGE_HEADROOM = 2

_held: weakref.WeakKeyDictionary[SandboxPool, int] = weakref.WeakKeyDictionary()
_held_lock = threading.Lock()


def _count_holder(pool: SandboxPool, delta: int) -> int:
    """Change and return how many episodes hold a sandbox of ``pool``."""
    with _held_lock:
        held = max(0, _held.get(pool, 0) + delta)
        _held[pool] = held
        return held


class EpisodeTally:
    """Statuses of the episodes scored since the last ``drain`` (the trainer logs them per step)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def add(self, status: str) -> None:
        with self._lock:
            self._counts[status] += 1

    def drain(self) -> Counter[str]:
        with self._lock:
            counts, self._counts = self._counts, Counter()
        return counts


class SandboxEnvironment:
    """An episode in one sandbox: tools ``bash``, ``read_file``, ``write_file``, ``run_tests``.

    The reward is the task's verdict on the file ``row["solution_path"]`` (default ``solution.py``)
    as the episode left it, judged like a single-turn completion of the same row.

    ``max_attempts`` (or a row's ``max_attempts`` column, which wins) bounds how many times
    ``run_tests`` judges the solution in one episode, as an agent's attempt budget: later calls
    answer that the budget is spent, without judging. ``None``: no bound.

    ``max_output_chars`` bounds what one tool call adds to the conversation, in bytes of UTF-8 (a
    character for ASCII output): the output of ``bash``, a file ``read_file`` shows, the detail of
    ``run_tests`` are cut in their middle with a marker ``... [N bytes cut] ...``. Observations
    stay in the conversation for the whole episode, however much the model's commands print.
    """

    def __init__(
        self,
        pool: SandboxPool | None = None,
        scorer: Scorer | None = None,
        tool_timeout: float = 10.0,
        max_output_chars: int = 4000,
        tally: EpisodeTally | None = None,
        max_attempts: int | None = None,
    ) -> None:
        self._pool = pool
        self._scorer = scorer
        self._tally = tally
        self.tool_timeout = tool_timeout
        self.max_output_chars = max_output_chars
        self.max_attempts = _attempts(max_attempts, "max_attempts")
        self._sandbox: Sandbox | None = None
        self._lost: str | None = None  # why the episode has no sandbox, when it lost it
        # Set when the episode's own programs ran its sandbox out of memory and it died: the
        # episode's doing, scored as its failure, never None (a policy would learn to escape a
        # bad score that way).
        self._ran_out = False
        self._row: dict[str, Any] = {}
        self._attempts_left: int | None = self.max_attempts
        self._budget_lock = threading.Lock()
        self._factory: Any = None  # set by ``environment_factory.EnvironmentFactory``: how to rebuild elsewhere

    @classmethod
    def factory(cls, **settings: Any):
        """A picklable ``environment_factory`` with a pool of its own in each process that calls it.

        For trainers that build environments in another process (TRL's ``AsyncGRPOTrainer``) or
        that do not bind a pool (a plain ``GRPOTrainer``); ``SandboxGRPOTrainer`` takes the class
        itself. ``settings``: see ``environment_factory.EnvironmentFactory``.
        """
        from trl_sandbox.training.environment_factory import EnvironmentFactory

        return EnvironmentFactory(environment_class=cls, **settings)

    def __reduce__(self):
        """An episode's sandbox and its pool stay in their process: a copy is a fresh environment.

        Made by a factory, the copy is that factory's (so it gets the pool of the process that
        unpickles it). Bound to a pool by hand, it is refused: nothing in the other process could
        rebuild that pool.
        """
        if self._factory is not None:
            return (_call, (self._factory,))
        if self._pool is not None:
            raise TypeError(
                "this SandboxEnvironment is bound to a pool of this process and cannot be sent to another; "
                "pass SandboxEnvironment.factory(provider=...) as environment_factory instead"
            )
        return (type(self), (None, None, self.tool_timeout, self.max_output_chars, None, self.max_attempts))

    # -- episode -----------------------------------------------------------------------------

    def reset(self, **row: Any) -> str | None:
        """Start an episode for ``row``: a clean sandbox, with ``row["files"]`` (path -> text) written in;
        with ``row["environment"]``, the sandbox's working directory is the episode's own copy of
        that prepared environment (built once per machine; a failed setup scores the episode None).

        Never raises for a sandbox problem (TRL calls it without a ``try``): a sandbox that cannot
        take the row's files is discarded and replaced, and an episode that gets no usable sandbox
        scores ``None``. Only a row the task cannot use raises, a ``ConfigError`` naming the row,
        and a declared outage (``SandboxOutageError``: no sandbox for ``sandbox_outage_s``), which
        stops training as it does for single-turn rewards.
        """
        self._release()
        self._row = dict(row)
        self._lost = None
        self._ran_out = False
        files = _row_files(row)
        try:
            spec = row_environment(row)
        except ConfigError as exc:
            raise ConfigError(f"dataset row {_row_name(row)}: {exc}") from exc
        row_attempts = row.get("max_attempts")
        self._attempts_left = (self.max_attempts if row_attempts is None
                               else _attempts(row_attempts, f"dataset row {_row_name(row)}: max_attempts"))
        if self._pool is None:
            return None  # the probe instance TRL builds at construction time
        if not self._pool.started:
            self._pool.start(wait=False)
        if not self._pool.ever_up:
            # Before any sandbox was ever up, a failure is a setup error (no key, no quota, no
            # bwrap): raise it now rather than train on nothing. Later outages score None.
            self._pool.wait_ready()
        prepared = None
        if spec is not None:
            try:  # built once per machine; a failed setup scores the episode None
                prepared = self._pool.loop.run(self._pool.prepare_environment(spec))
            except ConfigError:
                raise
            except Exception as exc:
                self._lose(exc)
                return row.get("observation")
        for _ in range(RESET_ATTEMPTS):
            self._pool.grow(_count_holder(self._pool, +1) + JUDGE_HEADROOM)
            try:
                self._sandbox = self._pool.loop.run(self._pool.checkout(prepared))
            except SandboxOutageError:
                _count_holder(self._pool, -1)
                raise  # no sandbox for longer than the outage budget: training stops, clearly
            except Exception as exc:  # no sandbox to be had: the episode scores None
                _count_holder(self._pool, -1)
                self._lose(exc)
                return row.get("observation")
            try:
                if prepared is not None:  # the episode's own copy of the row's environment
                    self._call(self._sandbox.use_environment(prepared))
                for path, data in files.items():
                    self._call(self._sandbox.write_file(path, data))
                return row.get("observation")
            except SetupFailed as exc:  # the environment's setup (built at this lease): no retry helps
                self._release()
                self._lose(exc)
                return row.get("observation")
            except (ValueError, TypeError) as exc:  # refused on the host: the row's own paths
                self._release()
                raise ConfigError(f"dataset row {_row_name(row)}: cannot write its files: {exc}") from exc
            except Exception as exc:  # the sandbox refused (or broke): replace it, try a fresh one
                self._release(broken=True)
                self._lost = f"{type(exc).__name__}: {exc}"
        log.warning("an episode got no usable sandbox in %d tries: %s", RESET_ATTEMPTS, self._lost)
        return row.get("observation")

    def _lose(self, exc: BaseException) -> None:
        self._lost = str(exc)
        log.warning("an episode lost its sandbox: %s", exc)

    def _release(self, broken: bool = False) -> None:
        if self._sandbox is not None and self._pool is not None:
            self._pool.checkin(self._sandbox, broken=broken)
            _count_holder(self._pool, -1)
        self._sandbox = None

    def _call(self, coro):
        """Run a provider call on the pool's loop with a deadline; a dead sandbox is replaced."""
        assert self._pool is not None
        try:
            return self._pool.loop.run(
                _with_deadline(coro, self.tool_timeout + self._pool.settings.exec_slack_s)
            )
        except InfraError as exc:
            self._release(broken=True)
            self._lost = str(exc)
            raise

    def _need_sandbox(self) -> Sandbox:
        if self._sandbox is None:
            if self._lost:
                raise InfraError(f"the episode's sandbox is unavailable ({self._lost}); nothing can run in it")
            raise RuntimeError("no episode is running: call reset() first (get_reward() ends an episode)")
        return self._sandbox

    # -- tools -------------------------------------------------------------------------------

    def bash(self, command: str) -> str:
        """Run a shell command in the sandbox's work directory and return its exit code and output.

        Args:
            command: The shell command to run, e.g. "python3 solution.py" or "ls -la".
        """
        return self._tool(lambda sandbox: self._bash(sandbox, command))

    def read_file(self, path: str) -> str:
        """Read a text file from the sandbox.

        Args:
            path: Path of the file, relative to the work directory.
        """
        return self._tool(lambda sandbox: self._read(sandbox, path))

    def write_file(self, path: str, content: str) -> str:
        """Write a text file in the sandbox, replacing it if it exists.

        Args:
            path: Path of the file, relative to the work directory.
            content: The full new content of the file.
        """
        return self._tool(lambda sandbox: self._write(sandbox, path, content))

    def run_tests(self) -> str:
        """Run the task's tests on the solution file: the verdict, how many pass, the error if the code raised."""
        def judge(_sandbox: Sandbox) -> str:
            if self._row.get(TASK_COLUMN) == "agent":  # its tests are hidden until the episode ends
                return "[error] this task has no public tests: the hidden tests run when the episode ends"
            with self._budget_lock:  # tool calls of one turn may run on several threads at once
                if self._attempts_left is not None:
                    if self._attempts_left <= 0:
                        return ("[error] no test runs left in this episode's attempt budget: "
                                "the solution file as it stands now is what will be scored")
                    self._attempts_left -= 1
            outcome = self._score(self._final_code())
            return f"{outcome.status}: {outcome.passed}/{outcome.total} tests passed" + (
                f" ({clip_text(outcome.detail, self.max_output_chars)})" if outcome.detail else ""
            )

        return self._tool(judge)

    def _tool(self, operation) -> str:
        """A tool's answer: its result, or what went wrong, as text for the model; never an exception.

        A failure the model's arguments or files provoke is an observation. A sandbox that broke is
        also reported, and the episode then scores ``None``: that was not the model's doing.
        """
        try:
            return operation(self._need_sandbox())
        except InfraError as exc:
            return f"[error] the sandbox is unavailable: {_text(exc)}"
        except Exception as exc:
            return f"[error] {type(exc).__name__}: {_text(exc)}"

    def _bash(self, sandbox: Sandbox, command: str) -> str:
        result = self._call(sandbox.exec(["sh", "-c", str(command)], timeout=self.tool_timeout))
        if result.exit_code is None and result.oom_killed:
            self._ran_out = True
        return _render(result, self.max_output_chars)

    def _read(self, sandbox: Sandbox, path: str) -> str:
        # A file may be as large as the sandbox allows (64 MiB): only what is shown is decoded.
        return clip_bytes(self._call(sandbox.read_file(path)), self.max_output_chars)

    def _write(self, sandbox: Sandbox, path: str, content: str) -> str:
        # A lone surrogate is legal in a tool call's JSON but not in UTF-8: it is written as "?".
        self._call(sandbox.write_file(path, str(content).encode("utf-8", "replace")))
        return f"wrote {len(str(content))} characters to {shlex.quote(str(path))}"

    # -- reward ------------------------------------------------------------------------------

    def get_reward(self) -> float | None:
        """The reward scheme's value for the final solution file (``None`` on infrastructure failure).

        The episode is over once it is scored, so its sandbox goes back to the pool before the
        judge runs: the judge gets a sandbox even when every other one is held by an episode.
        """
        task = resolve_task(self._row) if self._row.get(TASK_COLUMN) else None
        if callable(getattr(task, "grade_episode", None)):  # an agent task: graded out of its reach
            return self._agent_reward(task)
        try:
            code: str | None = self._final_code()
        except InfraError:
            code = None
        finally:
            self._release()
        try:
            outcome = self._score(code) if code is not None else Outcome("infra")
        except InfraError:
            outcome = Outcome("infra")
        if outcome.status == "infra" and self._ran_out:
            outcome = Outcome("error", detail=RAN_OUT)
        if self._tally is not None:
            self._tally.add(outcome.status)
        return outcome.reward

    def _agent_reward(self, task: Any) -> float | None:
        sandbox = self._sandbox
        try:
            if sandbox is None or self._pool is None or self._scorer is None:
                outcome = Outcome("infra", detail=self._lost or "no sandbox")
            else:
                outcome = self._pool.loop.run(task.grade_episode(self._pool, sandbox, self._row))
        except Exception as exc:  # a lost sandbox, a failed setup: never the agent's verdict
            log.warning("an agent episode could not be graded: %r", exc)
            outcome = Outcome("infra", detail=f"{type(exc).__name__}: {exc}")
        finally:
            self._release()
        if outcome.status == "infra" and self._ran_out:
            outcome = Outcome("failed", 0, 1, detail=RAN_OUT)
        if self._tally is not None:
            self._tally.add(outcome.status)
        return self._scorer.reward(task, outcome) if self._scorer is not None else None

    def _final_code(self) -> str:
        path = self._row.get("solution_path", "solution.py")
        sandbox = self._need_sandbox()
        try:
            return self._call(sandbox.read_file(path)).decode(errors="replace")
        except InfraError:
            raise
        except Exception:  # no solution file: the model wrote nothing, scored as missing code
            return ""

    def _score(self, code: str):
        if self._scorer is None:
            raise RuntimeError("SandboxEnvironment needs the trainer's scorer: pass it via SandboxGRPOTrainer")
        row: Mapping[str, Any] = self._row
        (outcome,) = self._scorer.score([code], [row])
        return outcome


RAN_OUT = "the episode's own programs ran its sandbox out of memory, which ended it"


def _call(factory):
    return factory()


