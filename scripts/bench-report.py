#!/usr/bin/env python3
"""bench-report.py - turn a bench-matrix run into matrix.csv, matrix.md and matrix.png.

    python3 scripts/bench-report.py DIR

DIR holds runs.csv (every run), machine.txt and failures.txt as written by
scripts/bench-matrix.sh. For every (workload, allocator, threads, params) cell the median of the
repetitions is taken, column by column, and written to DIR/matrix.csv; DIR/matrix.md has a table
per workload with ratios to jemalloc; DIR/matrix.png (when gnuplot is installed) plots ops/s
against threads, a line per allocator and a panel per workload, and peak RSS beside it.
Standard library only.
"""
import csv
import math
import os
import shutil
import statistics
import subprocess
import sys

COLUMNS = ["workload", "allocator", "threads", "params", "ops_per_sec", "wall_s", "p50_ns",
           "p99_ns", "p999_ns", "max_ns", "peak_rss_kib"]
NUMERIC = COLUMNS[4:]
ALLOC_ORDER = ["glibc", "cmalloc", "cmalloc-pool", "cmalloc-arena", "jemalloc", "tcmalloc", "mimalloc"]
BASELINE = "jemalloc"

ABOUT = {
    "alloc-immediate-64": "alloc_bench --mode=immediate --size 64: malloc, touch, free of one "
                          "64-byte object per op, per thread. The thread-cache fast path.",
    "alloc-window-mixed": "alloc_bench --mode=window --size-dist=mixed --size 4096 --window 4096: "
                          "each thread frees its oldest of 4096 live objects (16 B..4 KiB, "
                          "log-uniform) and allocates a new one.",
    "alloc-window-powerlaw": "alloc_bench --mode=window --size-dist=powerlaw --size 1M --window 1024: "
                             "as above with heavy-tailed sizes up to 1 MiB (large blocks churned).",
    "alloc-crossthread": "alloc_bench --mode=crossthread --size-dist=mixed --size 1024: T producer "
                         "threads allocate, T consumer threads free (2T threads); every free is "
                         "remote.",
    "server": "server_bench: requests make 1-4 temporaries and replace a random slot of a shared "
              "16384-object table (16 B..8 KiB); most table frees are another thread's memory. "
              "Ops are requests; latency is per request.",
    "churn": "churn_bench: rounds of T short-lived threads, each allocating 256 objects, freeing "
             "half and the previous thread's leftovers, then exiting. Ops are threads; latency is "
             "a thread's whole work.",
    "xmalloc": "xmalloc_bench: T producer threads allocate 64-byte objects in batches of 4096 (the "
               "32 KiB batch array itself malloc'd) and pass them through a locked queue of at most "
               "100 batches to T consumer threads that free them (2T threads). Ops are object frees.",
    "mstress": "mstress_bench: T lanes of short-lived threads (10000 calls each) doing random-size "
               "malloc/free (8 B..1 KiB, 1% up to 64 KiB) over 1000 slots; each thread hands about "
               "half its live blocks to its successor. Ops are malloc and free calls.",
    "larson": "larson_bench: T lanes, each a window of 5000 blocks (8..1000 B) replaced at random; "
              "every 50000 replacements the window passes to a new thread and the old one exits. "
              "Ops are replacements (a free and a malloc).",
    "orderbook": "build/orderbook replay: the order-book driver replaying a generated message "
                 "stream, T independent books on T threads. Ops are messages; latency per message. "
                 "cmalloc-pool: cmalloc with --alloc pool (orders from cmalloc's object pool).",
    "orderbook-pipeline": "build/orderbook replay --pipeline: as above with a gateway thread per "
                          "book allocating orders that the matcher thread frees (2T threads).",
    "pool-16x1m": "pool_bench --count 1000000 --size 16: 1,000,000 allocations of 16 bytes (each "
                  "written), then each read and freed in allocation order; median of 7 rounds. "
                  "Ops are objects allocated and freed. cmalloc-pool: cmalloc_pool_alloc/free; "
                  "cmalloc-arena: cmalloc_arena_alloc, then one reset.",
    "pool-8x512k-fifo": "pool_bench --count 524288 --size 8, frees in allocation order.",
    "pool-8x512k-random": "pool_bench --count 524288 --size 8, frees in a random order.",
    "pool-24x512k-fifo": "pool_bench --count 524288 --size 24, frees in allocation order.",
    "pool-24x512k-random": "pool_bench --count 524288 --size 24, frees in a random order.",
    "python": "unmodified /usr/bin/python3 running bench/real_python.py (dicts, strings, JSON, "
              "sorts), timed whole with hyperfine. Lower wall time is better.",
    "sqlite": "unmodified sqlite3 running bench/real_sqlite.sql on an in-memory database, timed "
              "whole with hyperfine. Lower wall time is better.",
}


