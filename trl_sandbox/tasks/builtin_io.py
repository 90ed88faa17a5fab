"""Task set ``io-basics``: four whole-program problems judged on stdin/stdout.

``sum-lines`` (a+b per line), ``max-subarray`` (Kadane, as a whole program), ``sort-numbers`` and
``two-sum-any`` (any pair of positions whose values sum to a target: several right answers, judged
by a checker). Each has reference solutions in Python and C++ that ``validate`` (``trl-sandbox tasks
--check``) runs through the real judge; tests are generated from a fixed seed, with the edge
cases the statements allow. Without a ``language`` option the model may answer in either language
(the completion's fence tag decides); ``rows(language="cpp")`` asks for C++ and pins the rows to it.

``load_tasks("io-basics", repeat=8)`` gives a dataset; ``examples/train_io.py`` trains on it.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from trl_sandbox.plugins.hookspecs import hookimpl
from trl_sandbox.sandbox import ConfigError, ExecResult, Outcome, Program
from trl_sandbox.tasks.generic import GenericTask, run_self_check


def _kadane(xs: Sequence[int]) -> int:
    best = current = xs[0]
    for x in xs[1:]:
        current = max(x, current + x)
        best = max(best, current)
    return best


def _sum_lines(rng: random.Random) -> list[dict[str, str]]:
    cases = [[(0, 0)], [(-5, 5), (10**9, 10**9)], [(-(10**9), -(10**9))]]
    cases += [[(rng.randint(-10**9, 10**9), rng.randint(-10**9, 10**9)) for _ in range(rng.randint(1, 50))]
              for _ in range(7)]
    return [{"input": f"{len(c)}\n" + "".join(f"{a} {b}\n" for a, b in c), "output": "".join(f"{a + b}\n" for a, b in c)}
            for c in cases]


def _arrays(rng: random.Random, low: int, high: int) -> list[list[int]]:
    arrays = [[7], [-3], [-2, -1, -5], [0, 0, 0], [5, -9, 6, -2, 3]]
    arrays += [[rng.randint(low, high) for _ in range(rng.randint(1, 200))] for _ in range(7)]
    return arrays


def _max_subarray(rng: random.Random) -> list[dict[str, str]]:
    return [{"input": f"{len(xs)}\n{' '.join(map(str, xs))}\n", "output": f"{_kadane(xs)}\n"}
            for xs in _arrays(rng, -1000, 1000)]


def _sort_numbers(rng: random.Random) -> list[dict[str, str]]:
    return [{"input": f"{len(xs)}\n{' '.join(map(str, xs))}\n", "output": " ".join(map(str, sorted(xs))) + "\n"}
            for xs in _arrays(rng, -10**6, 10**6)]


def _two_sum(rng: random.Random) -> list[dict[str, str]]:
    tests = []
    for size in (2, 3, 5, 10, 50, 100, 200, 400):
        xs = [rng.randint(-100, 100) for _ in range(size)]
        i, j = sorted(rng.sample(range(size), 2))
        target = xs[i] + xs[j]
        tests.append({"input": f"{size} {target}\n{' '.join(map(str, xs))}\n", "output": f"{i + 1} {j + 1}\n"})
    return tests


# Accepts any 1-based i < j with a[i] + a[j] == target (testlib's convention: input, output, answer).
TWO_SUM_CHECKER = """import sys
data = open(sys.argv[1]).read().split()
n, target = int(data[0]), int(data[1])
xs = [int(v) for v in data[2:2 + n]]
got = open(sys.argv[2]).read().split()
if len(got) != 2 or not all(g.lstrip('-').isdigit() for g in got):
    sys.exit(1)
