"""Score many completions in sandboxes outside training, printing each verdict as it arrives.

    python examples/batch_rewards.py                                  # a built-in toy batch
    python examples/batch_rewards.py --input completions.jsonl --pool-size 8 --provider local

Each input line is a JSON object with ``completion`` and the task columns of a dataset row
(``trl_sandbox/tasks/generic.py``: e.g. ``test_list`` for MBPP-style asserts, or
``sandbox_task: "humaneval"`` and ``task_id``), plus an optional ``id``. The same ``Scorer``
that computes training rewards runs them: identical programs run once, every program runs in a
pooled sandbox, and each completion gets an outcome (passed, failed, error, timeout, banned,
no_code, infra) and the reward scheme's value. Results print as they complete (fast ones
first), then a summary in input order. ``trl-sandbox exec`` (raw programs) and
``trl-sandbox evaluate`` (HumanEval samples, pass@k) are the command-line versions.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from trl_sandbox import ConfigError, SandboxPool
from trl_sandbox.scoring.scorer import Scorer

ADD_TESTS = ["assert add(1, 2) == 3", "assert add(-4, 4) == 0", "assert add(10, 5) == 15"]


def _add(body: str) -> str:
    return f"```python\ndef add(a, b):\n{body}\n```"


#: The toy batch: one MBPP-style problem, completions that pass, fail, raise, loop and do not parse.
TOY_BATCH: list[dict[str, Any]] = [
    {"id": "slow-correct", "completion": _add("    import time\n    time.sleep(0.3)\n    return a + b")},
    {"id": "correct", "completion": _add("    return a + b")},
    {"id": "wrong", "completion": _add("    return a - b")},
    {"id": "raises", "completion": _add("    raise ValueError('no idea')")},
    {"id": "loops-forever", "completion": _add("    while True:\n        pass")},
    {"id": "syntax-error", "completion": _add("    return a +")},
    {"id": "no-code", "completion": ""},
]
for _item in TOY_BATCH:
    _item.update(prompt="Write add(a, b) returning the sum of a and b.", test_list=ADD_TESTS, entry_point="add")


def read_batch(path: str) -> list[dict[str, Any]]:
    """The items of a JSONL file; a ``ConfigError`` naming the line for one that is unusable."""
    items = []
    try:
        handle = open(path, encoding="utf-8") if path != "-" else sys.stdin
    except OSError as exc:
        raise ConfigError(f"--input {path!r}: {exc.strerror or exc}") from exc
    with handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path} line {number}: invalid JSON: {exc}") from exc
            if not isinstance(item, dict) or not isinstance(item.get("completion"), (str, list)):
                raise ConfigError(f"{path} line {number}: expected an object with a 'completion' (text or messages)")
            item.setdefault("id", number)
            items.append(item)
    if not items:
        raise ConfigError(f"--input {path!r} has no items")
    return items


def score_batch(items: Sequence[dict[str, Any]], pool: SandboxPool, *, scheme: str = "original",
                timeout: float | None = None, out=sys.stdout) -> list[Any]:
    """Score ``items`` on ``pool``; print a line per result as it completes. Returns outcomes in input order."""
    scorer = Scorer(pool, scheme=scheme, timeout=timeout)
    rows = [{k: v for k, v in item.items() if k not in ("id", "completion")} for item in items]
    done = 0
    lock = threading.Lock()
    # The bar is drawn on a terminal only (disable=None): piped output gets the result lines alone.
    bar = tqdm(total=len(items), unit="completion", desc="scoring", file=sys.stderr, disable=None)

    def on_result(i: int, outcome) -> None:  # called on the pool's thread as each verdict is known
        nonlocal done
        with lock:
            done += 1
            bar.write(f"  [{done}/{len(items)}] {items[i]['id']}: {outcome.status.upper()} "
                      f"reward={_fmt(outcome.reward)} ({outcome.passed}/{outcome.total} tests)", file=out)
            bar.update(1)

    try:
        return scorer.score([item["completion"] for item in items], rows, on_result=on_result)
    finally:
        bar.close()
        scorer.close()


def _fmt(reward: float | None) -> str:
    return "None" if reward is None else f"{reward:+.1f}"


def summarize(items: Sequence[dict[str, Any]], outcomes: Sequence[Any], out=sys.stdout) -> None:
    print("\nSummary (input order):", file=out)
    for item, outcome in zip(items, outcomes):
        shown = outcome.detail.strip() not in ("", "failed:") and outcome.status != "passed"
        detail = f"  {outcome.detail[:80]}" if shown else ""
        print(f"  {item['id']}: reward={_fmt(outcome.reward)} [{outcome.status}]{detail}", file=out)
    scored = [o.reward for o in outcomes if o.reward is not None]
    counts = Counter(o.status for o in outcomes)
    print(f"Total reward: {sum(scored):+.1f} over {len(scored)} scored "
          f"({len(outcomes) - len(scored)} infrastructure failures)", file=out)
    print(f"Pass rate: {counts['passed']}/{len(outcomes)} ({counts['passed'] / len(outcomes):.0%})", file=out)
    print("Outcomes: " + ", ".join(f"{s} {n}" for s, n in sorted(counts.items())), file=out)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", help="JSONL of {completion, task columns..., id}; default: a toy batch")
    parser.add_argument("--provider", default="local", help="sandbox provider (`trl-sandbox providers`)")
    parser.add_argument("--pool-size", type=int, default=4, help="sandboxes run at once")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds per program, for rows without a 'timeout' column (default: the task's)")
    parser.add_argument("--scheme", default="original", help="reward scheme: original, binary, partial, weighted:1,1,2, task")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.timeout is not None and args.timeout <= 0:
            raise ConfigError(f"--timeout must be a positive number of seconds, got {args.timeout}")
        items = read_batch(args.input) if args.input else [dict(item) for item in TOY_BATCH]
        print(f"Scoring {len(items)} completions on {args.pool_size} '{args.provider}' sandboxes "
              "(results arrive as they complete):")
        with SandboxPool.open(args.provider, size=args.pool_size, made_by="batch-example") as pool:
            outcomes = score_batch(items, pool, scheme=args.scheme, timeout=args.timeout)
    except ConfigError as exc:
        print(f"batch_rewards: {exc}", file=sys.stderr)
        return 2
    summarize(items, outcomes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