def num(s):
    if s is None or s == "":
        return None
    try:
        v = float(s)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def load_runs(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def median_cells(runs):
    cells = {}
    order = []
    for r in runs:
        key = (r["workload"], r["allocator"], r["threads"], r["params"])
        if key not in cells:
            cells[key] = []
            order.append(key)
        cells[key].append(r)
    out = []
    for key in order:
        rows = cells[key]
        row = dict(zip(COLUMNS[:4], key))
        for c in NUMERIC:
            vals = [v for v in (num(x.get(c)) for x in rows) if v is not None]
            row[c] = statistics.median(vals) if vals else None
        row["n"] = len(rows)
        out.append(row)
    return out


def fmt_num(v, digits=3):
    if v is None:
        return ""
    if abs(v) >= 1000 or v == int(v):
        return str(int(round(v)))
    return "%.6g" % v


def human(v):
    if v is None:
        return "-"
    for div, suf in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return "%.3g%s" % (v / div, suf)
    return "%.3g" % v


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
    for line in open(path):
        k, _, v = line.rstrip("\n").partition("=")
        if k == "allocator":
            info["allocator"].append(v.split("|"))
        else:
            info[k] = v
    return info


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


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
            "%s %s (%s)" % (a[0], a[2] if len(a) > 2 else "", a[1]) for a in info["allocator"]) + ".\n")
    L.append("How to read: **× je** is speed relative to jemalloc (ops/s ratio, or jemalloc's "
             "wall time over this one for whole programs): above 1.00 is faster than jemalloc. "
             "**RSS × je** is peak resident memory relative to jemalloc: below 1.00 uses less. "
             "Latencies (ns) are percentiles of sampled single operations (see each workload); the "
             "cycle counter on a VM can tick in steps of ~10 ns, so very short operations show "
             "as 0, 10 or 20. The best speed of each thread count is in bold. On a machine with "
             "fewer cores than threads, threads time-share the cores.\n")

    # summary: geometric mean of ratios to jemalloc over every cell
    by = {(c["workload"], c["threads"], c["allocator"]): c for c in cells}
    if BASELINE in allocs:
        L.append("## Summary\n")
        L.append("Geometric means over every workload and thread count that both ran "
                 "(higher speed and lower memory are better).\n")
        L.append("| allocator | speed × jemalloc | peak RSS × jemalloc | fastest in | cells |")
        L.append("|---|---:|---:|---:|---:|")
        keys = sorted({(c["workload"], c["threads"]) for c in cells})
        wins = {a: 0 for a in allocs}
        for k in keys:
            best = max(allocs, key=lambda a: speed(by[k + (a,)]) or 0 if k + (a,) in by else 0)
            if k + (best,) in by and speed(by[k + (best,)]):
                wins[best] += 1
        for a in allocs:
            sr, rr = [], []
            for k in keys:
                c, b = by.get(k + (a,)), by.get(k + (BASELINE,))
                if not c or not b:
                    continue
                if speed(c) and speed(b):
                    sr.append(speed(c) / speed(b))
                if c["peak_rss_kib"] and b["peak_rss_kib"]:
                    rr.append(c["peak_rss_kib"] / b["peak_rss_kib"])
            gs, gr = geomean(sr), geomean(rr)
            L.append("| %s | %s | %s | %d of %d | %d |" % (
                a, "%.2f" % gs if gs else "-", "%.2f" % gr if gr else "-", wins[a], len(keys),
                len(sr)))
        L.append("")
        # the same per workload: one row each, geometric mean over its thread counts
        L.append("Speed × jemalloc by workload (geometric mean over the thread counts; "
                 "peak RSS × jemalloc in brackets):\n")
        L.append("| workload | " + " | ".join(allocs) + " |")
        L.append("|---|" + "---:|" * len(allocs))
        for wl in workloads:
            threads = sorted({c["threads"] for c in cells if c["workload"] == wl}, key=int)
            row = []
            for a in allocs:
                sr, rr = [], []
                for t in threads:
                    c, b = by.get((wl, t, a)), by.get((wl, t, BASELINE))
                    if c and b and speed(c) and speed(b):
                        sr.append(speed(c) / speed(b))
                    if c and b and c["peak_rss_kib"] and b["peak_rss_kib"]:
                        rr.append(c["peak_rss_kib"] / b["peak_rss_kib"])
                gs, gr = geomean(sr), geomean(rr)
                row.append("%s (%s)" % ("%.2f" % gs if gs else "-", "%.2f" % gr if gr else "-")
                           if gs or gr else "")
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
                rr = "%.2f" % (rss / base["peak_rss_kib"]) if base and rss and base["peak_rss_kib"] else "-"
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
                   and (a != "cmalloc-pool" or wl.startswith("orderbook") or wl.startswith("pool-"))
                   and (a != "cmalloc-arena" or wl == "pool-16x1m")]
        if missing:
            L.append("\nNo result for: %s (see failures below)." % ", ".join(missing))
        L.append("")

    if failures.strip():
        L.append("## Failed runs\n")
        L.append("Every run that crashed, timed out or printed no result, with its exact command:\n")
        L.append("```")
        L.append(failures.rstrip())
        L.append("```\n")
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")


