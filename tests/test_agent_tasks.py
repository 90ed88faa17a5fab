"""Agent tasks: the Dockerfile subset, Harbor / terminal-bench / SWE loaders, the built-in set.

Where a test asserts that something is absent (a hidden test not in the environment, a file not
copied), a positive control in the same test shows the check would see it when present. The
built-in oracles run in a bare bubblewrap box made here (not the project's grader): the unsolved
environment scores 0 and the solved one 1.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from trl_sandbox.agents.builtin_tasks import TASKS, write_builtin
from trl_sandbox.agents.columns import COLUMNS, MAP_COLUMNS, row_of
from trl_sandbox.agents.dockerfile import from_dockerfile
from trl_sandbox.agents.images import parse_image_map
from trl_sandbox.agents.load import agent_rows, load_agent_tasks
from trl_sandbox.environments.spec import parse
from trl_sandbox.sandbox import ConfigError

HOST = {"python:3.11-slim": "host"}


def build(text: str, context: Path | None = None, **kwargs):
    kwargs.setdefault("image_map", HOST)
    return from_dockerfile(text, context=context, **kwargs)


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


# ---------------------------------------------------------------- the Dockerfile subset

def test_the_common_instructions_become_an_environment(tmp_path):
    ctx = write(tmp_path, {"src/pkg/a.py": "A = 1\n", "run.sh": "#!/bin/sh\necho run\n", "notes.txt": "n\n"})
    (ctx / "run.sh").chmod(0o755)
    (ctx / "src" / "empty").mkdir()
    text = """# syntax=docker/dockerfile:1
ARG PY=3.11
FROM docker.io/library/python:${PY}-slim AS base
LABEL maintainer="x"
EXPOSE 8000
ENV A=1 B="two words"
ENV LEGACY the old form
WORKDIR /app
COPY src/ src/
COPY --chown=1000:1000 run.sh .
COPY --chmod=600 notes.txt docs/
RUN echo "$A" > a.txt \\
# a comment inside a continued instruction
 && echo done
