"""Configuration and shared state of the supervisor, set by ``main.startup()``/``configure()``.

One module holds them so that the others read one place (``state.WORK``) instead of passing a
context through every call of the exec path.
"""

DEVNULL = -1
SPLICE = False  # outputs go pipe -> memfd -> host by os.splice (main.startup checks it works)
USE_PIDFD = True
WAKE_R = WAKE_W = -1  # SIGCHLD wake-up pipe, only where pidfds are missing (Python 3.8)
FD_LIMIT = 1024
WORK = "/work"
OUTPUT_CAP = 1 << 24
PY_NAMES = frozenset()
BASE_PATH = []
STREAMS = {}
ORIGINAL_STDIO = ()  # kept alive so that replacing them in a child frees nothing
RLIMITS = []
PRE_FORK = []  # fork hooks that must give each child fresh state, run in the supervisor instead
CACHE = {}
# Trusted programs sent with the configuration (the judge), their module body already run here:
# source text -> the ``main`` function an exec of exactly that source calls in the forked child.
WARM = {}
WARM_SOURCES = {}  # token (a NUL-led string, never a real argument) -> the source it stands for
SEEN = set()  # hashes of sources compiled once and not kept
CACHE_BYTES = [0]
CACHE_MAX_BYTES = 1 << 20
CACHE_MAX_ENTRIES = 512
# "deny": the seccomp filter refuses the calls that pin memory outside a process's address space
# (SysV shm/msg/sem, memfd); "cgroup": allowed, because a memory cgroup charges them.
MEMORY_MODE = "deny"
# A fresh one-byte shared page per exec (see forkserver.do_exec): 1 when a forked Python child
# died of an uncaught MemoryError.
STATUS = None
# Set for the exec being forked when it is an agent task's verifier (forkserver.do_exec): the
# child then gets a read-only /proc (kernel.read_only_proc).
VERIFIER = False
# Time budgets. "cpu": an exec's timeout is the CPU time its whole process tree may use (however
# detached), checked when it could first have run out; the wall clock only ends what sleeps or
# blocks, at WALL_FACTOR x timeout + WALL_MARGIN_S. "wall": the timeout is wall-clock time.
TIME_BUDGET = "cpu"
WALL_FACTOR = 4.0
WALL_MARGIN_S = 2.0
CLK_TCK = 100
# The judge's and the forker's oom_score_adj: between the supervisor's own (lowest, set at start-up
# from the score it was started with) and the programs' 1000 (``child.set_oom_score``).
OOM_HELPER = 500
