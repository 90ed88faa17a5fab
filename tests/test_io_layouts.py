"""I/O-style rows: our columns and each published layout, read as published (host side only)."""

from __future__ import annotations

import base64
import io
import json
import pickle
import zlib

import pytest

from trl_sandbox import ConfigError
from trl_sandbox.judge.io_compare import same_output
from trl_sandbox.judge.languages import Language, LanguageTable, check_toolchain, languages
from trl_sandbox.tasks.generic import GenericTask
from trl_sandbox.tasks.io import IOTask, program_code
from trl_sandbox.tasks.io_layouts import decode_livecodebench, io_task_of, layout_of

PAIRS = (("1 2\n", "3\n"), ("5 7\n", "12\n"))


def _lcb_private(tests) -> str:
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()


ROWS = {
    "io": {"task_id": "a", "tests": [{"input": i, "output": o} for i, o in PAIRS]},
    "io-json": {"task_id": "a", "tests": json.dumps([{"input": i, "output": o} for i, o in PAIRS])},
    "apps": {"problem_id": 1, "task_id": "a", "input_output": json.dumps({"inputs": [i for i, _ in PAIRS],
                                                                           "outputs": [o for _, o in PAIRS]})},
    "code_contests": {"name": "x", "task_id": "a", "public_tests": {"input": [PAIRS[0][0]], "output": [PAIRS[0][1]]},
                      "private_tests": {"input": [PAIRS[1][0]], "output": [PAIRS[1][1]]},
                      "generated_tests": {"input": [], "output": []},
                      "time_limit": {"seconds": 3, "nanos": 500000000}, "memory_limit_bytes": 128 << 20},
    "livecodebench": {"task_id": "a", "public_test_cases": json.dumps([{"input": PAIRS[0][0], "output": PAIRS[0][1],
                                                                         "testtype": "stdin"}]),
                      "private_test_cases": _lcb_private([{"input": PAIRS[1][0], "output": PAIRS[1][1],
                                                           "testtype": "stdin"}])},
    "verification_info": {"task_id": "a", "verification_info": json.dumps(
        {"language": "cpp", "test_cases": [{"input": i, "output": o, "type": "stdin_stdout"} for i, o in PAIRS]})},
    "deepcoder": {"task_id": "a", "tests": [{"input": i, "output": o, "testtype": "stdin"} for i, o in PAIRS]},
    "deepcoder-taco": {"task_id": "a", "tests": json.dumps({"inputs": [i for i, _ in PAIRS],
                                                            "outputs": [o for _, o in PAIRS]})},
    "codeforces": {"task_id": "a", "official_tests": [{"input": i, "output": o} for i, o in PAIRS], "time_limit": 1.5,
                   "memory_limit": 64, "input_mode": "stdio", "generated_checker": None},
}


@pytest.mark.parametrize("name", sorted(ROWS))
def test_every_layout_reads_as_published(name):
    row = ROWS[name]
    assert layout_of(row) == name.split("-")[0].replace("deepcoder", "deepcoder" if name != "io-json" else "io")
    task = GenericTask().resolve(row)
    assert isinstance(task, IOTask)
    assert task.tests == PAIRS


def test_limits_and_language_come_from_the_layout():
    assert io_task_of(ROWS["code_contests"]).time_limit == 3.5
    assert io_task_of(ROWS["code_contests"]).memory_mb == 128
    assert io_task_of(ROWS["codeforces"]).time_limit == 1.5
    assert io_task_of(ROWS["codeforces"]).memory_mb == 64
    assert io_task_of(ROWS["verification_info"]).language.name == "cpp"
    assert io_task_of(ROWS["io"]).language is None  # the completion's fence chooses
    row = {**ROWS["io"], "language": "c++", "time_limit": 0.5, "memory_limit": 32, "compare": "float:1e-3"}
    task = io_task_of(row)
    assert (task.language.name, task.time_limit, task.memory_mb, task.compare) == ("cpp", 0.5, 32, "float:1e-3")


def test_each_layout_runs_its_checker_under_its_own_contract():
    """open-r1's generated checkers take (input, correct output, solution output) and print 1 or 0;
    ours take testlib's (input, output, answer) and exit 0 to accept, unless the row says otherwise."""
    checker = "print(1)"
    assert io_task_of({**ROWS["codeforces"], "generated_checker": checker}).checker_contract == "open-r1"
    assert io_task_of(ROWS["codeforces"]).checker is None
    assert io_task_of({**ROWS["io"], "checker": checker}).checker_contract == "testlib"
    assert io_task_of({**ROWS["io"], "checker": checker, "checker_contract": "open-r1"}).checker_contract == "open-r1"
    with pytest.raises(ConfigError, match="checker_contract='exit-code'"):
        io_task_of({**ROWS["io"], "checker": checker, "checker_contract": "exit-code"})