RUN ["python3", "-c", "print('$A')"]
CMD ["sleep", "infinity"]
"""
    built = build(text, ctx)
    env = built.environment
    assert built.image == "docker.io/library/python:3.11-slim" and env["base"] == "host"
    assert env["workdir"] == built.workdir == "/app"
    assert env["files"] == {"src/pkg/a.py": "A = 1\n", "run.sh": "#!/bin/sh\necho run\n", "docs/notes.txt": "n\n"}
    exports = "export A=1 B='two words' LEGACY='the old form'"
    assert env["setup"] == [
        "mkdir -p -- src/empty",
        "chmod +x -- run.sh",
        "chmod 600 -- docs/notes.txt",
        f'{exports}\necho "$A" > a.txt  && echo done',
        f"{exports}\npython3 -c 'print('\"'\"'$A'\"'\"')'",
    ]
    assert built.env == {"A": "1", "B": "two words", "LEGACY": "the old form"}
    assert parse(env).workdir == "/app"  # what spec.parse takes


def test_env_reaches_only_later_run_lines_and_path_starts_from_dockers_default():
    built = build("FROM python:3.11-slim\nWORKDIR /app\nRUN first\nENV X=1\nRUN second\n"
                  "ENV PATH=/app/.venv/bin:$PATH Y=${X:-d}${Z:-z}${X:+set}\nRUN third\n")
    first, second, third = built.environment["setup"]
    assert first == "first"  # no ENV yet: nothing exported
    assert second == "export X=1\nsecond"  # positive control: the export appears once ENV is set
    assert built.env["PATH"] == "/app/.venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert built.env["Y"] == "1zset"
    assert third.startswith("export X=1 PATH=/app/.venv/bin:/usr/local/sbin")


def test_single_quotes_are_literal_and_arg_before_from_is_seen_by_from_only():
    built = build("ARG TAG=3.11-slim\nFROM python:$TAG\nARG LOCAL=v\nENV A='$LOCAL' B=\"$LOCAL\" C=$TAG\n"
                  "WORKDIR /app\n")
    assert built.image == "python:3.11-slim"
    assert built.env == {"A": "$LOCAL", "B": "v", "C": ""}
    redeclared = build("ARG TAG=3.11-slim\nFROM python:$TAG\nARG TAG\nENV C=$TAG\nWORKDIR /app\n")
    assert redeclared.env == {"C": "3.11-slim"}


def test_runs_under_another_workdir_change_directory_first():
    built = build("FROM python:3.11-slim\nRUN at-root\nWORKDIR /app/sub\nRUN in-sub\nWORKDIR /app\nRUN in-app\n")
    assert built.environment["workdir"] == "/app"
    assert built.environment["setup"] == ["cd / || exit 1\nat-root", "mkdir -p -- sub",
                                          "cd /app/sub || exit 1\nin-sub", "in-app"]


@pytest.mark.parametrize("instruction, words", [
    ("USER app", "line 3 (USER): USER is not supported: every command runs as the sandbox's one unprivileged user"),
    ("SHELL [\"/bin/bash\", \"-c\"]", "line 3 (SHELL): SHELL is not supported"),
    ("VOLUME /data", "line 3 (VOLUME): VOLUME is not supported"),
    ("HEALTHCHECK CMD true", "line 3 (HEALTHCHECK): HEALTHCHECK is not supported"),
    ("ONBUILD RUN x", "line 3 (ONBUILD): ONBUILD is not supported"),
    ("STOPSIGNAL SIGTERM", "line 3 (STOPSIGNAL): STOPSIGNAL is not supported"),
    ("FROBNICATE x", "line 3 (FROBNICATE): the instruction FROBNICATE is not supported"),
    ("CMD [\"nginx\", \"-g\", \"daemon off;\"]", "the sandbox starts no main process"),
    ("ENTRYPOINT /start-server.sh", "line 3 (ENTRYPOINT): ENTRYPOINT /start-server.sh is not supported"),
    ("RUN --mount=type=cache,target=/root/.cache pip install x", "RUN flags (--mount, --network, --security)"),
    ("FROM python:3.11-slim", "multi-stage builds (a second FROM) are not supported"),
    ("COPY --from=builder /out /app/out", "the flag --from is not supported: multi-stage builds are not supported"),
    ("RUN <<EOF\necho hi\nEOF", "heredocs (<<EOF) are not supported"),
    ("COPY <<-'EOF' /app/x\nhi\nEOF", "heredocs (<<EOF) are not supported"),
    ("ADD https://example.com/x.tar.gz /app/", "fetching from the network is not supported"),
    ("ADD data.tar.gz /app/", "ADD would unpack this archive"),
    ("COPY ../secret /app/", "is outside the build context"),
    ("COPY data.txt /etc/data.txt", "COPY puts a file at /etc/data.txt, outside the working directory /app"),
    ("WORKDIR /opt/tool\nWORKDIR /app", "makes a directory at /opt/tool, outside the working directory /app"),
])
def test_refused_instructions_name_the_line_and_say_why(tmp_path, instruction, words):
    write(tmp_path, {"data.txt": "d\n", "data.tar.gz": "not really\n"})
    text = f"FROM python:3.11-slim\nWORKDIR /app\n{instruction}\n"
    with pytest.raises(ConfigError) as caught:
        build(text, tmp_path)
    assert words in str(caught.value)
    assert "Dockerfile line" in str(caught.value)


def test_the_accepted_neighbours_of_refused_forms_pass(tmp_path):
    # Positive controls for the refusals above: a here-string is no heredoc, ADD of a local
    # file is a COPY, a keep-alive CMD is fine, `tail -f /dev/null` too.
    write(tmp_path, {"data.txt": "d\n"})
    built = build("FROM python:3.11-slim\nWORKDIR /app\nRUN cat <<< 'hi' > x\nADD data.txt .\n"
                  "CMD tail -f /dev/null\nENTRYPOINT [\"bash\"]\n", tmp_path)
    assert built.environment["files"] == {"data.txt": "d\n"}
    assert built.environment["setup"] == ["cat <<< 'hi' > x"]


def test_no_from_no_workdir_instruction_before_from_and_escape_directive():
    with pytest.raises(ConfigError, match="no FROM instruction"):
        build("# just a comment\n")
    with pytest.raises(ConfigError, match=r"line 1 \(RUN\): the first instruction must be FROM"):
        build("RUN x\nFROM python:3.11-slim\n")
    with pytest.raises(ConfigError, match=r"no WORKDIR; add `WORKDIR /app`"):
        build("FROM python:3.11-slim\nRUN x\n")
    assert build("FROM python:3.11-slim\nRUN x\n", default_workdir="/srv").workdir == "/srv"
    with pytest.raises(ConfigError, match="the escape directive '`' is not supported"):
        build("# escape=`\nFROM python:3.11-slim\n")


def test_an_unmapped_image_says_to_pass_image_map():
    with pytest.raises(ConfigError) as caught:
        build("FROM ubuntu:22.04\nWORKDIR /app\n")
    assert "the image 'ubuntu:22.04' is not in the image map; pass --image-map NAME=host|oci:PATH" in str(caught.value)
    assert "line 1 (FROM)" in str(caught.value)
    assert build("FROM ubuntu:22.04\nWORKDIR /app\n", image_map={"*": "host"}).environment["base"] == "host"
    oci = build("FROM ubuntu:22.04\nWORKDIR /app\n", image_map=parse_image_map(["docker.io/ubuntu:22.04=oci:/img:t"]))
    assert oci.environment["base"] == "oci:/img:t"
    with pytest.raises(ConfigError, match="is not NAME=host or NAME=oci:PATH"):
        parse_image_map(["ubuntu"])
    with pytest.raises(ConfigError, match="neither 'host', 'oci:PATH"):
        parse_image_map({"ubuntu": "docker"})


def test_copy_refuses_symlinks_and_binary_files_and_honours_dockerignore(tmp_path):
    write(tmp_path, {"keep.py": "k\n", "skip.log": "s\n", "build/out.txt": "o\n", ".dockerignore": "*.log\nbuild\n"})
    built = build("FROM python:3.11-slim\nWORKDIR /app\nCOPY . .\n", tmp_path)
    assert "keep.py" in built.environment["files"]  # positive control: a kept file is copied
    assert not {"skip.log", "build/out.txt"} & set(built.environment["files"])
    (tmp_path / "blob.bin").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="blob.bin is a binary file"):
        build("FROM python:3.11-slim\nWORKDIR /app\nCOPY blob.bin .\n", tmp_path)
    (tmp_path / "link").symlink_to("/etc/passwd")
    with pytest.raises(ConfigError, match="is a symlink"):
        build("FROM python:3.11-slim\nWORKDIR /app\nCOPY link .\n", tmp_path)
    with pytest.raises(ConfigError, match="must be a directory ending in '/'"):
        build("FROM python:3.11-slim\nWORKDIR /app\nCOPY keep.py .dockerignore dest\n", tmp_path)
    with pytest.raises(ConfigError, match="'skip.log' is excluded by the context's .dockerignore"):
        build("FROM python:3.11-slim\nWORKDIR /app\nCOPY skip.log .\n", tmp_path)


def bwrap_works() -> bool:
    if shutil.which("bwrap") is None:
        return False
    try:
        return subprocess.run(box_argv({}, "/app", "true"), capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def box_argv(binds: dict[str, Path], workdir: str, command: str) -> list[str]:
    """A bare bubblewrap box: the host's /usr read-only, ``binds`` writable, no network."""
    argv = ["bwrap", "--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
            "--unshare-all", "--die-with-parent", "--clearenv", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin",
            "--setenv", "HOME", "/tmp", "--setenv", "LANG", "C.UTF-8"]
    for name in ("bin", "lib", "lib64", "sbin"):
        if os.path.islink(f"/{name}"):
            argv += ["--symlink", os.readlink(f"/{name}"), f"/{name}"]
        elif os.path.isdir(f"/{name}"):
            argv += ["--ro-bind", f"/{name}", f"/{name}"]
    for target, source in binds.items():
        argv += ["--bind", str(source), target]
    if workdir not in binds:
        argv += ["--dir", workdir]
    return argv + ["--chdir", workdir, "/bin/sh", "-c", command]


