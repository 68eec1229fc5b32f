#!/usr/bin/env python3
"""bench-matrix - every workload x allocator x thread count, repeated; the table and the plot.

  scripts/bench-matrix.sh [--quick] [--threads 1,2,4,8] [--reps N] [--allocators a,b,...]
                          [--workloads pattern,...] [--seconds S] [--out DIR] [--no-install]
                          [--extra NAME=LIB.so] [--plan] [--verbose]
  scripts/bench-matrix.sh --report DIR   (only the report, again, from DIR/runs.csv)

Allocators: glibc (no preload), cmalloc (build/libcmalloc.so), jemalloc, tcmalloc, mimalloc
(the Debian packages' libraries), each switched in with LD_PRELOAD on the very same binaries.
Those that are missing are skipped with a notice: `scripts/deps.sh --bench` (which `make bench`
runs) installs them; --no-install is accepted and does nothing, as this program installs nothing.
--extra NAME=LIB.so adds another allocator (say a cmalloc build with other options); repeatable,
and run whatever --allocators names (which chooses among the allocators above).
--plan prints the workloads, allocators and run count, and runs nothing.
Workloads (WORKLOADS below, each with what it measures): build/bench/{alloc,server,churn,xmalloc,
mstress,larson,rpmalloc}_bench, the order-book replay (build/orderbook, when it exists), cmalloc's
explicit pool and arena against every malloc (build/bench/pool_bench, fixed work, run at one
thread) and unmodified real programs (python3 running bench/real_python.py, sqlite3 running
bench/real_sqlite.sql) timed with hyperfine.

Every (workload, threads) cell is run --reps times for every allocator, and the allocators are
interleaved: repetition r runs all workloads for all allocators before repetition r+1 starts,
and the allocator order rotates from one cell to the next, so drift on a noisy machine (other
jobs, thermal, page cache) hits every allocator alike. The medians of the repetitions are
reported. Output in --out (default bench/results/latest/, which git ignores; bench/results/full/
and bench/results/pools/ are the committed runs, written only when --out names them):
  runs.csv     every single run;       matrix.csv  medians, one row per cell and allocator
  matrix.md    a table per workload, ratios to jemalloc;   matrix.png  ops/s and peak RSS plots
  failures.txt the exact command of every run that crashed or printed no result (if any)
  machine.txt  the machine, the run's settings and each allocator's library and version
--quick: short runs (under 3 minutes on a 2-core machine); the default full run: under 30.

How to read the progress: one line, updated in place on a terminal (elsewhere printed every
tenth of the runs; --verbose: every run), "[n/total] rep r/R workload T=threads allocator" then
the run's ops/s, median and 99th-percentile latency and peak RSS (whole programs: wall time);
a run that FAILED keeps its line, with the command to repeat it. At the end the summary is
printed: the table of geometric means against jemalloc and a sentence per workload group
naming the fastest allocator and cmalloc against the fastest other one; the tables of every
workload are in matrix.md (its own "How to read" paragraph says how to read them).
Standard library only; the plot is drawn by gnuplot when it is installed.
"""
import csv
import fcntl
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from fnmatch import fnmatchcase

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def say(msg, err=False):
    print("bench-matrix: " + msg, file=sys.stderr if err else sys.stdout, flush=True)


def die(msg, status=1):
    say(msg, err=True)
    sys.exit(status)


# ---- the workloads ---------------------------------------------------------------------------
# kind: bench = a build/bench program printing a RESULT line, one run per thread count
#         (--threads/--seconds/--warmup/--label are added to its command);
#       explicit, explicit+arena = a bench program with fixed work (pool_bench), run at one
#         thread only, whose malloc runs under every allocator and which also runs as the
#         pseudo-allocators cmalloc-pool (--alloc pool) and, for explicit+arena, cmalloc-arena;
#       orderbook = the build/orderbook replay of a generated stream, peak RSS from peak_rss;
#       program = a whole unmodified program under hyperfine; threads do not apply (run once,
#         listed as threads 1). Its command's first word is looked up on PATH when it runs.
# command: split as the shell would (shlex), so one argument may hold spaces.
# The order here is the order of the runs and of matrix.md.
def _pool_workloads():
    rows = [("pool-16x1m", "explicit+arena",
             "build/bench/pool_bench --count 1000000 --size 16 --free-order fifo",
             "pool_bench --count 1000000 --size 16: 1,000,000 allocations of 16 bytes, each "
             "pointer kept, then each freed in allocation order; median of 7 rounds. "
             "Ops are objects allocated and freed. cmalloc-pool: cmalloc_pool_alloc/free; "
             "cmalloc-arena: cmalloc_arena_alloc, then one reset.")]
    for size in (8, 24):
        for order, said in (("fifo", "allocation order"), ("random", "a random order")):
            rows.append(("pool-%dx512k-%s" % (size, order), "explicit",
                         "build/bench/pool_bench --count 524288 --size %d --free-order %s"
                         % (size, order),
                         "pool_bench --count 524288 --size %d, frees in %s." % (size, said)))
    return rows


