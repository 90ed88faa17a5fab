"""The ``agent`` task: a row's instruction carried out in its prepared environment, graded out of
the agent's reach (``grading.py``).

Single-turn (training rewards, ``trl-sandbox evaluate``): the completion is a shell script (a
fenced ``bash``/``sh`` block, or the bare text), run as the agent's actions in a copy of the row's
environment with the row's ``agent_timeout``. Episodes (``SandboxEnvironment``): the agent's tools
act in its copy; ``grade_episode`` takes the episode's sandbox when it ends. Both then grade the
same way: the changes carried into a fresh copy, the row's hidden ``tests`` at ``/tests``, the
row's ``verify`` command (default ``bash /tests/test.sh``) with ``verify_timeout``.

Row columns: ``trl_sandbox.agents.columns``.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from typing import Any

from trl_sandbox.agents.canary import plant
from trl_sandbox.agents.columns import TESTS_DIR, row_of
from trl_sandbox.agents.grading import JUNIT, VERIFY_ENV, carried, parents, verdict
from trl_sandbox.environments.spec import parse
from trl_sandbox.local.agent_ops import ChangesTooLarge
from trl_sandbox.plugins.hookspecs import hookimpl
from trl_sandbox.sandbox import ConfigError, ExecResult, InfraError, Outcome, Program

FENCE = re.compile(r"```(?:bash|sh|shell)?[ \t]*\n(.*?)```", re.S)


def actions(completion: str) -> str:
    """The shell script in a completion: its fenced blocks, in order, or the bare text."""
    blocks = FENCE.findall(completion)
    return "\n".join(blocks) if blocks else completion


RAN_OUT = "the agent's programs ran the sandbox out of memory, which ended it"


def _ran_out(sandbox: Any) -> bool:
    """Whether a sandbox that died during grading died of the memory the agent's programs left."""
    check = getattr(sandbox, "ran_out_of_memory", None)
    return bool(check is not None and check())


def check_grades_agent_tasks(provider: Any, name: str = "the dataset") -> None:
    """A ``ConfigError`` unless ``provider`` can grade agent tasks out of the agent's reach (read a
    lease's changes, carry them into a fresh copy, bring the hidden tests): the local sandbox can."""
    if not getattr(provider, "grades_agent_tasks", False):
        raise ConfigError(
            f"{name} has agent tasks (sandbox_task 'agent'), which the {getattr(provider, 'name', '?')!r} provider "
            "cannot grade out of the agent's reach; use sandbox_provider='local' (docs/agents.md)")


