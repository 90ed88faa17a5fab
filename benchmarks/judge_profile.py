"""Where a judged program's CPU goes, phase by phase, on HumanEval's canonical solutions.

    .venv/bin/python benchmarks/judge_profile.py [--programs N]

One local sandbox runs a copy of the judge with CPU marks added (``getrusage`` at each phase
boundary; the copy is the sandbox's warm program, as the real judge is) and the programs one at a
time. Sandbox side: the supervisor's own CPU per exec (read from the host's /proc), the judge
process from its fork to ``main()`` (fork, child set-up, rlimits, seccomp), its phases, the
candidate process (fork, loading the completion, serving calls, exit; the judge reaps it to read
its CPU) and what is left (the judge's exit). Host side: building the program, sending it and
reading the answer (the transport), and reading the verdict. The marks themselves cost a few
microseconds each, so the phases add up to a little more than the uninstrumented judge.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trl_sandbox.judge import JUDGE_SOURCE, NONCE_BYTES  # noqa: E402
from trl_sandbox.local import LocalProvider  # noqa: E402
from trl_sandbox.sandbox import SandboxSpec  # noqa: E402

# (text the mark goes after, the phase that ends there)
MARKS = [
    ("candidate_spec = _pickle.loads(_read_message(0))", "judge: nonce and candidate part read"),
    ("pid, wfd, rfd = _start_candidate(candidate_spec, nonce)", "judge: candidate process forked"),
    ('verdict["tests"] = []', "judge: candidate loaded (judge waits)"),
    ("conn.kill()  # nothing the candidate does from here on can reach the verdict", "judge: tests and calls"),
    ("_write_all(1, line)", "judge: verdict written"),
]
PREAMBLE = (
    "import resource as _R\n"
    "_T = []\n"
    "def _mark(label):\n"
    "    r = _R.getrusage(_R.RUSAGE_SELF)\n"
    "    _T.append((label, r.ru_utime + r.ru_stime))\n"
)
REPORT = '''
def main():
    _T[:] = []
    _mark("judge: fork and child set-up, until main()")
    _judged_main()
    os.waitpid(_CANDIDATE[0], 0)
    children = _R.getrusage(_R.RUSAGE_CHILDREN)
    _T.append(("candidate process (fork, load, calls, exit)", children.ru_utime + children.ru_stime))
    import sys as _sys
    _sys.stderr.write("@@profile@@ " + repr(_T) + "\\n")
'''


def instrumented_judge() -> str:
    src = JUDGE_SOURCE
    for anchor, label in MARKS:
        match = re.search(r"\n([ ]*)" + re.escape(anchor), src)
        assert match, f"the judge's source changed: {anchor!r} not found"
        src = src.replace(anchor, f"{anchor}\n{match.group(1)}_mark({label!r})", 1)
    src = src.replace("    conn = _Conn(pid, wfd, rfd,", "    _CANDIDATE[:] = [pid]\n    conn = _Conn(pid, wfd, rfd,", 1)
    src = src.replace("def main():", "def _judged_main():", 1)
    return PREAMBLE + "_CANDIDATE = [0]\n" + src + REPORT


def phases(stderr: str) -> dict[str, float]:
    line = next(x for x in stderr.splitlines() if x.startswith("@@profile@@ "))
    marks = eval(line.split(" ", 1)[1], {})  # noqa: S307  (our own repr of (str, float) pairs)
    out, last = {}, 0.0
    for label, cpu in marks[:-1]:
        out[label] = cpu - last
        last = cpu
    label, cpu = marks[-1]
    out[label] = cpu
    return out


def supervisor_cpu(pid: int) -> tuple[float, float]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


async def profile(count: int) -> dict:
    from trl_sandbox_humaneval import HumanEvalTasks, problems

    tasks = HumanEvalTasks()
    rows = [dict(r, sandbox_task="humaneval") for r in tasks.rows()]
    completions = [problems()[r["task_id"]]["canonical_solution"] for r in rows]
    source = instrumented_judge()
    provider = LocalProvider()
    provider.warm_tokens = {source: "\0trl-sandbox-warm-profile"}
    box = await provider.create(SandboxSpec(tags={"bench": "judge-profile"}))
    sums: dict[str, float] = {}
    host = {"host: build the program": 0.0, "host: send, wait, receive (transport)": 0.0,
            "host: read the verdict and compare": 0.0}
    try:
        sup = int(Path(f"/proc/{box.pid}/task/{box.pid}/children").read_text().split()[0])
        await box.exec(["python3", "-c", "pass"], timeout=5)
        self0, children0 = supervisor_cpu(sup)
        passed = 0
        for i in range(count):
            row, completion = rows[i % len(rows)], completions[i % len(rows)]
            t0 = time.thread_time()
            program = tasks.build(completion, row)
            argv = [source if a == JUDGE_SOURCE else a for a in program.argv]
            nonce = os.urandom(NONCE_BYTES)
            t1 = time.thread_time()
            result = await box.exec(argv, stdin=nonce + program.stdin, timeout=program.timeout)
            t2 = time.thread_time()
            outcome = tasks.score(result, row, nonce=nonce)
            t3 = time.thread_time()
            passed += outcome.status == "passed"
            for label, value in (("host: build the program", t1 - t0), ("host: send, wait, receive (transport)", t2 - t1),
                                 ("host: read the verdict and compare", t3 - t2)):
                host[label] += value
            for label, value in phases(result.stderr).items():
                sums[label] = sums.get(label, 0.0) + value
        self1, children1 = supervisor_cpu(sup)
    finally:
        await provider.destroy(box.id)
        await provider.aclose()
    per = {label: 1000 * total / count for label, total in sums.items()}
    judge_and_candidate = 1000 * (children1 - children0) / count
    per["judge: exit, and what the marks miss"] = max(0.0, judge_and_candidate - sum(per.values()))
    per["supervisor: request, fork, wait, sweep, answer"] = 1000 * (self1 - self0) / count
    per.update({label: 1000 * total / count for label, total in host.items()})
    return {"programs": count, "passed": passed, "cpu_ms_per_program": per,
            "sandbox_ms": sum(v for k, v in per.items() if not k.startswith("host")),
            "host_ms": sum(v for k, v in per.items() if k.startswith("host"))}


def print_profile(report: dict) -> None:
    print(f"\nwhere a judged program's CPU goes ({report['programs']} HumanEval programs one at a time, "
          f"{report['passed']} passed; ms per program):")
    for label, ms in report["cpu_ms_per_program"].items():
        print(f"  {label:<52} {ms:6.3f}")
    print(f"  {'sandbox, all of it':<52} {report['sandbox_ms']:6.3f}")
    print(f"  {'host, all of it':<52} {report['host_ms']:6.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--programs", type=int, default=328, help="judged programs to profile (HumanEval cycled)")
    ap.add_argument("--output", type=Path, default=None, help="also write the report as JSON here")
    args = ap.parse_args()
    report = asyncio.run(profile(args.programs))
    print_profile(report)
    if args.output:
        args.output.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