WORKLOADS = [  # (name, kind, command, what it measures: the paragraph under its matrix.md title)
    ("alloc-immediate-64", "bench",
     "build/bench/alloc_bench --mode=immediate --size-dist=fixed --size 64",
     "alloc_bench --mode=immediate --size 64: malloc, touch, free of one 64-byte object per op, "
     "per thread. The thread-cache fast path."),
    ("alloc-window-mixed", "bench",
     "build/bench/alloc_bench --mode=window --size-dist=mixed --size 4096 --window 4096",
     "alloc_bench --mode=window --size-dist=mixed --size 4096 --window 4096: each thread frees "
     "its oldest of 4096 live objects (16 B..4 KiB, log-uniform) and allocates a new one."),
    ("alloc-window-powerlaw", "bench",
     "build/bench/alloc_bench --mode=window --size-dist=powerlaw --size 1048576 --window 1024",
     "alloc_bench --mode=window --size-dist=powerlaw --size 1M --window 1024: as above with "
     "heavy-tailed sizes up to 1 MiB (large blocks churned)."),
    ("alloc-crossthread", "bench",
     "build/bench/alloc_bench --mode=crossthread --size-dist=mixed --size 1024",
     "alloc_bench --mode=crossthread --size-dist=mixed --size 1024: T producer threads "
     "allocate, T consumer threads free (2T threads); every free is remote."),
    ("server", "bench", "build/bench/server_bench --slots 16384 --max-size 8192",
     "server_bench: requests make 1-4 temporaries and replace a random slot of a shared "
     "16384-object table (16 B..8 KiB); most table frees are another thread's memory. Ops are "
     "requests; latency is per request."),
    ("churn", "bench", "build/bench/churn_bench --objects 256 --max-size 4096",
     "churn_bench: rounds of T short-lived threads, each allocating 256 objects, freeing half "
     "and the previous thread's leftovers, then exiting. Ops are threads; latency is a thread's "
     "whole work."),
    # three server patterns, written here from their descriptions (see each .c's head)
    ("xmalloc", "bench", "build/bench/xmalloc_bench --batch 4096 --size 64 --queue 100",
     "xmalloc_bench: T producer threads allocate 64-byte objects in batches of 4096 (the 32 KiB "
     "batch array itself malloc'd) and pass them through a locked queue of at most 100 batches "
     "to T consumer threads that free them (2T threads). Ops are object frees."),
    ("mstress", "bench", "build/bench/mstress_bench --slots 1000 --life 10000",
     "mstress_bench: T lanes of short-lived threads (10000 calls each) doing random-size "
     "malloc/free (8 B..1 KiB, 1% up to 64 KiB) over 1000 slots; each thread hands about half "
     "its live blocks to its successor. Ops are malloc and free calls."),
    ("larson", "bench", "build/bench/larson_bench --window 5000 --round 50000",
     "larson_bench: T lanes, each a window of 5000 blocks (8..1000 B) replaced at random; every "
     "50000 replacements the window passes to a new thread and the old one exits. Ops are "
     "replacements (a free and a malloc)."),
    ("rpmalloc", "bench", "build/bench/rpmalloc_bench --blocks 1000 --round 100 --max-size 16384",
     "rpmalloc_bench: T threads each keep 1000 blocks (8 B..16 KiB, log-uniform) and replace "
     "100 at a time; every second round's 100 go to the next thread, which frees them (half "
     "of all frees remote). Ops are replacements (a malloc and a free)."),
    # cmalloc's pool and arena against every allocator's malloc: N allocations, then N frees;
    # cmalloc-pool / cmalloc-arena are those runs with cmalloc preloaded and --alloc pool/arena
    *_pool_workloads(),
    ("orderbook", "orderbook", "build/orderbook replay",
     "build/orderbook replay: the order-book driver replaying a generated message stream, T "
     "independent books on T threads, each book replaying it --passes times (a fresh book "
     "each time). Ops are messages; latency per message. cmalloc-pool: "
     "cmalloc with --alloc pool (orders from cmalloc's object pool)."),
    ("orderbook-pipeline", "orderbook", "build/orderbook replay --pipeline",
     "build/orderbook replay --pipeline: as above with a gateway thread per book allocating "
     "orders that the matcher thread frees (2T threads)."),
    ("python", "program", "python3 bench/real_python.py",
     "unmodified /usr/bin/python3 running bench/real_python.py (dicts, strings, JSON, sorts), "
     "timed whole with hyperfine. Lower wall time is better."),
    ("sqlite", "program", "sqlite3 :memory: '.read bench/real_sqlite.sql'",
     "unmodified sqlite3 running bench/real_sqlite.sql on an in-memory database, timed whole "
     "with hyperfine. Lower wall time is better."),
]
ABOUT = {name: about for name, _, _, about in WORKLOADS}

# The programs the matrix runs, snapshotted before the first run (see snapshot()).
OWN_BINS = ["build/bench/" + b for b in ("alloc_bench", "server_bench", "churn_bench", "peak_rss",
                                         "pool_bench", "xmalloc_bench", "mstress_bench",
                                         "larson_bench", "rpmalloc_bench")]

# (name, library file names tried in order, Debian package whose version machine.txt shows)
SYSTEM_ALLOCATORS = [
    ("jemalloc", ["libjemalloc.so.2", "libjemalloc.so"], "libjemalloc2"),
    ("tcmalloc", ["libtcmalloc_minimal.so.4", "libtcmalloc.so.4", "libtcmalloc_minimal.so"],
     "libtcmalloc-minimal4"),
    ("mimalloc", ["libmimalloc.so.2", "libmimalloc.so.2.0", "libmimalloc.so"], "libmimalloc2.0"),
]
PACKAGE_OF = {name: pkg for name, _, pkg in SYSTEM_ALLOCATORS}

# Run lengths. quick: ~0.15 s a run, 3 repetitions; full: ~1.1 s a run, 5 repetitions.
# hf_*: hyperfine runs (and warm-up runs) of each whole program per repetition.
# ob_*: the order book's stream and its passes (each book replays it ob_passes times, a fresh
# book each time): one pass of 500,000 messages is about 20 ms, too short a run to time on a
# shared machine, where a single preemption moved a cell's median by 20%.
MODES = {
    "quick": dict(reps=3, seconds="0.08", warmup="0.02", hf_runs=1, hf_warmup=0,
                  ob_messages=100000, ob_passes=4),
    "full": dict(reps=5, seconds="0.8", warmup="0.2", hf_runs=2, hf_warmup=1,
                 ob_messages=500000, ob_passes=8),
}

RUNS_HEADER = ("rep,workload,allocator,threads,params,ops_per_sec,wall_s,p50_ns,p99_ns,p999_ns,"
               "max_ns,peak_rss_kib")


def usage(status):
    print(__doc__.strip())
    sys.exit(status)


def parse_args(argv):
    """The options as the shell version took them: --opt value or --opt=value."""
    opt = dict(quick=False, threads="1,2,4,8", reps=None, allocators="", workloads="",
               seconds=None, out="bench/results/latest", plan=False, extras=[], report=None,
               verbose=False)
    valued = {"--threads": "threads", "--reps": "reps", "--allocators": "allocators",
              "--workloads": "workloads", "--seconds": "seconds", "--out": "out",
              "--extra": "extras", "--report": "report"}
    i = 0
    while i < len(argv):
        a = argv[i]
        key, eq, val = a.partition("=")
        if a == "--quick":
            opt["quick"] = True
        elif a == "--no-install":
            pass  # packages come from scripts/deps.sh --bench; kept so old commands still work
        elif a == "--plan":
            opt["plan"] = True
        elif a == "--verbose":
            opt["verbose"] = True
        elif a in ("-h", "--help"):
            usage(0)
        elif (eq and key in valued) or (a in valued and i + 1 < len(argv)):
            if not eq:
                key, val = a, argv[i + 1]
                i += 1
            if key == "--extra":
                opt["extras"].append(val)
            else:
                opt[valued[key]] = val
        else:
            say("unknown option '%s'" % a, err=True)
            usage(2)
        i += 1
    if not re.fullmatch(r"[0-9,]+", opt["threads"]):
        die("--threads wants a list like 1,2,4", 2)
    opt["threads"] = [t for t in opt["threads"].split(",") if t]
    mode = MODES["quick" if opt["quick"] else "full"]
    # (an empty --reps= or --seconds= means the mode's default, as it did in the shell version)
    opt["reps"] = opt["reps"] or str(mode["reps"])
    opt["seconds"] = opt["seconds"] or mode["seconds"]
    if not opt["reps"].isdigit() or int(opt["reps"]) == 0:
        die("--reps wants a positive number", 2)
    opt["reps"] = int(opt["reps"])
    if not re.fullmatch(r"[0-9]*\.?[0-9]*", opt["seconds"]) or opt["seconds"] in ("", "."):
        die("--seconds wants a number like 0.5", 2)
    return opt


# ---- small helpers ---------------------------------------------------------------------------
def quiet(cmd, **kw):
    """Runs cmd with its output captured; returns (status, stdout and stderr together)."""
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           errors="replace", **kw)
    except OSError as e:
        return 127, str(e)
    return r.returncode, r.stdout


def first_line(text):
    return text.split("\n", 1)[0]


