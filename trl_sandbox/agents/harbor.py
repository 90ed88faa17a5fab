"""Harbor task directories as agent rows (``trl_sandbox.agents.columns``).

A Harbor task is a directory::

    NAME/
      task.toml          [agent] timeout_sec, [verifier] timeout_sec and env, [environment] docker_image,
                         workdir, build_timeout_sec
      instruction.md     the prompt
      environment/       Dockerfile and the files it COPYs (the build context)
      tests/test.sh      the verifier; writes /logs/verifier/reward.txt (or reward.json)
      tests/...          whatever test.sh uses
      solution/solve.sh  the oracle (optional), with any files beside it

What the row gets: ``task_id`` = NAME; ``prompt`` = ``instruction.md``; ``environment`` from
``environment/Dockerfile`` (``agents.dockerfile``) or, when ``[environment] docker_image`` names a
prebuilt image, that image through the image map with nothing to set up (the image is the built
environment: its Dockerfile, if any, is not run again); ``tests`` = every file of ``tests/``, handed
to the verifier at ``/tests`` as Harbor does; ``verify`` = ``bash /tests/test.sh``;
``parser`` = ``reward_file``; timeouts from ``task.toml`` (Harbor's defaults, 600 s, otherwise).
An ``environment/docker-compose.yaml`` with more than one service is refused (one sandbox per task).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from trl_sandbox.agents.columns import AGENT_TASK, TESTS_DIR, relative_path
from trl_sandbox.agents.dockerfile import from_dockerfile
from trl_sandbox.agents.dockerfile_syntax import logical_lines, words
from trl_sandbox.agents.images import resolve
from trl_sandbox.sandbox import TASK_COLUMN, ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DEFAULT_TIMEOUT = 600.0  # Harbor's default for [agent] and [verifier] timeout_sec
DEFAULT_WORKDIR = "/app"  # a prebuilt image's working directory when task.toml names none: Harbor's convention


def is_harbor_task(path: Path) -> bool:
    return (path / "task.toml").is_file()


def read_tree(top: Path, what: str, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """``{relative path: text}`` of every file under ``top``: text only, no symlinks."""
    out: dict[str, str] = {}
    for path in sorted(top.rglob("*")):
        rel = path.relative_to(top).as_posix()
        if rel in skip or any(rel.startswith(s + "/") for s in skip) or "__pycache__" in path.parts:
            continue
        if path.is_symlink():
            raise ConfigError(f"{what}: {rel} is a symlink; give regular files")
        if path.is_dir():
            continue
        try:
            out[relative_path(rel, what)] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise ConfigError(f"{what}: {rel} is a binary file; the row carries text files only") from None
    return out


def one_service(compose: Path) -> None:
    """A docker-compose file with several services cannot be one sandbox."""
    if not compose.is_file():
        return
    import yaml

    try:
        services = (yaml.safe_load(compose.read_text(encoding="utf-8")) or {}).get("services") or {}
    except (yaml.YAMLError, AttributeError) as exc:
        raise ConfigError(f"{compose}: not a readable docker-compose file ({exc})") from None
    if len(services) > 1:
        raise ConfigError(f"{compose}: the task needs {len(services)} services ({', '.join(services)}); an agent task "
                          "runs in one sandbox, so tasks with side services are not supported")


def seconds(value: Any, default: float, what: str) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{what} must be a positive number of seconds, not {value!r}")
    return float(value)


def last_workdir(dockerfile: Path) -> str | None:
    """The last ``WORKDIR`` of a Dockerfile (for a prebuilt image built from it), if it names one."""
    found = None
    for line in logical_lines(dockerfile.read_text(encoding="utf-8"), str(dockerfile)):
        if line.keyword == "WORKDIR":
            parts = words(line, line.args, lambda name: None)
            if len(parts) == 1 and parts[0].startswith("/"):
                found = parts[0]
    return found


def harbor_row(task_dir: str | Path, *, image_map: dict[str, str], setup_network: bool = False) -> dict[str, Any]:
    """One Harbor task directory as an agent row (unchecked: ``columns.row_of`` checks it)."""
    task_dir = Path(task_dir)
    name = task_dir.name
    try:
        config = tomllib.loads((task_dir / "task.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{task_dir / 'task.toml'}: not readable TOML ({exc})") from None
    agent, verifier, env_config = (config.get(k) or {} for k in ("agent", "verifier", "environment"))
    instruction = task_dir / "instruction.md"
    if not instruction.is_file() or not instruction.read_text(encoding="utf-8").strip():
        raise ConfigError(f"{task_dir}: no instruction.md (the prompt); write the task's instruction there")
    tests_dir = task_dir / "tests"
    if not (tests_dir / "test.sh").is_file():
        raise ConfigError(f"{task_dir}: no tests/test.sh; Harbor's verifier runs it and reads "
                          "/logs/verifier/reward.txt (or reward.json) it writes")
    environment_dir = task_dir / "environment"
    one_service(environment_dir / "docker-compose.yaml")
    one_service(environment_dir / "docker-compose.yml")
    dockerfile = environment_dir / "Dockerfile"
    workdir = env_config.get("workdir")
    setup_timeout = seconds(env_config.get("build_timeout_sec"), DEFAULT_TIMEOUT,
                            f"{task_dir}/task.toml [environment] build_timeout_sec")
    env: dict[str, str] = {}
    if env_config.get("docker_image"):
        image = str(env_config["docker_image"])
        base = resolve(image, image_map, f"{task_dir}/task.toml [environment] docker_image")
        workdir = workdir or (last_workdir(dockerfile) if dockerfile.is_file() else None) or DEFAULT_WORKDIR
        environment = {"base": base, "workdir": workdir, "setup_timeout": setup_timeout,
                       "setup_network": setup_network}
    elif dockerfile.is_file():
        built = from_dockerfile(dockerfile.read_text(encoding="utf-8"), image_map=image_map, context=environment_dir,
                                default_workdir=workdir, setup_timeout=setup_timeout, setup_network=setup_network,
                                source=f"{name}/environment/Dockerfile")
        environment, env = built.environment, built.env
    else:
        raise ConfigError(f"{task_dir}: no environment/Dockerfile and no [environment] docker_image in task.toml; "
                          "give one of them")
    verify_env = {str(k): str(v) for k, v in (verifier.get("env") or {}).items()}
    solution_dir = task_dir / "solution"
    solution_files = read_tree(solution_dir, f"{name}/solution") if solution_dir.is_dir() else {}
    solution = solution_files.pop("solve.sh", None)
    return {
        "task_id": name,
        "prompt": instruction.read_text(encoding="utf-8"),
        TASK_COLUMN: AGENT_TASK,
        "environment": environment,
        "env": env,
        "tests": read_tree(tests_dir, f"{name}/tests"),
        "tests_dir": TESTS_DIR,
        "verify": f"bash {TESTS_DIR}/test.sh",
        "verify_env": verify_env,
        "parser": "reward_file",
        "protected": [],
        "expected": [],
        "agent_timeout": seconds(agent.get("timeout_sec"), DEFAULT_TIMEOUT, f"{task_dir}/task.toml [agent] timeout_sec"),
        "verify_timeout": seconds(verifier.get("timeout_sec"), DEFAULT_TIMEOUT,
                                  f"{task_dir}/task.toml [verifier] timeout_sec"),
        "solution": solution,
        "solution_files": solution_files,
    }
