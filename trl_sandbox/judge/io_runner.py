"""The judge of whole programs on stdin/stdout, run inside the sandbox (``python3 -I -S -c SOURCE``).

Standard library only, Python 3.8+, Linux. Its stdin is 16 nonce bytes and a JSON payload the host
wrote (``trl_sandbox.judge.io_verdict``): the program's source, its language's compile and run
commands, the tests (input and expected output) and the limits. It compiles once, then runs every
test in a fresh process and decides each test's verdict itself; its one stdout line is
``MARKER NONCE_HEX JSON``. Why each step is as it is:

* **Nothing of the tests is where a program can read it.** The payload arrives on this process's
  stdin and stays in its memory; this process is made non-dumpable first, so a program of the same
  user can neither trace it nor open its ``/proc`` files (memory, file descriptors). A test's input
  reaches the program as a sealed in-memory file on its stdin, nothing else; the expected output
  and a checker's answer file exist only after every process of the test is dead.
* **A test's processes end with the test, however they detached.** This process is a child
  subreaper: whatever a test starts and orphans becomes our child, so a daemon that left its session
  is still found, killed and reaped before the next test (or the checker) starts. Its CPU time then
  counts against the test: the limit is the CPU time of the whole tree, polled while it runs and
  summed again at the end, so extra processes or cores buy nothing.
* **Nothing is left for the next test.** Each test runs in an empty directory of its own with a
  fresh copy of the build (a program cannot patch the binary the next test runs), and every file
  it left in the scratch directories is removed after it.
* **The exit status is never trusted** and output is read with a bound (twice the expected size
  plus 64 KiB): a program that prints a gigabyte is wrong, not a runner out of memory.
"""

import binascii
import json
import os
import time

MARKER = "@@trl-sandbox-verdict@@"
MAX_LATE = 2  # time limits after which a program's remaining tests are not run
# MB a runtime that bounds its own heap by a flag holds beside it (code, metadata, the collector's
# tables; measured: a JVM 17, V8 8, Go 5 at start): the meter's bound for its tests is the row's
# limit plus this.
RUNTIME_MB = 64

if "run" not in globals():
    # On the host (tests, linters) the process helpers are a module of their own. Sent to a sandbox,
    # their text runs first (``trl_sandbox.judge.io_verdict``) and has defined these names.
    from trl_sandbox.judge.io_compare import checker_verdict, contract_files, same_output
    from trl_sandbox.judge.io_process import Cold, guard, kill_all, prctl, remove, run, scratch_entries
    from trl_sandbox.judge.io_warm import WARM_ARGV, Warm, WarmGone


def crash_kind(result):
    """MLE or RE for a process that failed: an allocation refused under the memory limit is MLE.
    Its stderr's start and end: Go's runtime prints its fatal error first, then every goroutine."""
    text = result["err"][:4096] + b"\n" + result["err"][-4096:]
    for mark in (b"MemoryError", b"bad_alloc", b"out of memory", b"OutOfMemoryError", b"Cannot allocate memory",
                 b"memory allocation of", b"heap out of memory",
                 b"cannot allocate memory", b"Array buffer allocation failed"):  # Go's runtime, V8's buffers
        if mark in text:
            return "MLE"
    return "RE"


def short(data, limit=300):
    return data[-limit:].decode("utf-8", "replace")


def snapshot(root):
    """Every file of the build (path, bytes, mode): each test gets a fresh copy."""
    files = []
    for here, _, names in os.walk(root):
        for name in names:
            path = os.path.join(here, name)
            with open(path, "rb") as fh:
                files.append((os.path.relpath(path, root), fh.read(), os.stat(path).st_mode & 0o755))
    return files


def materialise(files, root):
    os.makedirs(root, mode=0o700)
    for rel, data, mode in files:
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data)
        os.chmod(path, mode | 0o400)