def human(x):
    """A number to 3 significant digits with k/M/G; '-' for none."""
    if x is None:
        return "-"
    for div, suf in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return "%.3g%s" % (x / div, suf)
    return "%.3g" % x


def num(s):
    """A CSV or program field as a finite float, or None."""
    if s is None or s == "":
        return None
    try:
        v = float(s)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def shell_status(returncode):
    """A child's status as a shell reports it: 128 + N when signal N killed it (subprocess says
    -N), so failures.txt reads the same as the exit statuses peak_rss and hyperfine pass on."""
    return 128 - returncode if returncode < 0 else returncode


def signal_name(status):
    try:
        return signal.Signals(status - 128).name[3:]
    except ValueError:
        return str(status - 128)


class Matrix:
    """One matrix run: the allocators and workloads chosen, then the runs in their order."""

    def __init__(self, opt):
        self.opt = opt
        self.mode = "quick" if opt["quick"] else "full"
        m = MODES[self.mode]
        self.reps, self.seconds, self.warmup = opt["reps"], opt["seconds"], m["warmup"]
        self.hf_runs, self.hf_warmup = m["hf_runs"], m["hf_warmup"]
        self.ob_messages, self.ob_passes = m["ob_messages"], m["ob_passes"]
        self.threads = opt["threads"]
        self.out = opt["out"]
        self.alloc_names, self.alloc_lib = [], {}
        self.explicit_extra = []  # cmalloc-pool, cmalloc-arena once pool_bench runs them
        self.ob_pool = False  # the order book's --alloc pool works under cmalloc
        self.ob_file, self.ob_ready = "", False  # the order-book stream, made at its first use
        self.n = 0  # runs done (or skipped), for the progress lines
        self.verbose, self.tty, self.open_line = opt["verbose"], sys.stdout.isatty(), False
        # seconds a single run may take before it is killed
        self.limit = int(30 + 10 * (float(self.seconds) + float(self.warmup)))

    # ---- allocators ----
    def add_alloc(self, name, lib, extra=False):
        # --allocators chooses among the allocators found here; an --extra is always run (naming
        # its library asks for it: a list that left it out dropped it without a word)
        if not extra and self.opt["allocators"] and name not in self.opt["allocators"].split(","):
            return
        if lib:
            # the library must load and work: a trivial program under it must run cleanly
            rc, err = quiet(["/bin/true"], env=dict(os.environ, LD_PRELOAD=lib))
            if rc != 0 or err:
                say("notice: skipping %s: LD_PRELOAD=%s /bin/true fails: %s"
                    % (name, lib, first_line(err)))
                return
        self.alloc_lib[name] = lib
        self.alloc_names.append(name)

    def find_allocators(self):
        self.add_alloc("glibc", "")
        if os.path.exists("build/libcmalloc.so"):
            self.add_alloc("cmalloc", os.path.join(ROOT, "build/libcmalloc.so"))
        else:
            say("notice: build/libcmalloc.so is missing (make all failed?); cmalloc skipped")
        dirs = ["/usr/lib/%s-linux-gnu" % platform.machine(), "/usr/lib64", "/usr/lib",
                "/usr/local/lib"]
        for name, files, _ in SYSTEM_ALLOCATORS:
            found = [os.path.join(d, f) for f in files for d in dirs
                     if os.path.exists(os.path.join(d, f))]
            if found:
                self.add_alloc(name, found[0])
            else:
                say("notice: %s is not installed; skipped" % name)
        for x in self.opt["extras"]:
            name, eq, lib = x.partition("=")
            if not eq:
                die("--extra wants NAME=LIB.so", 2)
            if os.path.exists(lib):
                self.add_alloc(name, os.path.abspath(lib), extra=True)
            else:
                say("notice: --extra %s: no such library" % x)
        if not self.alloc_names:
            die("no allocator to run")

    def cmalloc_runs(self, cmd):
        """Whether cmd runs cleanly with cmalloc preloaded."""
        return quiet(cmd, env=dict(os.environ, LD_PRELOAD=self.alloc_lib["cmalloc"]))[0] == 0

    # ---- workloads ----
    def choose_workloads(self):
        patterns = [p for p in self.opt["workloads"].split(",") if p]
        chosen = []
        for name, kind, cmd, _ in WORKLOADS:
            if patterns and not any(fnmatchcase(name, p) for p in patterns):
                continue
            chosen.append((name, kind, shlex.split(cmd)))
        have_cmalloc = "cmalloc" in self.alloc_lib
        if have_cmalloc and not self.opt["plan"]:
            if all(self.cmalloc_runs(["build/bench/pool_bench", "--alloc", a, "--count", "1000",
                                      "--rounds", "1"]) for a in ("pool", "arena")):
                self.explicit_extra = ["cmalloc-pool", "cmalloc-arena"]
            else:
                say("notice: build/bench/pool_bench --alloc pool/arena does not run under "
                    "cmalloc; cmalloc-pool and cmalloc-arena skipped")
        if not os.access("build/orderbook", os.X_OK):
            say("notice: build/orderbook is missing; the order-book replay is skipped")
            chosen = [w for w in chosen if w[1] != "orderbook"]
        elif have_cmalloc:
            # the order book can take its orders from cmalloc's object pool: run that as one
            # more "allocator", cmalloc-pool, when cmalloc is in the matrix and its pool API works
            fd, probe = tempfile.mkstemp(prefix="bench-matrix-probe.", dir=tempfile.gettempdir())
            try:
                with os.fdopen(fd, "w") as f:
                    gen = subprocess.run(["build/orderbook", "gen", "--messages", "2000",
                                          "--seed", "1"], stdout=f, stderr=subprocess.DEVNULL)
                self.ob_pool = gen.returncode == 0 and \
                    self.cmalloc_runs(["build/orderbook", "replay", probe, "--alloc", "pool"])
            finally:
                os.unlink(probe)
            if not self.ob_pool:
                say("notice: the order book's --alloc pool does not run under cmalloc; "
                    "cmalloc-pool skipped")
        if not shutil.which("hyperfine"):
            say("notice: hyperfine is missing; the real-program workloads are skipped")
            chosen = [w for w in chosen if w[1] != "program"]
        else:
            for w in [w for w in chosen if w[1] == "program"]:
                # python3: the system's own, as the README's figures are for /usr/bin/python3
                prog = "/usr/bin/python3" if w[2][0] == "python3" and \
                    os.access("/usr/bin/python3", os.X_OK) else shutil.which(w[2][0])
                if prog:
                    w[2][0] = prog
                else:
                    say("notice: %s is missing; the %s workload is skipped" % (w[2][0], w[0]))
                    chosen.remove(w)
        if not chosen:
            die("no workload selected")
        self.workloads = chosen

    def extras_of(self, kind):
        """The pseudo-allocators that run a workload of this kind besides the real ones."""
        if kind == "explicit":
            return self.explicit_extra[:1]
        if kind == "explicit+arena":
            return self.explicit_extra
        if kind == "orderbook" and self.ob_pool:
            return ["cmalloc-pool"]
        return []

    def cell_threads(self, kind):
        # fixed work and whole programs: one thread
        return ["1"] if kind.startswith("explicit") or kind == "program" else self.threads

    def cell_runs(self, kind):
        return len(self.cell_threads(kind)) * (len(self.alloc_names) + len(self.extras_of(kind)))

    def rotate(self, k, extra=()):
        """The allocator list (plus extra) rotated left by k."""
        arr = self.alloc_names + list(extra)
        return [arr[(i + k) % len(arr)] for i in range(len(arr))]

    def announce(self):
        self.total = self.reps * sum(self.cell_runs(kind) for _, kind, _ in self.workloads)
        say("%s run: %d workloads x {%s} x threads {%s} x %d repetitions = %d runs"
            % (self.mode, len(self.workloads), " ".join(self.alloc_names),
               " ".join(self.threads), self.reps, self.total))
        say("%ss measured per run (+%ss warm-up); medians reported; output in %s/"
            % (self.seconds, self.warmup, self.out))

    def print_plan(self):
        for name, kind, cmd in self.workloads:
            print("  workload: %s %s %s" % (name, kind, " ".join(cmd)))
        for a in self.alloc_names:
            print("  allocator: %s %s" % (a, self.alloc_lib[a] or "(no preload)"))
        if self.ob_pool:
            print("  allocator: cmalloc-pool (order book: cmalloc with --alloc pool)")
        print("  pseudo-allocators of pool_bench: cmalloc-pool cmalloc-arena (probed when the "
              "matrix runs)")

    # ---- before the runs ----
    def lock(self):
        """One matrix at a time per output directory (the working tree may be shared)."""
        self.lock_file = open(os.path.join(self.out, ".lock"), "w")
        try:
            fcntl.flock(self.lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError:
            say("another bench-matrix run is writing %s; waiting for it (up to 15 min)" % self.out)
        deadline = time.time() + 900
        while time.time() < deadline:
            time.sleep(1)
            try:
                fcntl.flock(self.lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except OSError:
                pass
        die("gave up waiting for %s/.lock" % self.out)

    def snapshot(self):
        """Copies the programs and cmalloc's library: the working tree may be rebuilt while the
        matrix runs, and every run of the matrix must use the very same files. (Messages show
        the originals.)"""
        self.snap = os.path.join(self.tmp, "snap")
        os.makedirs(os.path.join(self.snap, "bench"))
        for b in OWN_BINS:
            shutil.copy(b, os.path.join(self.snap, "bench"))
        if os.access("build/orderbook", os.X_OK):
            shutil.copy("build/orderbook", os.path.join(self.snap, "orderbook"))
        self.run_lib = dict(self.alloc_lib)
        if "cmalloc" in self.alloc_lib:
            try:
                shutil.copy(self.alloc_lib["cmalloc"], os.path.join(self.snap, "libcmalloc.so"))
                self.run_lib["cmalloc"] = os.path.join(self.snap, "libcmalloc.so")
            except OSError as e:
                say("notice: could not snapshot %s: %s" % (self.alloc_lib["cmalloc"], e))

    def write_machine(self):
        """machine.txt: the machine and the run's settings, for the report."""
        def out(cmd):
            rc, text = quiet(cmd)
            return text.strip() if rc == 0 else ""
        cpu = ""
        try:
            with open("/proc/cpuinfo") as f:
                cpu = next((l.rstrip("\n").split(": ")[-1] for l in f
                            if l.startswith("model name")), "")
        except OSError:
            pass
        head = out(["git", "rev-parse", "--short", "HEAD"])
        dirty = quiet(["git", "diff", "--quiet", "HEAD", "--", "src", "include"])[0] != 0
        uname = os.uname()
        lines = ["nproc=%d" % len(os.sched_getaffinity(0)), "cpu=" + cpu,
                 "kernel=%s %s" % (uname.sysname, uname.release),
                 "date=" + time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 "commit=%s%s" % (head or "unknown", " (src/ modified)" if dirty else ""),
                 "mode=" + self.mode, "reps=%d" % self.reps, "seconds=" + self.seconds,
                 "warmup=" + self.warmup, "threads=" + " ".join(self.threads)]
        for a in self.alloc_names:
            v = ""
            if a == "glibc":
                v = first_line(out(["ldd", "--version"])).split(" ")[-1]
            elif a in PACKAGE_OF:
                v = out(["dpkg-query", "-W", "-f=${Version}", PACKAGE_OF[a]])
            elif a == "cmalloc":
                v = head
            lines.append("allocator=%s|%s|%s" % (a, self.alloc_lib[a] or "(none)", v))
        with open(os.path.join(self.out, "machine.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")

    # ---- the runs ----
    def progress(self, line, keep=False):
        """One run's line. On a terminal it replaces the one before (one line updated in
        place), except lines to keep (failures); elsewhere (a log, a pipe) only every tenth
        of the runs and the lines to keep are printed. --verbose: every line, as before."""
        if self.verbose:
            print(line, flush=True)
        elif self.tty:
            width = shutil.get_terminal_size().columns - 1
            sys.stdout.write("\r\033[K" + (line if keep else line[:width]) + ("\n" if keep else ""))
            sys.stdout.flush()
            self.open_line = not keep
        elif keep or self.n * 10 // self.total != (self.n - 1) * 10 // self.total:
            print(line, flush=True)

    def end_progress(self):
        if self.open_line:
            sys.stdout.write("\r\033[K")
            sys.stdout.flush()
            self.open_line = False

    def prefix(self, rep, name, t, a):
        self.n += 1
        return "[%4d/%d] rep %d/%d %-21s T=%-2s %-12s" % (self.n, self.total, rep, self.reps,
                                                           name, t, a)

    def record_failure(self, name, a, t, status, shown, output, prefix, why):
        """failures.txt gets the run and its exact command (and the output's last lines);
        the progress line says FAILED with the same command."""
        sig = " (signal %s)" % signal_name(status) if isinstance(status, int) and \
            status > 128 else ""
        lines = ["== %s allocator=%s threads=%s: exit %s%s" % (name, a, t, status, sig),
                 "   command: " + shown]
        try:
            with open(output, errors="replace") as f:
                lines += ["   | " + l for l in f.read().splitlines()[-5:]]
        except OSError:
            pass
        with open(self.failures, "a") as f:
            f.write("\n".join(lines) + "\n")
        self.progress("%s FAILED (%s): %s" % (prefix, why, shown), keep=True)

    def prepare_orderbook(self):
        """Generates the order-book stream once, at its first use; False when that failed."""
        if not self.ob_ready:
            self.ob_ready = True
            self.ob_file = os.path.join(self.tmp, "orders.txt")
            say("generating %d order-book messages (seed 1)" % self.ob_messages)
            err = os.path.join(self.tmp, "gen.err")
            with open(self.ob_file, "w") as o, open(err, "w") as e:
                rc = subprocess.run([os.path.join(self.snap, "orderbook"), "gen", "--messages",
                                     str(self.ob_messages), "--seed", "1"], stdout=o,
                                    stderr=e).returncode
            if rc != 0:
                with open(err, errors="replace") as e:
                    say("notice: build/orderbook gen failed: %s; order book skipped"
                        % first_line(e.read()))
                self.ob_file = ""
        return self.ob_file != ""

    @staticmethod
    def parse_result(texts, name, t, params):
        """One run's figures from its output: a bench program's RESULT line, or the order
        book's "key: value" summary plus peak_rss's "peak_rss_kib=N" line; None if neither."""
        v, ob, rss, got = {}, {}, "", False
        for line in "\n".join(texts).split("\n"):
            if line.startswith("RESULT "):
                for field in line.split()[1:]:
                    k, _, val = field.partition("=")
                    v[k] = val
                got = True
            if line.startswith("messages_per_second:"):
                got = True
            if re.match(r"[a-z_0-9]+: ", line):
                f = line.split()
                ob[f[0][:-1]] = f[1] if len(f) > 1 else ""
            if line.startswith("peak_rss_kib="):
                rss = line[len("peak_rss_kib="):]
        if not got:
            return None
        if "ops_per_sec" not in v:
            v = dict(workload=name, threads=t, params=params,
                     ops_per_sec=ob.get("messages_per_second", ""), wall_s=ob.get("seconds", ""),
                     p50_ns=ob.get("latency_p50_ns", ""), p99_ns=ob.get("latency_p99_ns", ""),
                     p999_ns=ob.get("latency_p999_ns", ""), max_ns=ob.get("latency_max_ns", ""),
                     peak_rss_kib=rss)
        return v

    def run_bench_cell(self, rep, kind, t, a, name, cmd):
        cmd = list(cmd)
        real = "cmalloc" if a in ("cmalloc-pool", "cmalloc-arena") else a
        lib, rlib = self.alloc_lib[real], self.run_lib[real]
        if real != a:
            cmd += ["--alloc", a[len("cmalloc-"):]]
        params = ""
        if kind != "orderbook":
            cmd += ["--threads", t, "--seconds", self.seconds, "--warmup", self.warmup,
                    "--label", name]
        else:
            cmd = cmd[:2] + [self.ob_file] + cmd[2:] + ["--threads", t, "--passes",
                                                        str(self.ob_passes)]
            params = "messages=%d;passes=%d" % (self.ob_messages, self.ob_passes) + (
                ";pipeline" if "--pipeline" in cmd else "")
        exe = [os.path.join(self.snap, cmd[0][len("build/"):])] + cmd[1:]  # the snapshot's
        preload = ["env"] + (["LD_PRELOAD=" + rlib] if rlib else [])
        timeout = ["timeout", "-k", "5", str(self.limit)]
        if kind == "orderbook":
            # peak_rss measures the replay, which does not report its own peak RSS
            argv = timeout + [os.path.join(self.snap, "bench/peak_rss"), "--"] + preload + exe
        else:
            argv = preload + timeout + exe
        o, e = os.path.join(self.tmp, "out"), os.path.join(self.tmp, "err")
        start = time.time()
        with open(o, "w") as fo, open(e, "w") as fe:
            rc = shell_status(subprocess.run(argv, stdout=fo, stderr=fe).returncode)
        took = time.time() - start
        prefix = self.prefix(rep, name, t, a)
        texts = []
        for path in (o, e):
            with open(path, errors="replace") as f:
                texts.append(f.read())
        v = self.parse_result(texts, name, t, params) if rc == 0 else None
        if v is None:
            shown = ("LD_PRELOAD=%s " % lib if lib else "") + " ".join(cmd)
            if kind == "orderbook":
                shown = "build/orderbook gen --messages %d --seed 1 > orders.txt && %s" % (
                    self.ob_messages, shown.replace(self.ob_file, "orders.txt", 1))
            status = rc if rc != 0 else "0, no result printed"
            self.record_failure(name, a, t, status, shown, e, prefix, "exit %s" % status)
            return
        fields = [v.get(k, "") for k in ("workload", "threads", "params", "ops_per_sec",
                                         "wall_s", "p50_ns", "p99_ns", "p999_ns", "max_ns",
                                         "peak_rss_kib")]
        self.runs.write("%d,%s,%s,%s\n" % (rep, fields[0], a, ",".join(fields[1:])))
        self.runs.flush()
        ops = v.get("ops_per_sec")
        self.progress("%s %s ops/s  p50 %s ns  p99 %s ns  peak RSS %.1f MiB  (%.1f s)"
                      % (prefix, human((num(ops) or 0.0) if ops else None),
                         v.get("p50_ns") or "-", v.get("p99_ns") or "-",
                         (num(v.get("peak_rss_kib")) or 0) / 1024, took))

    def run_program_cell(self, rep, name, cmd):
        """One hyperfine invocation, every allocator a command of it, in rotated order."""
        m = re.search(r"bench/[^ ]*", " ".join(cmd))
        params = "%s;%s" % (os.path.basename(cmd[0]), m.group(0) if m else "")
        order = self.rotate(rep)
        args = []
        for a in order:
            rss = os.path.join(self.tmp, "rss." + a)
            if os.path.exists(rss):
                os.unlink(rss)
            # hyperfine -N runs the command without a shell: the same argv for every allocator
            c = ["%s/bench/peak_rss" % self.snap, "--append", rss, "--", "env"]
            if self.run_lib[a]:
                c.append("LD_PRELOAD=" + self.run_lib[a])
            c += ["'%s'" % x if " " in x else x for x in cmd]
            args += ["-n", a, " ".join(c)]
        hf_json, hf_out = os.path.join(self.tmp, "hf.json"), os.path.join(self.tmp, "hf.out")
        with open(hf_out, "w") as f:
            rc = shell_status(subprocess.run(["hyperfine", "-N", "-i", "--style", "none",
                                              "--warmup", str(self.hf_warmup), "--runs",
                                              str(self.hf_runs), "--export-json", hf_json] + args,
                                             stdout=f, stderr=subprocess.STDOUT).returncode)
        # every command's timed runs, or the exit codes of those that failed
        results = {}
        try:
            with open(hf_json) as f:
                for r in json.load(f)["results"]:
                    codes = [c for c in (r.get("exit_codes") or []) if c]
                    results[r["command"]] = ("fail", codes) if codes else \
                        ("ok", ["%.6f" % x for x in r["times"]])
        except (OSError, ValueError, KeyError):
            pass
        for a in order:
            prefix = self.prefix(rep, name, "1", a)
            status, times = results.get(a, ("", []))
            if rc != 0 or status != "ok" or not times:
                lib = self.alloc_lib[a]
                why, code = "hyperfine exit %d" % rc, rc
                if status == "fail":
                    why, code = "exit status " + " ".join(map(str, times)), times[0]
                self.record_failure(name, a, "1", code, ("LD_PRELOAD=%s " % lib if lib else "")
                                    + " ".join(cmd), hf_out, prefix, why)
                continue
            # the warm-up runs appended figures too: skip them
            try:
                with open(os.path.join(self.tmp, "rss." + a)) as f:
                    rsss = f.read().split()[self.hf_warmup:]
            except OSError:
                rsss = []
            for k, tm in enumerate(times):
                self.runs.write("%d,%s,%s,1,%s,,%s,,,,,%s\n" % (rep, name, a, params, tm,
                                                                rsss[k] if k < len(rsss) else ""))
            self.runs.flush()
            rss0 = "%.1f MiB" % (float(rsss[0]) / 1024) if rsss else "-"
            self.progress("%s %.3f s wall  peak RSS %s" % (
                prefix, sum(map(float, times)) / len(times), rss0))

    def run(self):
        os.makedirs(self.out, exist_ok=True)
        self.lock()
        self.tmp = tempfile.mkdtemp(prefix="bench-matrix.", dir=tempfile.gettempdir())
        try:
            self.snapshot()
            self.failures = os.path.join(self.out, "failures.txt")
            open(self.failures, "w").close()
            self.write_machine()
            with open(os.path.join(self.out, "runs.csv"), "w") as self.runs:
                self.runs.write(RUNS_HEADER + "\n")
                began = time.time()
                cell = 0
                for rep in range(1, self.reps + 1):
                    for name, kind, cmd in self.workloads:
                        if kind == "program":
                            self.run_program_cell(rep, name, cmd)
                            continue
                        if kind == "orderbook" and not self.prepare_orderbook():
                            self.n += self.cell_runs(kind)
                            continue
                        for t in self.cell_threads(kind):
                            cell += 1
                            for a in self.rotate(cell + rep, self.extras_of(kind)):
                                self.run_bench_cell(rep, kind, t, a, name, cmd)
            self.end_progress()
            say("%d runs in %d s" % (self.n, int(time.time() - began)))
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)
        with open(self.failures) as f:
            failed = sum(1 for l in f if l.startswith("=="))
        if failed:
            say("%d runs failed; see %s" % (failed, self.failures))


def build():
    """make bench has built the programs already; run on its own, this brings them up to date."""
    if subprocess.run(["make", "-s"] + OWN_BINS).returncode != 0:
        die("building the benchmark programs failed")
    for target, ok, what in (("build/libcmalloc.so", os.path.exists, "build/libcmalloc.so"),
                             ("build/orderbook", lambda p: os.access(p, os.X_OK), "binary")):
        if quiet(["make", "-s", target])[0] != 0:
            say("notice: make %s failed%s" % (target, "; using the existing " + what
                                               if ok(target) else ""))


# ---- the report: matrix.csv, matrix.md, matrix.png from runs.csv and machine.txt ---------------
COLUMNS = ["workload", "allocator", "threads", "params", "ops_per_sec", "wall_s", "p50_ns",
           "p99_ns", "p999_ns", "max_ns", "peak_rss_kib"]
NUMERIC = COLUMNS[4:]
ALLOC_ORDER = ["glibc", "cmalloc", "cmalloc-pool", "cmalloc-arena", "jemalloc", "tcmalloc",
               "mimalloc"]
BASELINE = "jemalloc"
COLORS = {"glibc": "#7f7f7f", "cmalloc": "#d62728", "cmalloc-pool": "#8c1a1a",
          "cmalloc-arena": "#e377c2", "jemalloc": "#1f77b4", "tcmalloc": "#2ca02c",
          "mimalloc": "#ff7f0e"}


def median_cells(runs):
    """The median of the repetitions of every (workload, allocator, threads, params) cell,
    column by column."""
    cells = {}
    for r in runs:
        cells.setdefault((r["workload"], r["allocator"], r["threads"], r["params"]), []).append(r)
    out = []
    for key, rows in cells.items():
        row = dict(zip(COLUMNS[:4], key))
        for c in NUMERIC:
            vals = [v for v in (num(x.get(c)) for x in rows) if v is not None]
            row[c] = statistics.median(vals) if vals else None
        row["n"] = len(rows)
        out.append(row)
    return out


def fmt_num(v):
    if v is None:
        return ""
    if abs(v) >= 1000 or v == int(v):
        return str(int(round(v)))
    return "%.6g" % v


def ns(v):
    if v is None:
        return "-"
    if v >= 1e6:
        return "%.3g ms" % (v / 1e6)
    if v >= 1e4:
        return "%.3g µs" % (v / 1e3)
    return "%.0f" % v


def speed(row):
    """Higher is better: ops/s, or runs per second for whole-program timings."""
    if row["ops_per_sec"]:
        return row["ops_per_sec"]
    if row["wall_s"]:
        return 1.0 / row["wall_s"]
    return None


def read_machine(path):
    info = {"allocator": []}
    if not os.path.exists(path):
        return info
    with open(path) as f:
        for line in f:
            k, _, v = line.rstrip("\n").partition("=")
            if k == "allocator":
                info["allocator"].append(v.split("|"))
            else:
                info[k] = v
    return info


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def ratios_to_baseline(pairs):
    """Geometric means of speed and of peak RSS over (cell, jemalloc's cell) pairs, as text."""
    sr, rr = [], []
    for c, b in pairs:
        if not c or not b:
            continue
        if speed(c) and speed(b):
            sr.append(speed(c) / speed(b))
        if c["peak_rss_kib"] and b["peak_rss_kib"]:
            rr.append(c["peak_rss_kib"] / b["peak_rss_kib"])
    gs, gr = geomean(sr), geomean(rr)
    return ("%.2f" % gs if gs else "-"), ("%.2f" % gr if gr else "-"), len(sr)


def group_of(workload):
    """The group a workload is summed up in: its name up to the first '-' (alloc-*, pool-*,
    orderbook-*), the whole programs together."""
    return "programs" if workload in ("python", "sqlite") else workload.split("-")[0]


def summary_lines(cells, workloads, allocs):
    """The summary table (geometric means of speed and peak RSS against jemalloc over every
    cell an allocator ran; one that ran a single cell is listed under it with that cell's
    figures, not as a mean) and a sentence per workload group: the fastest allocator there and
    cmalloc against the fastest of the other allocators (not cmalloc's own pool or arena),
    each a geometric mean over the group's cells."""
    by = {(c["workload"], c["threads"], c["allocator"]): c for c in cells}
    keys = sorted({(c["workload"], c["threads"]) for c in cells})
    ran = {a: [k for k in keys if k + (a,) in by] for a in allocs}
    wins = {a: 0 for a in allocs}
    for k in keys:
        best = max(allocs, key=lambda a: speed(by[k + (a,)]) or 0 if k + (a,) in by else 0)
        if k + (best,) in by and speed(by[k + (best,)]):
            wins[best] += 1
    L = ["## Summary\n",
         "Geometric means over every workload and thread count the allocator ran (higher speed "
         "and lower memory are better).\n",
         "| allocator | speed × jemalloc | peak RSS × jemalloc | fastest in | cells |",
         "|---|---:|---:|---:|---:|"]
    single = []
    for a in allocs:
        gs, gr, n = ratios_to_baseline((by.get(k + (a,)), by.get(k + (BASELINE,))) for k in keys)
        if len(ran[a]) == 1:
            single.append("%s ran one cell only (%s, %s thread%s): %s× jemalloc's speed, %s× "
                          "its peak RSS there." % (a, ran[a][0][0], ran[a][0][1],
                                                   "" if ran[a][0][1] == "1" else "s", gs, gr))
            continue
        L.append("| %s | %s | %s | %d of %d | %d |" % (a, gs, gr, wins[a], len(keys), n))
    L.append("")
    if single:
        L.extend(single + [""])
    peers = [a for a in allocs if not a.startswith("cmalloc")]
    for group in dict.fromkeys(group_of(w) for w in workloads):
        gkeys = [k for k in keys if group_of(k[0]) == group]

        def mean_over(a, b, gkeys=gkeys):  # geomean of a's speed over b's, cells both ran
            return geomean([speed(by[k + (a,)]) / speed(by[k + (b,)]) for k in gkeys
                            if k + (a,) in by and k + (b,) in by and speed(by[k + (a,)])
                            and speed(by[k + (b,)])])
        full = [a for a in allocs if all(k + (a,) in by for k in gkeys)]
        if not gkeys or not full:
            continue
        score = {a: geomean([speed(by[k + (a,)]) for k in gkeys]) or 0 for a in full}
        winner = max(full, key=lambda a: score[a])
        names = sorted({k[0] for k in gkeys})
        text = "**%s** (%s; %d cell%s): %s is fastest" % (
            group, ", ".join(names), len(gkeys), "" if len(gkeys) == 1 else "s", winner)
        best_peer = max((a for a in full if a in peers), key=lambda a: score[a], default=None)
        if best_peer and "cmalloc" in full:
            if winner == best_peer:
                r = mean_over("cmalloc", winner)
                text += "; cmalloc is %.2f× %s (%.0f%% slower)" % (r, winner, (1 - r) * 100) \
                    if r < 1 else "; cmalloc is %.2f× %s" % (r, winner)
            else:
                text += ", %.2f× %s, the fastest other allocator" % (
                    mean_over(winner, best_peer), best_peer)
                if winner != "cmalloc":
                    text += "; cmalloc through malloc is %.2f× %s" % (
                        mean_over("cmalloc", best_peer), best_peer)
        L.append(text + ".\n")
    return L


def write_csv(path, cells):
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(COLUMNS)
        for c in cells:
            w.writerow([c[k] for k in COLUMNS[:4]] + [fmt_num(c[k]) for k in NUMERIC])


def write_md(path, cells, workloads, allocs, info, failures, have_png):
    L = []
    L.append("# cmalloc benchmark matrix\n")
    L.append("Measured on %s CPU(s), %s, %s; %s; cmalloc at commit %s. %s run: every figure is "
             "the median of %s repetitions (%s s measured per run, after %s s of warm-up; whole "
             "programs: hyperfine), allocators interleaved within each repetition, the same "
             "binaries for all, switched with LD_PRELOAD.\n" % (
                 info.get("nproc", "?"), info.get("cpu", "?"), info.get("kernel", "?"),
                 info.get("date", "?"), info.get("commit", "?"),
                 info.get("mode", "?").capitalize(), info.get("reps", "?"),
                 info.get("seconds", "?"), info.get("warmup", "?")))
    if info["allocator"]:
        L.append("Allocators: " + "; ".join(
            "%s %s (%s)" % (a[0], a[2] if len(a) > 2 else "", a[1]) for a in info["allocator"])
            + ".\n")
    L.append("How to read: **× je** is speed relative to jemalloc (ops/s ratio, or jemalloc's "
             "wall time over this one for whole programs): above 1.00 is faster than jemalloc. "
             "**RSS × je** is peak resident memory relative to jemalloc: below 1.00 uses less. "
             "Latencies (ns) are percentiles of sampled single operations (see each workload); the "
             "cycle counter on a VM can tick in steps of ~10 ns, so very short operations show "
             "as 0, 10 or 20. The best speed of each thread count is in bold. On a machine with "
             "fewer cores than threads, threads time-share the cores.\n")

    # summary: geometric mean of ratios to jemalloc over every cell, and a sentence a group
    by = {(c["workload"], c["threads"], c["allocator"]): c for c in cells}
    if BASELINE in allocs:
        L.extend(summary_lines(cells, workloads, allocs))
        # the same per workload: one row each, geometric mean over its thread counts
        L.append("Speed × jemalloc by workload (geometric mean over the thread counts; "
                 "peak RSS × jemalloc in brackets):\n")
        L.append("| workload | " + " | ".join(allocs) + " |")
        L.append("|---|" + "---:|" * len(allocs))
        for wl in workloads:
            threads = sorted({c["threads"] for c in cells if c["workload"] == wl}, key=int)
            row = []
            for a in allocs:
                gs, gr, _ = ratios_to_baseline((by.get((wl, t, a)), by.get((wl, t, BASELINE)))
                                               for t in threads)
                row.append("%s (%s)" % (gs, gr) if gs != "-" or gr != "-" else "")
            L.append("| %s | %s |" % (wl, " | ".join(row)))
        L.append("")
    if have_png:
        L.append("![ops/s and peak RSS against threads](matrix.png)\n")

    for wl in workloads:
        wc = [c for c in cells if c["workload"] == wl]
        program = all(c["ops_per_sec"] is None for c in wc)
        L.append("## %s\n" % wl)
        if wl in ABOUT:
            L.append(ABOUT[wl] + "\n")
        params = sorted({c["params"] for c in wc})
        L.append("Parameters: `%s`.\n" % "`, `".join(params))
        if program:
            L.append("| threads | allocator | wall s | × je | peak RSS MiB | RSS × je |")
            L.append("|---:|---|---:|---:|---:|---:|")
        else:
            L.append("| threads | allocator | ops/s | × je | p50 ns | p99 ns | p99.9 ns | max ns "
                     "| peak RSS MiB | RSS × je |")
            L.append("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for t in sorted({int(c["threads"]) for c in wc}):
            t = str(t)
            row_allocs = [a for a in allocs if (wl, t, a) in by]
            best = max((speed(by[(wl, t, a)]) or 0 for a in row_allocs), default=0)
            base = by.get((wl, t, BASELINE))
            for a in row_allocs:
                c = by[(wl, t, a)]
                sp = speed(c)
                ratio = "%.2f" % (sp / speed(base)) if base and sp and speed(base) else "-"
                rss = c["peak_rss_kib"]
                rr = "%.2f" % (rss / base["peak_rss_kib"]) if base and rss and \
                    base["peak_rss_kib"] else "-"
                rss_s = "%.1f" % (rss / 1024) if rss else "-"
                mark = "**" if sp and sp == best and len(row_allocs) > 1 else ""
                if program:
                    L.append("| %s | %s | %s%.3f%s | %s | %s | %s |" % (
                        t, a, mark, c["wall_s"], mark, ratio, rss_s, rr))
                else:
                    L.append("| %s | %s | %s%s%s | %s | %s | %s | %s | %s | %s | %s |" % (
                        t, a, mark, human(c["ops_per_sec"]), mark, ratio, ns(c["p50_ns"]),
                        ns(c["p99_ns"]), ns(c["p999_ns"]), ns(c["max_ns"]), rss_s, rr))
        # (cmalloc-pool runs the order book and pool_bench only, cmalloc-arena pool-16x1m only:
        # not missing elsewhere)
        missing = [a for a in allocs if not any((wl, str(t), a) in by for t in
                                                {int(c["threads"]) for c in wc})
                   and (a != "cmalloc-pool" or wl.startswith(("orderbook", "pool-")))
                   and (a != "cmalloc-arena" or wl == "pool-16x1m")]
        if missing:
            L.append("\nNo result for: %s (see failures below)." % ", ".join(missing))
        L.append("")

    if failures.strip():
        L.append("## Failed runs\n")
        L.append("Every run that crashed, timed out or printed no result, with its exact "
                 "command:\n")
        L.append("```")
        L.append(failures.rstrip())
        L.append("```\n")
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")


def write_png(dirname, cells, workloads, allocs):
    """matrix.png by gnuplot: a pair of panels per workload, ops/s (whole programs: wall time
    as bars) and peak RSS against threads, a line per allocator. False when there is none."""
    gnuplot = shutil.which("gnuplot")
    if not gnuplot:
        say("notice: gnuplot is missing; no matrix.png")
        return False
    data = os.path.join(dirname, "plot-data")
    os.makedirs(data, exist_ok=True)
    panels = []
    for wl in workloads:
        wc = [c for c in cells if c["workload"] == wl]
        program = all(c["ops_per_sec"] is None for c in wc)
        files = []
        for a in allocs:
            rows = sorted(((int(c["threads"]), c) for c in wc if c["allocator"] == a),
                          key=lambda x: x[0])
            if not rows:
                continue
            i = len(files)
            fn = os.path.join(data, "%s.%s.dat" % (wl, a))
            with open(fn, "w") as f:
                for t, c in rows:
                    sp = c["ops_per_sec"] if not program else c["wall_s"]
                    rss = (c["peak_rss_kib"] or 0) / 1024.0
                    f.write("%d %s %.3f %d\n" % (t, sp if sp is not None else "NaN", rss, i))
            files.append((a, fn))
        panels.append((wl, program, files))

    def plot(files, using, style, titled):
        return "plot " + ", ".join('"%s" using %s with %s lc rgb "%s" title "%s"'
                                   % (fn, using, style, COLORS.get(a, "black"),
                                      a if titled else "") for a, fn in files)

    ncols = 4
    nrows = (2 * len(panels) + ncols - 1) // ncols
    width, height = 2000, max(380, 330 * nrows)
    g = []
    g.append('set terminal png size %d,%d font ",9"' % (width, height))
    g.append('set output "%s"' % os.path.join(dirname, "matrix.png"))
    g.append('set multiplot layout %d,%d title "cmalloc benchmark matrix: medians; ops/s (or wall '
             'time) and peak RSS against threads"' % (nrows, ncols))
    g.append("set key outside right top vertical font \",8\" samplen 1 spacing 0.9")
    g.append("set grid")
    g.append("set format y \"%.1s%c\"")
    for wl, program, files in panels:
        threads = sorted({int(c["threads"]) for c in cells if c["workload"] == wl})
        if program:
            # whole programs: a bar per allocator that ran it
            g.append("set xrange [-0.7:%f]" % (len(files) - 0.3))
            g.append("set xtics (%s)" % ", ".join('"%s" %d' % (a, i)
                                                  for i, (a, _) in enumerate(files)))
            g.append('set format y "%g"')
            g.append('set title "%s: wall time (s, lower is better)"' % wl)
            g.append("set yrange [0:*]")
            g.append("set style fill solid 0.7")
            g.append(plot(files, "4:2:(0.6)", "boxes", False))
            g.append('set title "%s: peak RSS (MiB)"' % wl)
            g.append(plot(files, "4:3:(0.6)", "boxes", False))
            g.append('set xtics autofreq; set autoscale x; set yrange [*:*]; set style fill empty; '
                     'set format y "%.1s%c"')
            continue
        g.append("set logscale x 2")
        g.append("set xrange [%f:%f]" % (min(threads) / 1.25, max(threads) * 1.25))
        g.append("set xtics (%s)" % ", ".join('"%d" %d' % (t, t) for t in threads))
        g.append("set yrange [0:*]")
        g.append('set title "%s: ops/s (higher is better)"' % wl)
        g.append(plot(files, "1:2", "linespoints lw 2 pt 7", True))
        g.append('set title "%s: peak RSS (MiB)"' % wl)
        g.append(plot(files, "1:3", "linespoints lw 2 pt 7", True))
        g.append("unset logscale x; set xtics autofreq; set autoscale x")
    g.append("unset multiplot")
    gp = os.path.join(data, "matrix.gp")
    with open(gp, "w") as f:
        f.write("\n".join(g) + "\n")
    r = subprocess.run([gnuplot, gp], capture_output=True, text=True)
    if r.returncode != 0:
        say("notice: gnuplot failed: %s" % r.stderr.strip()[-400:])
        return False
    shutil.rmtree(data, ignore_errors=True)
    return True


def report(d):
    """matrix.csv, matrix.md and matrix.png in d, from d's runs.csv, machine.txt, failures.txt."""
    with open(os.path.join(d, "runs.csv"), newline="") as f:
        cells = median_cells(csv.DictReader(f))
    workloads = list(dict.fromkeys(c["workload"] for c in cells))
    present = {c["allocator"] for c in cells}
    info = read_machine(os.path.join(d, "machine.txt"))
    listed = [a[0] for a in info["allocator"]]
    allocs = [a for a in ALLOC_ORDER if a in present or a in listed]
    allocs += sorted(present - set(allocs))
    fpath = os.path.join(d, "failures.txt")
    failures = ""
    if os.path.exists(fpath):
        with open(fpath) as f:
            failures = f.read()
    cells.sort(key=lambda c: (workloads.index(c["workload"]), int(c["threads"]),
                              allocs.index(c["allocator"])))
    write_csv(os.path.join(d, "matrix.csv"), cells)
    have_png = write_png(d, cells, workloads, allocs) if cells else False
    if not have_png and os.path.exists(os.path.join(d, "matrix.png")):
        os.remove(os.path.join(d, "matrix.png"))
    write_md(os.path.join(d, "matrix.md"), cells, workloads, allocs, info, failures, have_png)
    summary = summary_lines(cells, workloads, allocs) if BASELINE in allocs else []
    return have_png, summary


def write_report(d):
    """The report's files, then its summary on the terminal (the tables stay in the files)."""
    try:
        have_png, summary = report(d)
    except Exception as e:  # the runs are on disk: say so rather than lose them to a traceback
        die("the report failed: %s: %s" % (type(e).__name__, e))
    if summary:  # matrix.md's paragraphs as plain lines, a blank line after the table
        lines = [line.rstrip("\n").replace("**", "") for line in summary[1:] if line.strip()]
        table_end = max(i for i, line in enumerate(lines) if line.startswith("|"))
        print("\n" + "\n".join(lines[:table_end + 1] + [""] + lines[table_end + 1:]))
    say("full tables, one per workload: %s/matrix.md (also %s/matrix.csv%s)"
        % (d, d, ", %s/matrix.png" % d if have_png else ""))


def main(argv):
    os.chdir(ROOT)
    # a terminated run still removes its temporary directory (the finally in Matrix.run)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    opt = parse_args(argv)
    if opt["report"]:
        write_report(opt["report"])
        return 0
    if not opt["plan"]:
        build()
    m = Matrix(opt)
    m.find_allocators()
    m.choose_workloads()
    m.announce()
    if opt["plan"]:
        m.print_plan()
        return 0
    m.run()
    write_report(m.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