class AgentTask:
    """Scores rows whose ``sandbox_task`` is ``agent`` (see the module docstring)."""

    name = "agent"
    description = "agent tasks in a prepared environment, graded out of the agent's reach (built-in set)"

    def rows(self, **options: Any) -> list[dict[str, Any]]:
        """The built-in set (``agents.builtin_tasks``); any Harbor, terminal-bench or SWE-style
        set loads with ``trl_sandbox.agents.load_agent_tasks(SOURCE, image_map=...)``."""
        from trl_sandbox.agents.load import agent_rows

        return agent_rows("builtin", **options)

    def validate(self) -> list[str]:
        """Every built-in task's oracle passes and an empty script fails, graded as training grades."""
        import asyncio

        from trl_sandbox.pool.sandbox_pool import SandboxPool

        problems = []
        rows = self.rows()
        with SandboxPool.open("local", size=2) as pool:
            async def both(row):
                return await asyncio.gather(self.arun(pool, row["solution"], row), self.arun(pool, "true", row))

            outcomes = [o for row in rows for o in pool.loop.run(both(row))]
        for i, row in enumerate(rows):
            oracle, nothing = outcomes[2 * i], outcomes[2 * i + 1]
            if oracle.status != "passed":
                problems.append(f"{row['task_id']}: the oracle scored {oracle.status} ({oracle.detail})")
            if nothing.status != "failed":
                problems.append(f"{row['task_id']}: an empty script scored {nothing.status} ({nothing.detail})")
        return problems

    def build(self, completion: str, row: Mapping[str, Any]) -> Program | Outcome:
        raise ConfigError("agent rows are run with AgentTask.arun (the scorer does so)")

    def score(self, result: ExecResult, row: Mapping[str, Any], *, nonce: bytes | None) -> Outcome:
        raise ConfigError("agent rows are graded with AgentTask.arun (the scorer does so)")

    async def arun(self, pool: Any, completion: str, row: Mapping[str, Any]) -> Outcome:
        """A single-turn sample: ``completion``'s script as the agent's actions, then the grade."""
        r = row_of(row)
        check_grades_agent_tasks(pool.provider, f"task {r['task_id']!r}")
        prepared = await pool.prepare_environment(parse(r["environment"]))
        sandbox = await pool.checkout(prepared)
        broken = True
        try:
            await sandbox.use_environment(prepared)
            acted = await sandbox.exec(["/bin/bash", "-c", actions(completion)], timeout=r["agent_timeout"],
                                       env=r["env"] or None)
            if acted.exit_code is None and acted.oom_killed:  # its own doing: a verdict, never None
                return Outcome("failed", 0, 1, detail=RAN_OUT)
            changes = await sandbox.environment_changes()
            broken = False
        except ChangesTooLarge as exc:
            broken = False
            return Outcome("failed", 0, 1, detail=f"the agent's changes are too large: {exc}")
        except InfraError:
            if _ran_out(sandbox):
                return Outcome("failed", 0, 1, detail=RAN_OUT)
            raise
        finally:
            pool.checkin(sandbox, broken=broken)
        return await self.grade(pool, prepared, changes, r)

    async def grade_episode(self, pool: Any, sandbox: Any, row: Mapping[str, Any]) -> Outcome:
        """An episode's end: its changes (its sandbox still leased), then the grade."""
        r = row_of(row)
        prepared = await pool.prepare_environment(parse(r["environment"]))
        try:
            changes = await sandbox.environment_changes()
        except ChangesTooLarge as exc:
            return Outcome("failed", 0, 1, detail=f"the agent's changes are too large: {exc}")
        except InfraError:
            if _ran_out(sandbox):
                return Outcome("failed", 0, 1, detail=RAN_OUT)
            raise
        return await self.grade(pool, prepared, changes, r)

    async def grade(self, pool: Any, prepared: Any, changes: list, r: Mapping[str, Any]) -> Outcome:
        """``changes`` carried into a fresh copy, the tests brought in, the verifier run."""
        kept, refused = carried(changes, r["protected"], getattr(prepared, "tree", None))
        tests = {p: t.encode() for p, t in r["tests"].items()}
        canaries: list[str] = []
        if r["parser"] == "pytest" and not re.search(r"::|(^|\s)-k(\s|$)", r["verify"]):  # not one test picked
            tests, canaries = plant(tests, r["expected"])
        workdir = prepared.workdir or getattr(pool.provider, "work_dir", "/work")
        in_tree: list = []
        if r["tests_dir"] != TESTS_DIR:  # SWE: the test files overwrite the repository's own
            base = posixpath.relpath(r["tests_dir"], workdir)
            if base.startswith(".."):
                raise ConfigError(f"task {r['task_id']}: tests_dir {r['tests_dir']} is outside the working "
                                  f"directory {workdir}")
            files = [(posixpath.normpath(posixpath.join(base, p)), "f", 0o644, t) for p, t in tests.items()]
            # A test the patch adds in a new directory needs it made first (it scored None for all).
            above = sorted({d for path, *_ in files for d in parents(path)}, key=lambda d: d.count("/"))
            in_tree = [(d, "d", 0o755, b"") for d in above] + files
            tests = {}
        env = {**r["env"], **VERIFY_ENV, **r["verify_env"]}
        if r["parser"] == "pytest":
            env["PYTEST_ADDOPTS"] = f"{env.get('PYTEST_ADDOPTS', '')} --junitxml={JUNIT}".strip()
        sandbox = await pool.checkout(prepared)
        broken = True
        try:
            await sandbox.use_environment(prepared)
            await sandbox.apply_changes(kept + in_tree)
            await sandbox.bring_tests(tests)
            result = await sandbox.run_verifier(r["verify"], timeout=r["verify_timeout"], env=env)
            reports = await sandbox.verifier_reports()
            broken = False
        except InfraError:
            if _ran_out(sandbox):  # the agent's code, run by the tests, left the memory charged
                return Outcome("failed", 0, 1, detail=RAN_OUT)
            raise
        except OSError as exc:  # the supervisor refused what the host sent: the sandbox is suspect
            raise InfraError(f"grading failed in sandbox {getattr(sandbox, 'id', '?')}: {exc}") from exc
        finally:
            pool.checkin(sandbox, broken=broken)
        return verdict(reports, result.exit_code, result.timed_out, r, refused, canaries)


@hookimpl
def trl_sandbox_register_tasks(register):
    register("agent", AgentTask())