class Runner:
    def __init__(self, payload, work, warm=None):
        self.p = payload
        self.work = work
        self.count = 0
        self.clean = None
        self.env = {"PATH": os.environ.get("PATH") or "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
        lang = payload["lang"]
        self.warm = warm
        if not (warm is not None and lang["run"] == WARM_ARGV and not lang.get("compile") and payload.get("warm", True)
                and warm.load(payload["source"], {**self.env, **lang.get("env", {})})):
            if warm is not None:
                warm.stop()
            self.warm = None

    def fresh_dir(self, name):
        self.count += 1
        return os.path.join(self.work, f"{name}-{self.count}")

    def contained(self, argv, files, data, cpu, memory_mb, wall, out_cap, env=None, warm=None, data_mb=0,
                  meter_mb=0):
        """Run ``argv`` (or the ``warm`` interpreter) in a fresh directory holding ``files``;
        afterwards nothing of it is left. ``memory_mb`` is its ``RLIMIT_AS``, ``data_mb`` its
        ``RLIMIT_DATA`` (0: none)."""
        where = self.fresh_dir("run")
        if self.clean is None:
            self.clean = scratch_entries((self.work,))  # as every test leaves them: what it added goes
        before = self.clean
        materialise(files, where)
        spare = (warm.pid,) if warm is not None and warm.ready and not data_mb else ()
        try:
            if spare:
                try:
                    return run(warm, where, data, cpu, memory_mb, wall, out_cap, 64 << 10, spare, meter_mb)
                except WarmGone:
                    pass  # the zygote is gone before the test started: this test and the rest start cold
            return run(Cold(argv, {**self.env, "HOME": where, **(env or {})}, data_mb), where, data, cpu, memory_mb,
                       wall, out_cap, 64 << 10, meter_mb=meter_mb)
        finally:
            remove(where)
            for path in scratch_entries((self.work,)) - before:
                remove(path)

    def found(self, command, where):
        if "/" in command:
            return command.startswith("./") or os.access(command, os.X_OK)
        return any(os.access(os.path.join(d, command), os.X_OK) for d in self.env["PATH"].split(os.pathsep) if d)

    def build(self, lang, source):
        """Compile ``source`` (a dict with file and text) with ``lang``; returns (files, error)."""
        where = self.fresh_dir("build")
        os.makedirs(where, mode=0o700)
        with open(os.path.join(where, lang["file"]), "w", encoding="utf-8", errors="surrogateescape") as fh:
            fh.write(source)
        missing = [argv[0] for argv in (lang.get("compile"), lang["run"]) if argv and not self.found(argv[0], where)]
        if missing:  # decided before the program's text is anywhere near a process
            remove(where)
            return None, {"ok": False, "kind": "toolchain", "language": lang.get("name"),
                          "message": f"{missing[0]} is not installed in the sandbox"}
        try:
            if lang.get("compile"):
                limit = float(self.p.get("compile_time") or 10.0)
                memory = int(self.p.get("compile_memory_mb") or 0) if lang.get("compile_memory", "as") == "as" else 0
                before = scratch_entries((self.work,))
                argv = list(lang["compile"])
                for include in lang.get("cache_include") or ():
                    # Only a directory no program can have written (read-only here) is trusted.
                    if os.path.isdir(include) and not os.access(include, os.W_OK):
                        argv.insert(1, "-I" + include)
                got = run(Cold(argv, {**self.env, "HOME": where, **lang.get("env", {})}), where, b"", limit,
                          memory, limit * 3 + 5, 64 << 10, 64 << 10)
                for path in scratch_entries((self.work,)) - before:
                    remove(path)
                if got["why"] == "TLE":
                    return None, {"ok": False, "kind": "CE", "message": f"compilation took over {limit:g} s of CPU"}
                if got["status"] != 0:
                    return None, {"ok": False, "kind": "CE", "message": short(got["err"] + got["out"], 2000)}
            return snapshot(where), {"ok": True}
        finally:
            remove(where)

    def judge(self, index, test, files, checker_files):
        lang, p = self.p["lang"], self.p
        want = test["output"].encode("utf-8", "surrogateescape")
        limit = float(test.get("time_limit") or p["time_limit"])
        memory = int(test.get("memory_mb") or p["memory_mb"])
        argv = [a.replace("{memory_mb}", str(memory)) for a in lang["run"]]
        mode = lang.get("memory", "as")
        # A runtime that bounds its heap by a flag writes more than it holds (thread stacks it never
        # touches, a heap committed up front): its writable memory (RLIMIT_DATA) may be its
        # ``runtime_mb`` more than the row's limit, what it holds on the meter RUNTIME_MB more.
        data_mb = memory + int(lang["runtime_mb"]) if mode == "flag" and lang.get("runtime_mb") is not None else 0
        got = self.contained(argv, files, test["input"].encode("utf-8", "surrogateescape"), limit,
                             memory if mode == "as" else 0, max(limit * 2, limit + 1.0), 2 * len(want) + (64 << 10),
                             lang.get("env"), self.warm, data_mb, memory + (RUNTIME_MB if mode == "flag" else 0))
        verdict = {"cpu": round(got["cpu"], 4)}
        if got.get("memory") is not None:
            verdict["mb"] = round(got["memory"] / (1 << 20), 1)
        if got["why"] == "TLE":
            return {**verdict, "v": "TLE", "detail": f"over {limit:g} s"}
        if got["why"] == "MLE":
            return {**verdict, "v": "MLE", "detail": f"over {memory} MB"}
        if got["why"] == "OLE":
            return {**verdict, "v": "WA", "detail": "output limit exceeded"}
        raw = got["status"]
        if raw != 0:
            kind = crash_kind(got)
            what = f"signal {os.WTERMSIG(raw)}" if os.WIFSIGNALED(raw) else f"exit status {raw >> 8}"
            return {**verdict, "v": kind, "detail": f"{what}: {short(got['err'] or got['out'], 1500)}"}
        if checker_files is None:
            ok = same_output(got["out"], want, p.get("compare") or "tokens")
            return {**verdict, "v": "AC" if ok else "WA", "detail": "" if ok else "wrong answer"}
        return {**verdict, **self.check(index, test, got["out"], want, checker_files)}

    def check(self, index, test, out, want, checker):
        """The dataset's checker, run under its contract (``io_compare.CHECKER_CONTRACTS``: which
        file is which argument, and how it says yes or no). It runs after every process of the test
        is dead, so the answer file is never within the program's reach."""
        contract = self.p["checker"].get("contract") or "testlib"
        named = contract_files(contract, test["input"].encode("utf-8", "surrogateescape"), out, want)
        files = list(checker) + [(name, data, 0o600) for name, data in named]
        limit = checker_limit(float(test.get("time_limit") or self.p["time_limit"]))
        got = self.contained(self.p["checker"]["run"] + [name for name, _ in named], files, b"", limit,
                             0, 2 * limit + 1, 64 << 10, self.p["checker"].get("env"))
        code = got["status"] >> 8 if os.WIFEXITED(got["status"]) and not got["why"] else None
        verdict = checker_verdict(contract, code, got["out"])
        if verdict == "AC":
            return {"v": "AC", "detail": ""}
        if verdict == "WA":
            return {"v": "WA", "detail": f"the checker rejected it: {short(got['out'] + got['err'], 200)}"}
        failure = got["why"] or ("a signal" if code is None else f"exit status {code}" if code else "no verdict")
        if out != want and self.check(index, test, want, want, checker)["v"] == "AC":
            # The checker broke on this output only (a crash, a hang): the output's fault, not the task's.
            return {"v": "WA", "detail": f"the checker failed on this output ({failure})"}
        raise CheckerBroken(f"the checker failed on test {index + 1} with the expected answer as the output "
                            f"({failure}): {short(got['out'] + got['err'], 300)}")


class CheckerBroken(Exception):
    pass


class Unguarded(Exception):
    """The sandbox refused the filter that keeps tests off the runner: no test runs unguarded."""


def checker_limit(time_limit):
    """CPU seconds for one run of a checker: as much work as the program it checks, twice over."""
    return max(2.0, 2 * time_limit)


def read_exact(count):
    data = b""
    while len(data) < count:
        chunk = os.read(0, min(count - len(data), 1 << 20))
        if not chunk:
            raise SystemExit("trl-sandbox I/O judge: the payload ended early")
        data += chunk
    return data


def main():
    nondumpable = prctl(4, 0)  # PR_SET_DUMPABLE
    prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    warm = Warm()  # forked before anything of stdin is read: it never holds the nonce or a test
    # No process this runner starts may signal, stop, renice or re-limit it or any other process
    # that exists now (the zygote guards itself and the runner); the runner may still end the zygote.
    unguarded = guard(spare=(warm.pid,) if warm.pid else ())
    nonce = read_exact(16)
    payload = json.loads(read_exact(int.from_bytes(read_exact(4), "big")).decode("utf-8", "surrogateescape"))
    verdict = {"v": 1, "nondumpable": nondumpable, "tests": []}
    work = os.path.abspath(os.getcwd())
    runner = Runner(payload, work, warm)  # the program goes to the warm interpreter; no test has been read
    payload["tests"] = json.loads(read_exact(int.from_bytes(read_exact(4), "big")).decode("utf-8", "surrogateescape"))
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    try:
        if unguarded is not None:  # decided before any of the program's processes exists
            raise Unguarded(unguarded)
        files, verdict["load"] = runner.build(payload["lang"], payload["source"])
        checker = None
        if files is not None and payload.get("checker"):
            checker, answer = runner.build(payload["checker"], payload["checker"]["source"])
            if checker is None:
                raise CheckerBroken(f"the checker does not compile: {answer.get('message', '')}")
        if files is not None:
            failed, late, spent, begun = False, 0, 0.0, time.monotonic()
            total = float(payload.get("total_time_limit") or 60.0)
            for index, test in enumerate(payload["tests"]):
                if failed and payload.get("stop_on_fail"):
                    verdict["tests"].append({"v": "skipped", "cpu": 0})
                    continue
                # A program slow on every test (or asleep on each) must not hold the sandbox past the
                # reward call's deadline, where its failure would score None: past two time limits,
                # or its total CPU (wall: twice that), the rest are time limits without running.
                if late >= MAX_LATE or spent > total or time.monotonic() - begun > 2 * total:
                    verdict["tests"].append({"v": "TLE", "cpu": 0, "detail": "not run: the program's time is spent"})
                    continue
                verdict["tests"].append(runner.judge(index, test, files, checker))
                failed = failed or verdict["tests"][-1]["v"] != "AC"
                late += verdict["tests"][-1]["v"] == "TLE"
                spent += float(verdict["tests"][-1].get("cpu") or 0)
    except CheckerBroken as exc:
        verdict["task_error"] = str(exc)
    except Unguarded as exc:
        verdict["load"] = {"ok": False, "kind": "infra", "message": f"the sandbox refuses the judge's seccomp filter: {exc}"}
    if runner.warm is not None:
        runner.warm.stop()
    kill_all()
    line = MARKER + " " + binascii.hexlify(nonce).decode() + " " + json.dumps(verdict) + "\n"
    os.write(1, line.encode())


if __name__ == "__main__":
    main()