def write_png(dirname, cells, workloads, allocs):
    gnuplot = shutil.which("gnuplot")
    if not gnuplot:
        print("bench-report: notice: gnuplot is missing; no matrix.png")
        return False
    data = os.path.join(dirname, "plot-data")
    os.makedirs(data, exist_ok=True)
    colors = {"glibc": "#7f7f7f", "cmalloc": "#d62728", "cmalloc-pool": "#8c1a1a", "cmalloc-arena": "#e377c2", "jemalloc": "#1f77b4",
              "tcmalloc": "#2ca02c", "mimalloc": "#ff7f0e"}
    panels = []
    for wl in workloads:
        wc = [c for c in cells if c["workload"] == wl]
        program = all(c["ops_per_sec"] is None for c in wc)
        files = []
        for a in allocs:
            rows = sorted(((int(c["threads"]), c) for c in wc if c["allocator"] == a), key=lambda x: x[0])
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

    ncols = 4
    nrows = (2 * len(panels) + ncols - 1) // ncols
    width, height = 2000, max(380, 330 * nrows)
    g = []
    g.append('set terminal png size %d,%d font ",9"' % (width, height))
    g.append('set output "%s"' % os.path.join(dirname, "matrix.png"))
    g.append('set multiplot layout %d,%d title "cmalloc benchmark matrix: medians; ops/s (or wall time) '
             'and peak RSS against threads"' % (nrows, ncols))
    g.append("set key outside right top vertical font \",8\" samplen 1 spacing 0.9")
    g.append("set grid")
    g.append("set format y \"%.1s%c\"")
    for wl, program, files in panels:
        threads = sorted({int(c["threads"]) for c in cells if c["workload"] == wl})
        if program:
            # whole programs: a bar per allocator that ran it
            g.append("set xrange [-0.7:%f]" % (len(files) - 0.3))
            g.append("set xtics (%s)" % ", ".join('"%s" %d' % (a, i) for i, (a, _) in enumerate(files)))
            g.append('set format y "%g"')
            g.append('set title "%s: wall time (s, lower is better)"' % wl)
            g.append("set yrange [0:*]")
            g.append("set style fill solid 0.7")
            g.append("plot " + ", ".join('"%s" using 4:2:(0.6) with boxes lc rgb "%s" title ""'
                                         % (fn, colors.get(a, "black")) for a, fn in files))
            g.append('set title "%s: peak RSS (MiB)"' % wl)
            g.append("plot " + ", ".join('"%s" using 4:3:(0.6) with boxes lc rgb "%s" title ""'
                                         % (fn, colors.get(a, "black")) for a, fn in files))
            g.append('set xtics autofreq; set autoscale x; set yrange [*:*]; set style fill empty; set format y "%.1s%c"')
            continue
        g.append("set logscale x 2")
        g.append("set xrange [%f:%f]" % (min(threads) / 1.25, max(threads) * 1.25))
        g.append("set xtics (%s)" % ", ".join('"%d" %d' % (t, t) for t in threads))
        g.append("set yrange [0:*]")
        g.append('set title "%s: ops/s (higher is better)"' % wl)
        g.append("plot " + ", ".join('"%s" using 1:2 with linespoints lw 2 pt 7 lc rgb "%s" title "%s"'
                                     % (fn, colors.get(a, "black"), a) for a, fn in files))
        g.append('set title "%s: peak RSS (MiB)"' % wl)
        g.append("plot " + ", ".join('"%s" using 1:3 with linespoints lw 2 pt 7 lc rgb "%s" title "%s"'
                                     % (fn, colors.get(a, "black"), a) for a, fn in files))
        g.append("unset logscale x; set xtics autofreq; set autoscale x")
    g.append("unset multiplot")
    gp = os.path.join(data, "matrix.gp")
    with open(gp, "w") as f:
        f.write("\n".join(g) + "\n")
    r = subprocess.run([gnuplot, gp], capture_output=True, text=True)
    if r.returncode != 0:
        print("bench-report: notice: gnuplot failed: %s" % r.stderr.strip()[-400:])
        return False
    shutil.rmtree(data, ignore_errors=True)
    return True


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    d = sys.argv[1]
    runs = load_runs(os.path.join(d, "runs.csv"))
    cells = median_cells(runs)
    workloads = []
    for c in cells:
        if c["workload"] not in workloads:
            workloads.append(c["workload"])
    present = {c["allocator"] for c in cells}
    info = read_machine(os.path.join(d, "machine.txt"))
    listed = [a[0] for a in info["allocator"]]
    allocs = [a for a in ALLOC_ORDER if a in present or a in listed]
    allocs += sorted(present - set(allocs))
    fpath = os.path.join(d, "failures.txt")
    failures = open(fpath).read() if os.path.exists(fpath) else ""
    cells.sort(key=lambda c: (workloads.index(c["workload"]), int(c["threads"]),
                              allocs.index(c["allocator"])))
    write_csv(os.path.join(d, "matrix.csv"), cells)
    have_png = write_png(d, cells, workloads, allocs) if cells else False
    if not have_png and os.path.exists(os.path.join(d, "matrix.png")):
        os.remove(os.path.join(d, "matrix.png"))
    write_md(os.path.join(d, "matrix.md"), cells, workloads, allocs, info, failures, have_png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
