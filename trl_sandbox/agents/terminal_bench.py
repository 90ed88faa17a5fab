"""terminal-bench 0.2 task directories as agent rows (``trl_sandbox.agents.columns``).

A terminal-bench task is a directory::

    NAME/
      task.yaml            instruction, max_agent_timeout_sec, max_test_timeout_sec, parser_name
      Dockerfile           the environment; its build context is the task directory itself
      docker-compose.yaml  one service (more are refused)
      run-tests.sh         the verifier, run from /tests after the agent
      tests/...            the hidden tests (test_outputs.py, ...)
      solution.sh          the oracle (a solution.yaml of keystrokes is not read: no oracle then)

What the row gets: ``task_id`` = NAME; ``prompt`` = ``instruction`` (or, in older tasks, the
``base`` entry of ``descriptions``); ``environment`` from the Dockerfile, which may ``COPY``
anything of the task directory except its tests, ``run-tests.sh``, the solution and the task's
own configuration (a ``COPY`` that names one is refused, ``COPY . /app`` skips them);
``tests`` = ``run-tests.sh`` and the files of ``tests/``, placed at ``/tests`` as terminal-bench
does; ``verify`` = ``bash /tests/run-tests.sh`` with ``TEST_DIR=/tests``; ``parser`` =
``parser_name`` (``pytest``: the verdict is the verifier's test report); timeouts from
``max_agent_timeout_sec`` and ``max_test_timeout_sec`` (terminal-bench's defaults, 360 and 60 s).
terminal-bench's harness adds its own helper scripts (``setup-uv-pytest.sh``, which downloads uv)
to ``/tests``; they are not part of the task directory and are not added here: a
``run-tests.sh`` that sources them needs them copied into the task's ``tests/``, working offline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trl_sandbox.agents.columns import AGENT_TASK, TESTS_DIR
from trl_sandbox.agents.dockerfile import from_dockerfile
from trl_sandbox.agents.harbor import one_service, read_tree, seconds
from trl_sandbox.sandbox import TASK_COLUMN, ConfigError

AGENT_TIMEOUT = 360.0
TEST_TIMEOUT = 60.0
HIDDEN = ("tests", "run-tests.sh", "solution.sh", "solution.yaml", "task.yaml", "docker-compose.yaml",
          "docker-compose.yml")
PARSERS = {"pytest": "pytest"}  # terminal-bench's parser_name -> the row's parser


def is_terminal_bench_task(path: Path) -> bool:
    return (path / "task.yaml").is_file()


def terminal_bench_row(task_dir: str | Path, *, image_map: dict[str, str],
                       setup_network: bool = False) -> dict[str, Any]:
    """One terminal-bench task directory as an agent row (unchecked: ``columns.row_of`` checks it)."""
    import yaml

    task_dir = Path(task_dir)
    name = task_dir.name
    try:
        config = yaml.safe_load((task_dir / "task.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{task_dir / 'task.yaml'}: not readable YAML ({exc})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{task_dir / 'task.yaml'}: expected a mapping with an instruction")
    instruction = config.get("instruction")
    if not instruction:
        base = [d for d in config.get("descriptions") or [] if isinstance(d, dict) and d.get("key") == "base"]
        instruction = base[0].get("description") if base else None
    if not isinstance(instruction, str) or not instruction.strip():
        raise ConfigError(f"{task_dir / 'task.yaml'}: no instruction; write the task's prompt as `instruction: |`")
    parser_name = config.get("parser_name") or "pytest"
    if parser_name not in PARSERS:
        raise ConfigError(f"{task_dir / 'task.yaml'}: parser_name={parser_name!r} is not supported; "
                          f"use one of {', '.join(PARSERS)}")
    if not (task_dir / "run-tests.sh").is_file():
        raise ConfigError(f"{task_dir}: no run-tests.sh; terminal-bench's verifier runs it from /tests")
    if not (task_dir / "Dockerfile").is_file():
        raise ConfigError(f"{task_dir}: no Dockerfile (the task's environment)")
    one_service(task_dir / "docker-compose.yaml")
    one_service(task_dir / "docker-compose.yml")
    built = from_dockerfile((task_dir / "Dockerfile").read_text(encoding="utf-8"), image_map=image_map,
                            context=task_dir, setup_network=setup_network, source=f"{name}/Dockerfile",
                            hidden=HIDDEN)
    tests = read_tree(task_dir / "tests", f"{name}/tests") if (task_dir / "tests").is_dir() else {}
    if "run-tests.sh" in tests:
        raise ConfigError(f"{task_dir}: tests/run-tests.sh would replace the task's run-tests.sh at /tests")
    tests["run-tests.sh"] = (task_dir / "run-tests.sh").read_text(encoding="utf-8")
    solution = task_dir / "solution.sh"
    return {
        "task_id": name,
        "prompt": instruction,
        TASK_COLUMN: AGENT_TASK,
        "environment": built.environment,
        "env": built.env,
        "tests": tests,
        "tests_dir": TESTS_DIR,
        "verify": f"bash {TESTS_DIR}/run-tests.sh",
        "verify_env": {"TEST_DIR": TESTS_DIR},
        "parser": PARSERS[parser_name],
        "protected": [],
        "expected": [],
        "agent_timeout": seconds(config.get("max_agent_timeout_sec"), AGENT_TIMEOUT,
                                 f"{task_dir}/task.yaml max_agent_timeout_sec"),
        "verify_timeout": seconds(config.get("max_test_timeout_sec"), TEST_TIMEOUT,
                                  f"{task_dir}/task.yaml max_test_timeout_sec"),
        "solution": solution.read_text(encoding="utf-8") if solution.is_file() else None,
        "solution_files": {},
    }
