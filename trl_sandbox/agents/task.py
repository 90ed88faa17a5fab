"""The ``agent`` task: a row's instruction carried out in its prepared environment, graded out of
the agent's reach (``grading.py``).

Single-turn (training rewards, ``trl-sandbox evaluate``): the completion is a shell script (a
fenced ``bash``/``sh`` block, or the bare text), run as the agent's actions in a copy of the row's
environment with the row's ``agent_timeout``. Episodes (``SandboxEnvironment``): the agent's tools
act in its copy; ``grade_episode`` takes the episode's sandbox when it ends. Both then grade the
same way: the changes carried into a fresh copy, the row's hidden ``tests`` at ``/tests``, the
row's ``verify`` command (default ``bash /tests/test.sh``) with ``verify_timeout``.

Row columns: ``prompt``, ``environment`` (required), ``tests`` ({path: text}), ``verify``,
``protected`` (paths), ``expected`` (test ids that must pass, from a JUnit report the verify
command writes to ``/logs/verifier/junit.xml``), ``agent_timeout`` (default 600 s),
``verify_timeout`` (default 600 s), ``sandbox_task`` = ``"agent"``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from trl_sandbox.agents.grading import VERIFY_ENV, carried, verdict
from trl_sandbox.environments.spec import row_environment
from trl_sandbox.local.agent_ops import ChangesTooLarge
from trl_sandbox.plugins import hookimpl
from trl_sandbox.sandbox import ConfigError, ExecResult, InfraError, Outcome, Program

FENCE = re.compile(r"```(?:bash|sh|shell)?[ \t]*\n(.*?)```", re.S)
DEFAULT_VERIFY = "bash /tests/test.sh"


def actions(completion: str) -> str:
    """The shell script in a completion: its fenced blocks, in order, or the bare text."""
    blocks = FENCE.findall(completion)
    return "\n".join(blocks) if blocks else completion


def _seconds(row: Mapping[str, Any], column: str, default: float = 600.0) -> float:
    value = row.get(column)
    return default if value is None else float(value)


class AgentTask:
    """Scores rows whose ``sandbox_task`` is ``agent`` (see the module docstring)."""

    name = "agent"

    def rows(self, **options: Any) -> list[dict[str, Any]]:
        raise ConfigError("the agent task has no rows of its own: load task directories with "
                          "trl_sandbox.agents.load_agent_tasks(DIR, image_map=...)")

    def build(self, completion: str, row: Mapping[str, Any]) -> Program | Outcome:
        raise ConfigError("agent rows are run with AgentTask.arun (the scorer does so)")

    def score(self, result: ExecResult, row: Mapping[str, Any], *, nonce: bytes | None) -> Outcome:
        raise ConfigError("agent rows are graded with AgentTask.arun (the scorer does so)")

    async def arun(self, pool: Any, completion: str, row: Mapping[str, Any]) -> Outcome:
        """A single-turn sample: ``completion``'s script as the agent's actions, then the grade."""
        spec = row_environment(row)
        if spec is None:
            raise ConfigError(f"agent row {row.get('task_id', '?')!r} has no environment")
        prepared = await pool.prepare_environment(spec)
        script = actions(completion)
        sandbox = await pool.checkout(prepared)
        broken = True
        try:
            await sandbox.use_environment(prepared)
            await sandbox.exec(["/bin/bash", "-c", script], timeout=_seconds(row, "agent_timeout"))
            changes = await sandbox.environment_changes()
            broken = False
        except ChangesTooLarge as exc:
            broken = False
            return Outcome("failed", 0, 1, detail=f"the agent's changes are too large: {exc}")
        finally:
            pool.checkin(sandbox, broken=broken)
        return await self.grade(pool, prepared, changes, row)

    async def grade_episode(self, pool: Any, sandbox: Any, row: Mapping[str, Any]) -> Outcome:
        """An episode's end: its changes (its sandbox still leased), then the grade."""
        spec = row_environment(row)
        prepared = await pool.prepare_environment(spec)
        try:
            changes = await sandbox.environment_changes()
        except ChangesTooLarge as exc:
            return Outcome("failed", 0, 1, detail=f"the agent's changes are too large: {exc}")
        return await self.grade(pool, prepared, changes, row)

    async def grade(self, pool: Any, prepared: Any, changes: list, row: Mapping[str, Any]) -> Outcome:
        kept, refused = carried(changes, row.get("protected") or (), getattr(prepared, "tree", None))
        tests = {str(p): (t.encode() if isinstance(t, str) else bytes(t)) for p, t in (row.get("tests") or {}).items()}
        sandbox = await pool.checkout(prepared)
        broken = True
        try:
            await sandbox.use_environment(prepared)
            await sandbox.apply_changes(kept)
            await sandbox.bring_tests(tests)
            result = await sandbox.exec(["/bin/sh", "-c", str(row.get("verify") or DEFAULT_VERIFY)],
                                        timeout=_seconds(row, "verify_timeout"), env=VERIFY_ENV)
            reports = await sandbox.verifier_reports()
            broken = False
        except InfraError:
            raise
        except OSError as exc:  # the supervisor refused what the host sent: the sandbox is suspect
            raise InfraError(f"grading failed in sandbox {getattr(sandbox, 'id', '?')}: {exc}") from exc
        finally:
            pool.checkin(sandbox, broken=broken)
        return verdict(reports, result.exit_code, result.timed_out, row, refused)


@hookimpl
def trl_sandbox_register_tasks(register):
    register("agent", AgentTask())