def test_broken_rows_are_config_errors_never_passes():
    with pytest.raises(ConfigError, match="no expected output"):
        io_task_of({"task_id": "x", "tests": [{"input": "1\n"}]})
    with pytest.raises(ConfigError, match="no expected output"):
        io_task_of({"task_id": "x", "tests": [{"input": "1\n", "output": None}]})
    with pytest.raises(ConfigError, match="2 test inputs but 1 outputs"):
        io_task_of({"task_id": "x", "input_output": {"inputs": ["1", "2"], "outputs": ["1"]}})
    with pytest.raises(ConfigError, match="no metadata.func_name"):
        io_task_of({"task_id": "x", "tests": [{"input": "1", "output": "1", "testtype": "functional"}]})
    with pytest.raises(ConfigError, match="not a Python identifier"):
        io_task_of({"task_id": "x", "input_output": {"inputs": [[1]], "outputs": [[1]], "fn_name": "f()"}})
    with pytest.raises(ConfigError, match="unknown program language 'cobol'"):
        io_task_of({**ROWS["io"], "language": "cobol"})
    with pytest.raises(ConfigError, match="compare="):
        io_task_of({**ROWS["io"], "compare": "fuzzy"})
    with pytest.raises(ConfigError, match="time_limit"):
        io_task_of({**ROWS["io"], "time_limit": -1})


class _Boom:
    def __reduce__(self):
        return (print, ("the host ran code from a dataset",))


def test_livecodebench_private_tests_never_unpickle_anything_but_strings(capsys):
    assert decode_livecodebench(_lcb_private([{"input": "1", "output": "2", "testtype": "stdin"}]))[0]["output"] == "2"
    hostile = base64.b64encode(zlib.compress(pickle.dumps(_Boom()))).decode()
    with pytest.raises(ConfigError, match="only strings"):
        decode_livecodebench(hostile)
    assert "ran code" not in capsys.readouterr().out
    # Positive control: the same bytes through an ordinary unpickler do run the code.
    pickle.load(io.BytesIO(zlib.decompress(base64.b64decode(hostile))))
    assert "ran code" in capsys.readouterr().out


def test_not_io_rows_are_left_to_the_other_styles():
    assert layout_of({"func_name": "f", "tests": ["1", "2"], "reference": "abs"}) is None
    assert layout_of({"tests": "assert f(1) == 1"}) is None
    assert isinstance(GenericTask().resolve({"func_name": "f", "tests": ["1"], "reference": "abs"}), object)


@pytest.mark.parametrize(("got", "want", "mode", "same"), [
    (b"3\n", b"3", "tokens", True),
    (b"  3 \n\n 4", b"3 4\n", "tokens", True),
    (b"YES", b"yes", "tokens", True),
    (b"0.3333333", b"0.333333333", "tokens", True),
    (b"1000001", b"1000000", "tokens", False),  # integers compare exactly, whatever the tolerance
    (b"1e6", b"1000001", "tokens", False),      # an integer answer needs that integer, not a float near it
    (b"1000000.5", b"1000000.0", "tokens", True),  # a real answer: within 1e-5 relative
    (b"+7", b"7", "tokens", False),             # ... as its own text (tests/test_io_compare.py)
    (b"3", b"3 4", "tokens", False),            # a prefix of the answer is wrong
    (b"3\n4\n", b"3\n4\n5\n", "lines", False),  # ... in every mode
    (b"3 \n4\n\n", b"3\n4", "lines", True),
    (b"3 4", b"3\n4", "lines", False),
    (b"3\n", b"3", "exact", False),
    (b"0.1001", b"0.1", "float:1e-3", True),
    (b"0.102", b"0.1", "float:1e-3", False),
    (b"nan", b"nan", "tokens", True),
    (b"nan", b"0.5", "tokens", False),
    (b"inf", b"1e308", "tokens", False),
])
def test_comparisons(got, want, mode, same):
    assert same_output(got, want, mode) is same


