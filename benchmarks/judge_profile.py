"""Where a judged program's CPU goes, phase by phase, on HumanEval's canonical solutions.

    .venv/bin/python benchmarks/judge_profile.py [--programs N]

One local sandbox runs a copy of the judge with CPU marks added (``getrusage`` at each phase
boundary; the copy is the sandbox's warm program, as the real judge is, and stays resident as the
real one does) and the programs one at a time. Sandbox side, from the host's /proc: the
supervisor's own CPU per exec (receive, hand the exec to the forker and the judge, wait, answer),
the forker's (fork the candidate, report, reap it), the candidate processes (fork, set-up, loading
the completion, serving calls, exit; the forker reaps them), the judge's marked phases and what is left of its CPU (receiving the exec
and answering). Host side: building the program, sending it and reading the answer (the
transport), and reading the verdict. The marks themselves cost a few microseconds each, so the
phases add up to a little more than the uninstrumented judge. Last, the page faults per program of
the supervisor, the forker, the candidates and the judge: on a virtual machine a copy-on-write fault costs a
few microseconds, and they are much of the sandbox's CPU.
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

from trl_sandbox.judge.verdict import JUDGE_SOURCE, NONCE_BYTES  # noqa: E402
from trl_sandbox.local import LocalProvider  # noqa: E402
from trl_sandbox.sandbox import SandboxSpec  # noqa: E402

# (text the mark goes after, the phase that ends there)
MARKS = [
    ("candidate_spec = _pickle.loads(candidate_part)", "judge: nonce and candidate part read"),
    ("judge_spec = _pickle.loads(_read_message(0))", "judge: candidate part sent, judge part read"),
    ('verdict["tests"] = []', "judge: candidate loaded (judge waits)"),
    ("conn.kill()  # nothing the candidate does from here on can reach the verdict", "judge: tests and calls"),
    ("_write_all(1, line)", "judge: verdict written"),
]
# In the candidate process, whose output is the exec's stderr: (text the mark goes after, phase).
# The first mark goes before its line.
CANDIDATE_MARKS = [
    ("    spec = _pickle.loads(_read_message(rfd))", "candidate: fork and set-up, until its code runs"),
    ("    _candidate(spec, rfd, wfd, _TYPE_MODIFIED", "candidate: its part and compiled code read"),
    ("        exec(code, namespace)", "candidate: bans set (and the completion compiled, if the judge did not)"),
    ("        exec(code, namespace)", "candidate: completion's module body run"),
]
CANDIDATE_AFTER = {"candidate: completion's module body run"}  # the other marks go before their line
CANDIDATE_REST = "candidate: calls and exit"
FORKER = "forker: receive, fork, report, reap"
SUPERVISOR = "supervisor: request, hand over, wait, answer"
PREAMBLE = (
    "import resource as _R\n"
    "_T = []\n"
    "def _mark(label):\n"
    "    r = _R.getrusage(_R.RUSAGE_SELF)\n"
    "    _T.append((label, r.ru_utime + r.ru_stime))\n"
    "def _cmark(label):\n"
    "    r = _R.getrusage(_R.RUSAGE_SELF)\n"
    "    os.write(2, ('@@cmark@@ %r\\n' % ((label, r.ru_utime + r.ru_stime, r.ru_minflt),)).encode())\n"
)
REPORT = '''
def main():
    _T[:] = []
    _mark("start")
    _judged_main()
    import sys as _sys
    _sys.stderr.write("@@profile@@ " + repr(_T) + "\\n")
'''


def instrumented_judge() -> str:
    src = JUDGE_SOURCE
    for anchor, label in MARKS:
        match = re.search(r"\n([ ]*)" + re.escape(anchor), src)
        assert match, f"the judge's source changed: {anchor!r} not found"
        src = src.replace(anchor, f"{anchor}\n{match.group(1)}_mark({label!r})", 1)
    for anchor, label in CANDIDATE_MARKS:
        assert src.count(anchor) == 1, f"the candidate's source changed: {anchor!r} not found once"
        indent = anchor[: len(anchor) - len(anchor.lstrip())]
        mark = f"{indent}_cmark({label!r})"
        src = src.replace(anchor, f"{anchor}\n{mark}" if label in CANDIDATE_AFTER else f"{mark}\n{anchor}", 1)
    src = src.replace("def main():", "def _judged_main():", 1)
    return "import os\n" + PREAMBLE + src + REPORT


def phases(stderr: str) -> tuple[dict[str, float], dict[str, int]]:
    """The judge's phases, and the candidate's up to its last mark (the rest is its calls and exit):
    CPU seconds of each, and the candidate's page faults in each of its own."""
    lines = stderr.splitlines()
    line = next(x for x in lines if x.startswith("@@profile@@ "))
    marks = eval(line.split(" ", 1)[1], {})  # noqa: S307  (our own repr of (str, float) pairs)
    out, last = {}, marks[0][1]
    for label, cpu in marks[1:]:
        out[label] = cpu - last
        last = cpu
    faults: dict[str, int] = {}
    last, last_faults = 0.0, 0  # the candidate's first mark: its CPU and faults since the fork
    for x in lines:
        if x.startswith("@@cmark@@ "):
            label, cpu, minflt = eval(x.split(" ", 1)[1], {})  # noqa: S307  (our own repr)
            out[label], faults[label] = cpu - last, minflt - last_faults
            last, last_faults = cpu, minflt
    return out, faults