i, j = int(got[0]), int(got[1])
sys.exit(0 if 1 <= i < j <= n and xs[i - 1] + xs[j - 1] == target else 1)
"""

PROBLEMS: dict[str, dict[str, Any]] = {
    "sum-lines": {
        "statement": "The first line holds n (1 <= n <= 100). Each of the next n lines holds two integers a and b "
                     "(|a|, |b| <= 10^9). Print a + b for each line, one per line.",
        "tests": _sum_lines,
        "python": "import sys\ndata = sys.stdin.read().split()\nn = int(data[0])\n"
                  "print('\\n'.join(str(int(data[1 + 2 * i]) + int(data[2 + 2 * i])) for i in range(n)))\n",
        "cpp": "#include <cstdio>\nint main(){int n; if(scanf(\"%d\",&n)!=1) return 1; for(int i=0;i<n;i++){long long a,b;"
               "scanf(\"%lld %lld\",&a,&b); printf(\"%lld\\n\",a+b);} }\n",
    },
    "max-subarray": {
        "statement": "The first line holds n (1 <= n <= 10^5), the second n integers (|x| <= 1000). Print the largest "
                     "sum of a non-empty contiguous subarray.",
        "tests": _max_subarray,
        "python": "import sys\nxs = list(map(int, sys.stdin.read().split()))[1:]\nbest = cur = xs[0]\n"
                  "for x in xs[1:]:\n    cur = max(x, cur + x)\n    best = max(best, cur)\nprint(best)\n",
        "cpp": "#include <bits/stdc++.h>\nint main(){int n; std::cin>>n; long long best=LLONG_MIN, cur=0;\n"
               "for(int i=0;i<n;i++){long long x; std::cin>>x; cur = i ? std::max(x, cur + x) : x; best = std::max(best, cur);}\n"
               "std::cout<<best<<\"\\n\";}\n",
    },
    "sort-numbers": {
        "statement": "The first line holds n (1 <= n <= 10^5), the second n integers (|x| <= 10^6). Print them in "
                     "non-decreasing order on one line, separated by spaces.",
        "tests": _sort_numbers,
        "python": "import sys\nxs = list(map(int, sys.stdin.read().split()))[1:]\nprint(*sorted(xs))\n",
        "cpp": "#include <bits/stdc++.h>\nint main(){int n; std::cin>>n; std::vector<long long> v(n); for(auto&x:v) std::cin>>x;\n"
               "std::sort(v.begin(), v.end()); for(int i=0;i<n;i++) std::cout<<(i?\" \":\"\")<<v[i]; std::cout<<\"\\n\";}\n",
    },
    "two-sum-any": {
        "statement": "The first line holds n (2 <= n <= 10^4) and a target t; the second n integers. Print two positions "
                     "i < j (1-based) whose values sum to t; one such pair exists. Any such pair is accepted.",
        "tests": _two_sum,
        "checker": TWO_SUM_CHECKER,
        "python": "import sys\nd = list(map(int, sys.stdin.read().split()))\nn, t, xs = d[0], d[1], d[2:]\nseen = {}\n"
                  "for j, x in enumerate(xs):\n    if t - x in seen:\n        print(seen[t - x] + 1, j + 1)\n        break\n"
                  "    seen.setdefault(x, j)\n",
        "cpp": "#include <bits/stdc++.h>\nint main(){int n; long long t; std::cin>>n>>t; std::vector<long long> v(n);\n"
               "for(auto&x:v) std::cin>>x; std::map<long long,int> seen;\n"
               "for(int j=0;j<n;j++){auto it = seen.find(t - v[j]); if(it != seen.end()){ std::cout<<it->second+1<<' '<<j+1<<\"\\n\"; return 0;}\n"
               "seen.emplace(v[j], j);} }\n",
    },
}
LANGUAGES = {"python": "Python 3", "cpp": "C++17"}


def prompt(task_id: str, language: str | None) -> str:
    problem = PROBLEMS[task_id]
    which = (f"in {LANGUAGES[language]} in a ```{language} fenced block" if language else
             "in Python 3 (a ```python fenced block) or C++17 (a ```cpp fenced block)")
    return (f"{problem['statement']}\n\nWrite a complete program that reads the input from standard input and writes "
            f"the answer to standard output, {which}.\n")


class IOBasics:
    """Task set ``io-basics``. ``rows(task_ids=None, repeat=1, language=None)``."""

    name = "io-basics"
    description = "whole programs on stdin/stdout in Python or C++: sum-lines, max-subarray, sort-numbers, two-sum-any (checker)"

    def __init__(self, seed: int = 0) -> None:
        self.tests = {task_id: problem["tests"](random.Random(f"{seed}:{task_id}")) for task_id, problem in PROBLEMS.items()}

    def row(self, task_id: str, language: str | None = None) -> dict[str, Any]:
        if task_id not in PROBLEMS:
            raise ConfigError(f"task set {self.name!r} has no task {task_id!r}; it has {', '.join(PROBLEMS)}")
        if language is not None and language not in LANGUAGES:
            raise ConfigError(f"task set {self.name!r}: language={language!r}; use one of {', '.join(LANGUAGES)}")
        row: dict[str, Any] = {"prompt": prompt(task_id, language), "task_id": task_id, "tests": self.tests[task_id],
                               "time_limit": 2.0, "memory_limit": 256}
        if language:
            row["language"] = language
        if PROBLEMS[task_id].get("checker"):
            row["checker"] = PROBLEMS[task_id]["checker"]
        return row

    def rows(self, task_ids: Sequence[str] | None = None, repeat: int = 1, language: str | None = None,
             **options: Any) -> list[dict[str, Any]]:
        if options:
            raise ConfigError(f"task set {self.name!r} does not take options {sorted(options)}")
        ids = list(task_ids) if task_ids is not None else list(PROBLEMS)
        return [self.row(t, language) for _ in range(max(1, int(repeat))) for t in ids]

    def _row(self, row: Mapping[str, Any]) -> dict[str, Any]:
        return {**self.row(str(row["task_id"]), row.get("language")), **{k: v for k, v in row.items()
                                                                           if k in ("stop_at_first_failure",)}}

    def build(self, completion: Any, row: Mapping[str, Any]) -> Program | Outcome:
        return GenericTask().build(completion, self._row(row))

    def score(self, result: ExecResult, row: Mapping[str, Any], *, nonce: bytes | None) -> Outcome:
        return GenericTask().score(result, self._row(row), nonce=nonce)

    def validate(self, *, provider: str | None = "local", settings: Mapping[str, Any] | None = None) -> list[str]:
        """Every reference solution, in both languages, passes every test through the real judge."""
        problems = []
        for task_id in PROBLEMS:
            for i, test in enumerate(self.tests[task_id]):
                if not test.get("output"):
                    problems.append(f"{self.name}/{task_id}: test {i + 1} has no expected output")
        if provider:
            cases = [(f"```{language}\n{PROBLEMS[t][language]}```", {"task_id": t, "sandbox_task": self.name})
                     for t in PROBLEMS for language in LANGUAGES]
            problems += run_self_check(self, cases, provider=provider, settings=settings)
        return problems


@hookimpl
def trl_sandbox_register_tasks(register):
    register("io-basics", IOBasics())