def prepare(row: dict, root: Path) -> Path:
    """The row's environment built as the project's builder would: files, then each setup command."""
    env = row["environment"]
    tree = root / "tree"
    for rel, text in env["files"].items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    tree.mkdir(parents=True, exist_ok=True)
    for command in env["setup"]:
        done = subprocess.run(box_argv({env["workdir"]: tree}, env["workdir"], command), capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, (command, done.stderr)
    return tree


def verdict(row: dict, tree: Path, root: Path) -> str:
    tests, logs = root / "tests", root / "logs"
    for rel, text in row["tests"].items():
        (tests / rel).parent.mkdir(parents=True, exist_ok=True)
        (tests / rel).write_text(text)
    logs.mkdir()
    workdir = row["environment"]["workdir"]
    subprocess.run(box_argv({workdir: tree, row["tests_dir"]: tests, "/logs": logs}, workdir, row["verify"]),
                   capture_output=True, timeout=row["verify_timeout"])
    reward = logs / "verifier" / "reward.txt"
    return reward.read_text().strip() if reward.exists() else "missing"


needs_bwrap = pytest.mark.skipif(not bwrap_works(), reason="bubblewrap cannot make a box here")


@needs_bwrap
def test_the_rendered_setup_does_what_the_dockerfile_says(tmp_path):
    ctx = write(tmp_path / "ctx", {"tool.sh": "#!/bin/sh\necho tool\n"})
    (ctx / "tool.sh").chmod(0o755)
    built = build("FROM python:3.11-slim\nWORKDIR /app\nENV GREETING=\"hello world\"\nCOPY tool.sh bin/\n"
                  "WORKDIR sub\nRUN echo \"$GREETING\" > here.txt && pwd > where.txt\nWORKDIR /app\n"
                  "RUN [\"sh\", \"-c\", \"./bin/tool.sh > out.txt\"]\n", ctx)
    tree = prepare({"environment": built.environment}, tmp_path / "box")
    assert (tree / "sub" / "here.txt").read_text() == "hello world\n"
    assert (tree / "sub" / "where.txt").read_text() == "/app/sub\n"
    assert (tree / "out.txt").read_text() == "tool\n"


# ---------------------------------------------------------------- Harbor and terminal-bench

HARBOR = {
    "task.toml": "version = \"1.0\"\n[agent]\ntimeout_sec = 120.0\n[verifier]\ntimeout_sec = 30.0\n"
                 "env = { MODE = \"strict\" }\n[environment]\nbuild_timeout_sec = 200.0\n",
    "instruction.md": "Make hello.txt say hello.\n",
    "environment/Dockerfile": "FROM ubuntu:22.04\nWORKDIR /app\nCOPY app/ ./\nRUN touch made\n",
    "environment/app/start.txt": "start\n",
    "tests/test.sh": "#!/bin/bash\ngrep -q hello /app/hello.txt && echo 1 > /logs/verifier/reward.txt\n",
    "tests/test_outputs.py": "def test_hello():\n    assert open('/app/hello.txt').read() == 'hello\\n'  # hidden\n",
    "solution/solve.sh": "#!/bin/bash\necho hello > hello.txt\n",
    "solution/data.txt": "extra\n",
}


def test_a_harbor_task_directory_is_one_row(tmp_path):
    write(tmp_path / "say-hello", HARBOR)
    write(tmp_path / "not-a-task", {"README.md": "x\n"})
    with pytest.raises(ConfigError, match="the image 'ubuntu:22.04' is not in the image map"):
        agent_rows(tmp_path)
    [row] = agent_rows(tmp_path, image_map=["ubuntu:22.04=host"])
    assert row["task_id"] == "say-hello" and row["prompt"] == "Make hello.txt say hello.\n"
    assert row["sandbox_task"] == "agent"
    assert row["environment"] == {"files": {"start.txt": "start\n"}, "setup": ["touch made"], "base": "host",
                                  "workdir": "/app", "setup_network": False, "setup_timeout": 200.0}
    assert set(row["tests"]) == {"test.sh", "test_outputs.py"}  # positive control: the tests are carried
    assert "# hidden" in json.dumps(row["tests"]) and "# hidden" not in json.dumps(row["environment"])
    assert (row["tests_dir"], row["verify"], row["parser"]) == ("/tests", "bash /tests/test.sh", "reward_file")
    assert row["verify_env"] == {"MODE": "strict"}
    assert (row["agent_timeout"], row["verify_timeout"]) == (120.0, 30.0)
    assert row["solution"] == HARBOR["solution/solve.sh"] and row["solution_files"] == {"data.txt": "extra\n"}
    assert row["protected"] == [] and row["expected"] == []


def test_harbor_prebuilt_image_and_what_a_harbor_task_must_have(tmp_path):
    task = write(tmp_path / "prebuilt", {**HARBOR, "task.toml": "[environment]\ndocker_image = \"ghcr.io/x/y:1\"\n"})
    (task / "environment" / "Dockerfile").write_text("FROM ubuntu:22.04\nWORKDIR /srv/work\nRUN never\n")
    [row] = agent_rows(task, image_map={"ghcr.io/x/y:1": "oci:/images/y"})
    assert row["environment"] == {"base": "oci:/images/y", "workdir": "/srv/work", "setup_timeout": 600.0,
                                  "setup_network": False}
    assert (row["agent_timeout"], row["verify_timeout"]) == (600.0, 600.0)
    (task / "tests" / "test.sh").unlink()
    with pytest.raises(ConfigError, match="no tests/test.sh"):
        agent_rows(task, image_map={"*": "host"})
    write(task, {"tests/test.sh": "true\n"})
    (task / "instruction.md").write_text("  \n")
    with pytest.raises(ConfigError, match="no instruction.md"):
        agent_rows(task, image_map={"*": "host"})
    (task / "instruction.md").write_text("do it\n")
    write(task, {"environment/docker-compose.yaml": "services:\n  main: {}\n  db: {}\n"})
    with pytest.raises(ConfigError, match=r"the task needs 2 services \(main, db\)"):
        agent_rows(task, image_map={"*": "host"})


def test_a_hidden_test_copied_into_the_environment_is_refused(tmp_path):
    leaked = "def test_answer():\n    assert open('/app/answer.txt').read() == '42\\n'  # the expected answer\n"
    task = write(tmp_path / "leaky", {**HARBOR, "tests/test_answer.py": leaked,
                                      "environment/app/test_answer.py": leaked})
    with pytest.raises(ConfigError, match="the hidden test test_answer.py is also in the environment as "
                                          "test_answer.py, in the agent's reach"):
        agent_rows(task, image_map={"*": "host"})
    (task / "environment" / "app" / "test_answer.py").write_text(leaked.replace("42", "41"))
    assert agent_rows(task, image_map={"*": "host"})  # positive control: a different file passes


TBENCH = {
    "task.yaml": "instruction: |\n  Count the lines of data.csv into count.txt.\nparser_name: pytest\n"
                 "max_agent_timeout_sec: 200\nmax_test_timeout_sec: 20\n",
    "Dockerfile": "FROM ghcr.io/laude-institute/t-bench/python-3-13:20250620\nWORKDIR /app\nCOPY . /app\n",
    "docker-compose.yaml": "services:\n  client:\n    build: .\n",
    "data.csv": "a,b\n1,2\n",
    "run-tests.sh": "#!/bin/bash\npython3 -m pytest $TEST_DIR/test_outputs.py -rA\n",
    "tests/test_outputs.py": "def test_count():\n    assert open('/app/count.txt').read().strip() == '2'  # hidden\n",
    "solution.sh": "#!/bin/bash\nwc -l < data.csv > count.txt\n",
}


def test_a_terminal_bench_task_directory_is_one_row(tmp_path):
    write(tmp_path / "count-lines", TBENCH)
    [row] = agent_rows(tmp_path, image_map=["ghcr.io/laude-institute/t-bench/python-3-13:20250620=host"])
    assert row["task_id"] == "count-lines" and row["prompt"] == "Count the lines of data.csv into count.txt.\n"
    files = row["environment"]["files"]
    assert "data.csv" in files and "Dockerfile" in files  # positive control: COPY . copied the context
    assert not {"run-tests.sh", "tests/test_outputs.py", "solution.sh", "task.yaml"} & set(files)
    assert set(row["tests"]) == {"run-tests.sh", "test_outputs.py"}
    assert (row["verify"], row["verify_env"], row["parser"]) == ("bash /tests/run-tests.sh", {"TEST_DIR": "/tests"},
                                                                 "pytest")
    assert (row["agent_timeout"], row["verify_timeout"]) == (200.0, 20.0)
    assert row["solution"] == TBENCH["solution.sh"]
    (tmp_path / "count-lines" / "Dockerfile").write_text("FROM x\nWORKDIR /app\nCOPY tests/ /app/tests/\n")
    with pytest.raises(ConfigError, match="which the task keeps hidden from the agent"):
        agent_rows(tmp_path, image_map={"*": "host"})


# ---------------------------------------------------------------- SWE rows

def git(repo: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


@pytest.fixture
def swe_repo(tmp_path):
    repo = write(tmp_path / "repo", {
        "calc/__init__.py": "",
        "calc/ops.py": "def add(a, b):\n    return a - b\n",
        "tests/test_ops.py": "from calc.ops import add\n\n\ndef test_zero():\n    assert add(0, 0) == 0\n",
        "run.sh": "#!/bin/sh\necho run\n",
    })
    (repo / "run.sh").chmod(0o755)
    (repo / "link.py").symlink_to("calc/ops.py")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    base = git(repo, "rev-parse", "HEAD")
    (repo / "tests" / "test_ops.py").write_text("from calc.ops import add\n\n\ndef test_zero():\n"
                                                "    assert add(0, 0) == 0\n\n\ndef test_add():\n"
                                                "    assert add(2, 3) == 5\n")
    patch = git(repo, "diff") + "\n"
    git(repo, "checkout", "-q", "--", ".")
    (repo / "calc" / "ops.py").write_text("def add(a, b):\n    return a + b\n")
    gold = git(repo, "diff") + "\n"
    git(repo, "checkout", "-q", "--", ".")
    return {"instance_id": "calc-1", "repo": str(repo), "base_commit": base, "problem_statement": "add subtracts",
            "test_patch": patch, "patch": gold, "FAIL_TO_PASS": json.dumps(["tests/test_ops.py::test_add"]),
            "PASS_TO_PASS": ["tests/test_ops.py::test_zero"]}


def test_a_swe_row_reads_the_repository_at_its_commit_and_keeps_the_test_patch_hidden(swe_repo):
    [row] = agent_rows([swe_repo])
    env = row["environment"]
    assert row["task_id"] == "calc-1" and row["prompt"] == "add subtracts" and env["workdir"] == "/testbed"
    assert env["files"]["calc/ops.py"] == "def add(a, b):\n    return a - b\n"
    assert "test_add" not in env["files"]["tests/test_ops.py"]  # the environment has the test file before the patch
    assert "def test_add" in row["tests"]["tests/test_ops.py"]  # positive control: the patched file is a hidden test
    assert "test_add" not in json.dumps(env)
    assert row["tests_dir"] == "/testbed" and row["protected"] == ["tests/test_ops.py"]
    assert row["expected"] == ["tests/test_ops.py::test_add", "tests/test_ops.py::test_zero"]
    assert row["verify"] == "python3 -m pytest -rA -p no:cacheprovider tests/test_ops.py"
    assert row["parser"] == "pytest"
    assert env["setup"][0] == "chmod +x -- run.sh"
    assert any("ln -sfn -- calc/ops.py link.py" in step for step in env["setup"])
    assert "git init -q" in env["setup"][-1]
    assert row["solution"].startswith("git apply --whitespace=nowarn - <<'TRL_SANDBOX_PATCH_END'\n")


def test_swe_rows_refuse_what_they_cannot_carry(swe_repo):
    with pytest.raises(ConfigError, match="must be the path of a local git repository"):
        agent_rows([{**swe_repo, "repo": "/nonexistent"}])
    with pytest.raises(ConfigError, match="rev-parse --verify failed"):
        agent_rows([{**swe_repo, "base_commit": "0" * 40}])
    with pytest.raises(ConfigError, match="not all pytest ids"):
        agent_rows([{**swe_repo, "FAIL_TO_PASS": ["test_add (tests.TestOps)"]}])
    assert agent_rows([{**swe_repo, "FAIL_TO_PASS": ["test_add (tests.TestOps)"], "verify": "python3 -m unittest"}])
    broken = swe_repo["test_patch"].replace("assert add(0, 0) == 0", "assert add(9, 9) == 0")
    with pytest.raises(ConfigError, match="test_patch does not apply at base_commit"):
        agent_rows([{**swe_repo, "test_patch": broken}])
    repo = Path(swe_repo["repo"])
    (repo / "logo.png").write_bytes(b"\x89PNG\xff\x00")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "logo")
    head = {**swe_repo, "base_commit": git(repo, "rev-parse", "HEAD")}
    with pytest.raises(ConfigError, match="logo.png is a binary file.*binary_files='skip'"):
        agent_rows([head])
    [row] = agent_rows([head], binary_files="skip")
    assert "logo.png" not in row["environment"]["files"] and "calc/ops.py" in row["environment"]["files"]


# ---------------------------------------------------------------- rows, datasets, the built-in set

def test_rows_are_checked_and_the_dataset_carries_map_columns_as_json(tmp_path):
    [row] = agent_rows([{"task_id": "t", "prompt": "p", "environment": {"workdir": "/app"}, "verify": "true",
                         "tests": {"t.sh": "true\n"}}])
    assert row["parser"] == "exit_code" and row["tests_dir"] == "/tests" and list(row) == list(COLUMNS)
    for bad, words in [({"verify": ""}, "missing column(s) ['verify']"),
                       ({"parser": "magic"}, "parser='magic'; use one of reward_file, pytest, exit_code"),
                       ({"tests": {"/etc/x": "y"}}, "tests: '/etc/x' must be a relative path"),
                       ({"agent_timeout": 0}, "agent_timeout must be a positive number"),
                       ({"environment": {"wat": 1}}, "environment: unknown field(s) ['wat']")]:
        with pytest.raises(ConfigError) as caught:
            row_of({**row, **bad})
        assert words in str(caught.value)
    with pytest.raises(ConfigError, match="two tasks are named 't'"):
        agent_rows([row, row])
    with pytest.raises(ConfigError, match=r"unknown task id\(s\) \['nope'\]"):
        agent_rows([row], task_ids=["nope"])
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    dataset = load_agent_tasks(path)
    assert all(isinstance(dataset[0][c], str) for c in MAP_COLUMNS)
    assert row_of(dataset[0]) == row


def test_the_builtin_set_loads_and_its_hidden_tests_never_reach_the_environment():
    rows = agent_rows("builtin")
    assert sorted(r["task_id"] for r in rows) == sorted(TASKS) and len(rows) == 3
    for row in rows:
        assert row["environment"]["base"] == "host" and row["environment"]["workdir"] == "/app"
        assert row["solution"] and "test.sh" in row["tests"]
        files = row["environment"]["files"]
        environment = "\n".join([*files, *files.values(), *row["environment"]["setup"]])  # raw text, not JSON
        hidden = [rel for rel in row["tests"] if rel != "test.sh"]
        assert hidden  # positive control: each task has hidden test code
        for rel in hidden:
            assert rel not in environment and row["tests"][rel][:80] not in environment
        visible = next(iter(files.values()))
        assert visible[:40] in environment  # positive control: the same search finds a file that is there
    venv = next(r for r in rows if r["task_id"] == "venv-wordcount")
    assert venv["environment"]["setup"][0] == "python3 -m venv --without-pip .venv"
    assert venv["env"]["PATH"].startswith("/app/.venv/bin:")
    dataset = load_agent_tasks("builtin", task_ids=["fix-median"])
    assert dataset.num_rows == 1 and dataset[0]["sandbox_task"] == "agent"


def test_write_builtin_makes_harbor_directories_the_loader_reads(tmp_path):
    paths = write_builtin(tmp_path)
    assert sorted(p.name for p in paths) == sorted(TASKS)
    assert os.access(tmp_path / "fix-median" / "tests" / "test.sh", os.X_OK)
    from_disk = agent_rows(tmp_path, image_map={"python:3.11-slim": "host"})
    assert from_disk == agent_rows("builtin")


@needs_bwrap
@pytest.mark.parametrize("task_id", sorted(TASKS))
def test_each_builtin_oracle_passes_and_the_unsolved_environment_fails(tmp_path, task_id):
    [row] = agent_rows("builtin", task_ids=[task_id])
    unsolved = prepare(row, tmp_path / "unsolved")
    assert verdict(row, unsolved, tmp_path / "unsolved") == "0"
    solved = prepare(row, tmp_path / "solved")
    write(tmp_path / "solution", {"solve.sh": row["solution"]})
    done = subprocess.run(box_argv({"/app": solved, "/solution": tmp_path / "solution"}, "/app",
                                   "bash /solution/solve.sh"), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert verdict(row, solved, tmp_path / "solved") == "1"


@needs_bwrap
def test_the_builtin_environments_build_with_the_local_provider_and_the_oracles_solve_them():
    # The project's own builder (the sandbox's unprivileged uid, a copy-on-write lease at /app),
    # not the bare box above. The hidden tests are run from the lease's /tmp only to read a
    # verdict here: grading out of the agent's reach is not this test's subject.
    import shlex
    import tempfile

    from trl_sandbox.environments.cache import remove_tree
    from trl_sandbox.pool.sandbox_pool import SandboxPool

    runner = {"fix-median": "python3 -I /tmp/tests/run_tests.py",
              "error-digest": "python3 /tmp/tests/test_outputs.py",
              "venv-wordcount": "python3 /tmp/tests/test_wordcount.py"}
    cache = Path(tempfile.mkdtemp(prefix="trl-sandbox-agents-", dir="/var/tmp"))
    os.chmod(cache, 0o755)
    try:
        with SandboxPool.open("local", size=1, settings={"environment_cache": str(cache)}) as pool:
            for row in agent_rows("builtin"):
                place = " && ".join(f"printf %s {shlex.quote(text)} > {shlex.quote(rel)}"
                                    for rel, text in row["tests"].items() if rel != "test.sh")
                for solve, want in ((False, 1), (True, 0)):
                    oracle = f"bash -c {shlex.quote(row['solution'])} && " if solve else ""
                    script = f"mkdir -p /tmp/tests && cd /tmp/tests && {place} && cd /app && {oracle}{runner[row['task_id']]}"
                    result = pool.run(["/bin/sh", "-c", script], timeout=60, environment=parse(row["environment"]))
                    assert result.exit_code == want, (row["task_id"], solve, result.stdout, result.stderr)
    finally:
        remove_tree(cache)
