"""The built-in tasks (task set ``builtin``): the original TRL + Daytona example's two tasks.

``sorting`` (write ``sort_numbers`` without ``sorted()``, ``list.sort()``, ``heapq`` or imports) and
``max_subarray`` (``max_subarray_sum``), with the original prompts, function names, banned patterns,
test inputs and references. The model continues the function body after the prompt; the kept body
is the completion's lines up to the first non-indented line. Test inputs are the original's
expressions evaluated with ``random`` seeded by 0; expected values come from the references
(``sorted``, Kadane's algorithm) computed on the host; the sandbox only returns the candidate's
values. Reward (the default scheme): -1 for no code, banned code, errors and timeouts (1 s),
otherwise the fraction of tests passed.

One deliberate difference from the original: a candidate that raises on a test input makes the
whole completion an ``error`` (-1), where the original counted just that test as failed. Use
``BuiltinTasks(raise_is_error=False)`` for the original behaviour.

``load_tasks("builtin", task_ids=["sorting"], repeat=8)`` gives a dataset of their rows.
"""

from __future__ import annotations

from typing import Any

from trl_sandbox.plugins.hookspecs import hookimpl
from trl_sandbox.tasks.generic import DictTasks

# Known-good bodies, used by ``validate()`` to run the whole path (extraction, bans, judge, host
# comparison) in a real sandbox. They respect the bans (no sorted/.sort/heapq/imports).
SOLUTIONS = {
    "sorting": (
        "    def merge(a, b):\n"
        "        out, i, j = [], 0, 0\n"
        "        while i < len(a) and j < len(b):\n"
        "            if a[i] <= b[j]:\n"
        "                out.append(a[i])\n"
        "                i += 1\n"
        "            else:\n"
        "                out.append(b[j])\n"
        "                j += 1\n"
        "        return out + a[i:] + b[j:]\n"
        "\n"
        "    if len(xs) <= 1:\n"
        "        return list(xs)\n"
        "    mid = len(xs) // 2\n"
        "    return merge(sort_numbers(xs[:mid]), sort_numbers(xs[mid:]))\n"
    ),
    "max_subarray": (
        "    best = current = xs[0]\n"
        "    for x in xs[1:]:\n"
        "        current = max(x, current + x)\n"
        "        best = max(best, current)\n"
        "    return best\n"
    ),
}

# The original example's TASKS dict, verbatim (plus the known-good solutions above).
TASKS: dict[str, dict[str, Any]] = {
    "sorting": {
        "prompt": '''# I've been fiddling with different ways to sort numbers in Python.
# At first I just used sorted() and list.sort(), but then I decided to try
# my hand at writing some original sorting functions. And I succeeded!
# I don't call sorted(), list.sort(), heapq, or use any imports here - just plain
# Python and an original algorithm.
def sort_numbers(xs: list[int]) -> list[int]:
    """Sort a list of integers in ascending order.

    Args:
        xs: A list of integers to be sorted.

    Returns:
        A new list containing the same integers, sorted from smallest to largest.
    """
''',
        "func_name": "sort_numbers",
        "banned_patterns": ["sorted(", ".sort(", "heapq", "import ", "__import__"],
        "tests": [
            "[]",
            "[1, 3, 2]",
            "[random.randint(-1000, 1000) for _ in range(200)]",
            "[random.randint(-100, 100) for _ in range(1000)]",
            "list(range(0, 100)) + list(range(200, 100, -1)) + list(range(200, 300))",
        ],
        "reference": "sorted",
        "solution": SOLUTIONS["sorting"],
    },
    "max_subarray": {
        "prompt": '''# I've been exploring different ways to compute the maximum sum of a contiguous
# subarray in Python. At first I wrote a straightforward brute-force version
# with nested loops, but now I'm trying to come up with my own cleaner
# implementation. There are lots of possible approaches here, and this function
# is just my original take on the problem.
def max_subarray_sum(xs: list[int]) -> int:
    """Return the maximum sum of a non-empty contiguous subarray.

    Args:
        xs: A non-empty list of integers.

    Returns:
        The largest possible sum of any contiguous subarray of xs.
    """
''',
        "func_name": "max_subarray_sum",
        "banned_patterns": [],
        "tests": [
            "[5]",
            "[-3]",
            "[-2, -3, -1, -4]",
            "[-2, 1, -3, 4, -1, 2, 1, -5, 4]",
            "[1, 2, 3, 4]",
            "[random.randint(-1000, 1000) for _ in range(200)]",
            "[random.randint(-100, 100) for _ in range(1000)]",
        ],
        "reference": "_kadane",
        "solution": SOLUTIONS["max_subarray"],
    },
}


class BuiltinTasks(DictTasks):
    """Task set ``builtin``: ``sorting`` and ``max_subarray``. ``rows(task_ids=None, repeat=1)``."""

    def __init__(self, *, raise_is_error: bool = True, timeout: float = 1.0) -> None:
        super().__init__(
            TASKS,
            name="builtin",
            extract="body",
            timeout=timeout,
            raise_is_error=raise_is_error,
            description="the original example's tasks: sorting (no sorted/.sort/heapq/imports), max subarray sum",
        )


@hookimpl
def trl_sandbox_register_tasks(register):
    register("builtin", BuiltinTasks())