def process_cpu(pid: int) -> tuple[float, float]:
    """A process's own CPU seconds, and those of the children it reaped."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


def resident_of(supervisor: int) -> tuple[int, int]:
    """The sandbox's resident judge and candidates' forker, PID 1's two children between judged
    programs: the judge goes by its own name (``trl-judge``)."""
    children = [int(pid) for pid in Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()]
    assert len(children) == 2, f"expected a resident judge and a forker, found {children}"
    named = {pid: Path(f"/proc/{pid}/comm").read_text().strip() for pid in children}
    judges = [pid for pid in children if named[pid] == "trl-judge"]
    assert len(judges) == 1, named
    (forker,) = set(children) - set(judges)
    return judges[0], forker


def process_faults(pid: int) -> tuple[int, int]:
    """A process's page faults that needed no I/O, and those of the children it reaped. After a
    fork every private page is shared copy-on-write: the first write to one, by the parent or by
    the child, is such a fault (a page copy while the other still maps it)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[7]), int(fields[8])


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
    fault_sums: dict[str, int] = {}
    host = {"host: build the program": 0.0, "host: send, wait, receive (transport)": 0.0,
            "host: read the verdict and compare": 0.0}
    try:
        sup = int(Path(f"/proc/{box.pid}/task/{box.pid}/children").read_text().split()[0])
        passed = 0
        for i in range(count + 1):  # the first starts the resident judge: not counted
            if i == 1:
                judge, forker = resident_of(sup)
                sup0, forker0, judge0 = process_cpu(sup)[0], process_cpu(forker), process_cpu(judge)[0]
                faults0 = process_faults(sup)[:1] + process_faults(forker) + process_faults(judge)[:1]
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
            if i == 0:
                continue
            passed += outcome.status == "passed"
            for label, value in (("host: build the program", t1 - t0), ("host: send, wait, receive (transport)", t2 - t1),
                                 ("host: read the verdict and compare", t3 - t2)):
                host[label] += value
            phase_cpu, phase_faults = phases(result.stderr)
            for label, value in phase_cpu.items():
                sums[label] = sums.get(label, 0.0) + value
            for label, value in phase_faults.items():
                fault_sums[label] = fault_sums.get(label, 0) + value
        sup1, forker1, judge1 = process_cpu(sup)[0], process_cpu(forker), process_cpu(judge)[0]
        faults1 = process_faults(sup)[:1] + process_faults(forker) + process_faults(judge)[:1]
    finally:
        await provider.destroy(box.id)
        await provider.aclose()
    per = {label: 1000 * total / count for label, total in sums.items()}
    per["judge: receive the exec, answer, and what the marks miss"] = max(
        0.0, 1000 * (judge1 - judge0) / count - sum(v for k, v in per.items() if k.startswith("judge:")))
    candidate_total = 1000 * (forker1[1] - forker0[1]) / count  # the forker reaps the candidates
    per[CANDIDATE_REST] = max(0.0, candidate_total - sum(v for k, v in per.items() if k.startswith("candidate:")))
    per[FORKER] = 1000 * (forker1[0] - forker0[0]) / count
    per[SUPERVISOR] = 1000 * (sup1 - sup0) / count
    per.update({label: 1000 * total / count for label, total in host.items()})
    order = ("judge:", "candidate:", "forker:", "supervisor:", "host:")
    per = dict(sorted(per.items(), key=lambda kv: next(i for i, p in enumerate(order) if kv[0].startswith(p))))
    faults = {who: (after - before) / count for who, before, after in
              zip(("supervisor", "forker", "candidate", "judge"), faults0, faults1)}
    # The candidate's faults phase by phase: where its copy-on-write pages are written.
    candidate_faults = {label: total / count for label, total in fault_sums.items()}
    candidate_faults[CANDIDATE_REST] = max(0.0, faults["candidate"] - sum(candidate_faults.values()))
    return {"programs": count, "passed": passed, "cpu_ms_per_program": per, "faults_per_program": faults,
            "candidate_faults_per_program": candidate_faults,
            "sandbox_ms": sum(v for k, v in per.items() if not k.startswith("host")),
            "host_ms": sum(v for k, v in per.items() if k.startswith("host"))}


def print_profile(report: dict) -> None:
    print(f"\nwhere a judged program's CPU goes ({report['programs']} HumanEval programs one at a time, "
          f"{report['passed']} passed; ms per program, and the candidate's page faults per phase):")
    candidate_faults = report.get("candidate_faults_per_program", {})
    for label, ms in report["cpu_ms_per_program"].items():
        faults = f"  {candidate_faults[label]:5.0f} faults" if label in candidate_faults else ""
        print(f"  {label:<52} {ms:6.3f}{faults}")
    print(f"  {'sandbox, all of it':<52} {report['sandbox_ms']:6.3f}")
    print(f"  {'host, all of it':<52} {report['host_ms']:6.3f}")
    faults = report["faults_per_program"]
    print("page faults per program (copy-on-write, mostly): "
          + ", ".join(f"{who} {n:.0f}" for who, n in faults.items()))


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