def test_the_fence_tag_picks_the_language_and_the_column_wins():
    task = io_task_of(ROWS["io"])
    assert program_code(task, "```cpp\nint main(){}\n```")[0].name == "cpp"
    assert program_code(task, "text\n```python\nprint(1)\n```\n")[0].name == "python"
    assert program_code(task, "print(1)")[0].name == "python"  # bare code
    cpp_task = io_task_of({**ROWS["io"], "language": "cpp"})
    language, code = program_code(cpp_task, "```python\nprint(1)\n```\n```c++\nint main(){}\n```")
    assert (language.name, code) == ("cpp", "int main(){}\n")


def test_a_missing_toolchain_names_the_package():
    with pytest.raises(ConfigError, match="apt-get install default-jdk"):
        check_toolchain(languages().get("java"), which=lambda tool: None)
    check_toolchain(languages().get("python"))  # positive control: this machine has python3


def test_languages_from_a_plugin_table_replace_and_extend():
    table = LanguageTable([Language("cpp", "main.cpp", ("./main",), ("g++", "main.cpp"))])
    table.register(Language("cpp", "a.cc", ("./a",), ("clang++", "a.cc"), aliases=("c++",)))
    table.register(Language("zig", "main.zig", ("./main",), ("zig", "build-exe", "main.zig")))
    assert table.get("C++").file == "a.cc"
    assert table.get("zig").compile[0] == "zig"
    java = languages().get("java").payload("import x;\npublic final class Solver { }")
    assert java["file"] == "Solver.java" and java["run"][-1] == "Solver"


def test_rows_whose_tests_call_a_function_become_function_tests():
    from trl_sandbox.tasks.io_calls import FunctionTestsTask

    apps = io_task_of({"task_id": "a", "input_output": json.dumps({"fn_name": "add", "inputs": [[1, 2], [3, 4]],
                                                                    "outputs": [[3], [7]]})})
    assert isinstance(apps, FunctionTestsTask) and apps.func_name == "add" and apps.total == 2
    assert apps.expected[0] == 3 and apps.expected[0] == [3] and not apps.expected[0] == 4  # wrapped or bare
    lcb = io_task_of({"task_id": "l", "metadata": json.dumps({"func_name": "pairs"}), "public_test_cases": json.dumps(
        [{"input": "[1, 2]\n3", "output": "[[1, 2]]", "testtype": "functional"}])})
    assert isinstance(lcb, FunctionTestsTask) and lcb.func_name == "pairs"
    assert lcb.expected[0] == ((1, 2),) and not lcb.expected[0] == [1, 2]  # tuples are lists; no unwrapping
    taco = io_task_of({"task_id": "t", "tests": {"fn_name": "f", "inputs": [["x"]], "outputs": [["y"]]}})
    assert isinstance(taco, FunctionTestsTask) and taco.expected[0] == "y"


def test_the_sources_sent_to_sandboxes_are_cut_not_rewritten():
    """What is sent with each exec is the files' own text, lines left out (never regenerated by the
    host's Python, whose newer syntax an older interpreter in the sandbox cannot read)."""
    import subprocess
    from pathlib import Path

    from trl_sandbox.judge.io_verdict import IO_SOURCE
    from trl_sandbox.remote.lease import SOURCES

    from .task_helpers import SANDBOX_PYTHON

    root = Path(__file__).resolve().parent.parent / "trl_sandbox"
    originals = {line for path in [*root.glob("judge/io_*.py"), *root.glob("remote/launcher*.py"),
                                   root / "judge" / "guard.py", root / "judge" / "meter.py"]
                 for line in path.read_text().splitlines()}
    for source in (IO_SOURCE, *SOURCES.values()):
        assert all(line in originals or line.strip() == "pass" for line in source.splitlines())
        assert '"""' not in source
        done = subprocess.run([SANDBOX_PYTHON, "-c", "import sys; compile(sys.stdin.read(), 'sent', 'exec')"],
                              input=source, text=True, capture_output=True)
        assert done.returncode == 0, done.stderr


def test_a_row_is_resolved_once_by_its_content_and_never_confused_with_another():
    """Rows repeat once per completion of a group (new objects each time, as a dataset decodes
    them): the same content gets the task already made; any change in a test, a type or a limit
    gets its own."""
    from trl_sandbox.tasks.io_layouts import io_task_of

    def row(output="2\n", limit=1):
        return {"task_id": "t", "tests": [{"input": "1\n", "output": output}], "time_limit": limit}

    first = io_task_of(row())
    assert io_task_of(row()) is first  # equal content, new objects: resolved once
    assert io_task_of(row(output="3\n")) is not first
    assert io_task_of(row(limit="1")) is not first  # "1" is not 1
    assert io_task_of({**row(), "prompt": "another wording"}) is first  # the prompt is not the task
