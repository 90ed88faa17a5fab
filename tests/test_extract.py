"""Code extraction: fences, <answer> tags, raw completions, and the original's body rule."""

from __future__ import annotations

import pytest

from trl_sandbox.tasks.extract import (
    answer_code,
    assemble,
    completion_text,
    continuation_body,
    extract_code,
    fenced_code,
    has_code,
)


def test_last_python_fence_wins_and_other_languages_are_ignored():
    text = (
        "First try:\n```python\nx = 1\n```\nA shell line:\n```bash\nrm -rf /\n```\n"
        "Better:\n```py\nx = 2\n```\nDone."
    )
    assert fenced_code(text) == "x = 2\n"
    assert extract_code(text, "fence") == "x = 2\n"


def test_bare_fence_and_unclosed_final_fence():
    assert fenced_code("```\nprint(1)\n```") == "print(1)\n"
    # a completion cut off by max_completion_length still yields its code
    assert fenced_code("Here:\n```python\ndef f():\n    return 1\n") == "def f():\n    return 1\n"
    assert fenced_code("no code here") is None


def test_answer_tags_with_and_without_inner_fence():
    assert answer_code("think...<answer>def f(): return 1</answer>") == "def f(): return 1"
    assert answer_code("<answer>\n```python\nprint(2)\n```\n</answer>") == "print(2)\n"
    assert answer_code("<ANSWER>a</ANSWER> then <answer>b</answer>") == "b"
    assert answer_code("nothing") is None


def test_auto_prefers_fence_then_answer_then_raw():
    assert extract_code("<answer>a = 1</answer>", "auto") == "a = 1"
    assert extract_code("<answer>a = 1</answer>\n```python\nb = 2\n```", "auto") == "b = 2\n"
    assert extract_code("c = 3", "auto") == "c = 3"
    assert extract_code("c = 3", "raw") == "c = 3"


def test_body_keeps_lines_up_to_the_first_unindented_line():
    completion = (
        "    total = 0\n"
        "\n"
        "    for x in xs:\n"
        "\ttotal += x\n"
        "    return total\n"
        "\n"
        "print(sort_numbers([3, 1]))\n"
        "    indented again but after the cut\n"
    )
    body = continuation_body(completion)
    assert body == "    total = 0\n\n    for x in xs:\n\ttotal += x\n    return total"
    assert "print" not in body and "after the cut" not in body
    assert extract_code(completion, "body") == body


def test_body_of_a_completion_that_starts_unindented_is_empty():
    assert continuation_body("```python\ndef f(): pass\n```") == ""
    assert not has_code(continuation_body("def sort_numbers(xs):\n    return xs\n"))


def test_has_code_ignores_blank_lines_and_comments():
    assert not has_code("   \n\n   # just a comment\n")
    assert has_code("    # comment\n    return 1\n")


def test_chat_completions_use_the_last_assistant_message():
    messages = [
        {"role": "user", "content": "write code"},
        {"role": "assistant", "content": "draft"},
        {"role": "assistant", "content": [{"type": "text", "text": "```python\nx = 9\n```"}]},
    ]
    assert completion_text(messages) == "```python\nx = 9\n```"
    assert extract_code(messages, "auto") == "x = 9\n"
    assert completion_text({"role": "assistant", "content": "hi"}) == "hi"
    assert completion_text(None) == ""


def test_assemble_prefixes_the_prompt_in_body_and_continue_modes():
    prompt = "def f(xs):\n    \"\"\"Doc.\"\"\"\n"
    program, prefix_lines = assemble(prompt, "    return xs", "body")
    assert program == prompt + "    return xs\n" and prefix_lines == 2
    program, prefix_lines = assemble(prompt, "    return 1\n", "continue")
    assert program == prompt + "    return 1\n" and prefix_lines == 2
    program, prefix_lines = assemble(prompt, "def f(xs): return 0", "fence")
    assert program == "def f(xs): return 0" and prefix_lines == 0


def test_unknown_mode_is_an_error():
    with pytest.raises(ValueError, match="unknown extraction mode"):
        extract_code("x", "sideways")
