#!/usr/bin/env python3
"""vs-best-peer - each cell of a matrix.csv against the fastest peer, and the geometric means.

  scripts/vs-best-peer.py MATRIX.csv [--mine cmalloc,owner] [--peers jemalloc,tcmalloc,...]
                          [--spread RUNS.csv] [--floor 0.9]

For every (workload, threads) cell that every allocator of --mine ran: each one's speed over
the fastest --peers allocator's (ops/s; whole programs: 1 / wall time), and that peer. Then,
over those cells, the geometric mean of each --mine allocator against the best peer, of each
peer against the best of all the others (the --mine ones included), and each one's speed and
peak RSS against jemalloc's. The figures docs/DESIGN.md quotes as "against the best peer" and
the speed and memory "x jemalloc" README quotes come from it, and for each --mine allocator
how many cells it runs below --floor (0.9) of the best peer.
--spread RUNS.csv (the run's every repetition) adds how much the run moved: for each
allocator, the fastest of a cell's repetitions over the slowest, at the median cell; and of
the cells below --floor, those where even the fastest repetition of the --mine allocator is
slower than the slowest of the best peer's (marked "apart"): the gaps no repetition of the
run overlaps, as against those within what this machine's runs spread.
Standard library only.
"""
import argparse
import csv
import math

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("matrix")
ap.add_argument("--mine", default="cmalloc")
ap.add_argument("--peers", default="jemalloc,tcmalloc,mimalloc,snmalloc,mimalloc3")
ap.add_argument("--spread", metavar="RUNS.csv")
ap.add_argument("--floor", type=float, default=0.9)
args = ap.parse_args()
mine, peers = args.mine.split(","), args.peers.split(",")


def speed_of(row):
    ops, wall = float(row["ops_per_sec"] or 0), float(row["wall_s"] or 0)
    return ops if ops > 0 else (1 / wall if wall > 0 else 0)


reps = {}  # (workload, threads, allocator) -> the speed of each repetition (--spread)
if args.spread:
    for row in csv.DictReader(open(args.spread)):
        rep = speed_of(row)
        if rep > 0:
            cell = (row["workload"], int(row["threads"]), row["allocator"])
            reps.setdefault(cell, []).append(rep)


def apart(cell, name, peer):
    """Whether every repetition of name in cell is slower than every one of peer's."""
    ours, theirs = reps.get(cell + (name,)), reps.get(cell + (peer,))
    return bool(ours and theirs) and max(ours) < min(theirs)


speed, rss = {}, {}
for row in csv.DictReader(open(args.matrix)):
    key = (row["workload"], int(row["threads"]), row["allocator"])
    speed[key] = speed_of(row)
    rss[key] = float(row["peak_rss_kib"] or 0)

cells = sorted({(w, t) for w, t, _ in speed if all(speed.get((w, t, m), 0) > 0 for m in mine)})
logs = {name: [] for name in mine + peers}
speed_logs = {name: [] for name in mine + peers}
rss_logs = {name: [] for name in mine + peers}
below = {name: 0 for name in mine}
below_apart = {name: 0 for name in mine}
print("%-22s %2s " % ("workload", "T") + "".join("%10s" % m for m in mine) + "  best peer")
for w, t in cells:
    ran = {a: speed[w, t, a] for a in mine + peers if speed.get((w, t, a), 0) > 0}
    best_peer = max((a for a in peers if a in ran), key=ran.get, default=None)
    if best_peer is None:
        continue
    gaps = [m for m in mine if ran[m] / ran[best_peer] < args.floor and
            apart((w, t), m, best_peer)]
    print("%-22s %2d " % (w, t) + "".join("%10.2f" % (ran[m] / ran[best_peer]) for m in mine) +
          "  %s %.3g" % (best_peer, ran[best_peer]) +
          ("  apart: " + ",".join(gaps) if gaps else ""))
    for m in mine:
        below[m] += ran[m] / ran[best_peer] < args.floor
        below_apart[m] += m in gaps
    for name in ran:
        others = [ran[a] for a in (peers if name in mine else mine + peers) if a in ran and a != name]
        if others:
            logs[name].append(math.log(ran[name] / max(others)))
        if "jemalloc" in ran:
            speed_logs[name].append(math.log(ran[name] / ran["jemalloc"]))
        if rss.get((w, t, "jemalloc"), 0) > 0 and rss.get((w, t, name), 0) > 0:
            rss_logs[name].append(math.log(rss[w, t, name] / rss[w, t, "jemalloc"]))


def geomean(values):
    return "%.3f" % math.exp(sum(values) / len(values)) if values else "n/a (no jemalloc cell)"


for name in mine + peers:
    if logs[name]:
        print("%-10s %s %.3f over %d cells%s; speed x jemalloc %s, peak RSS x jemalloc %s" % (
            name, "vs best peer " if name in mine else "vs best other",
            math.exp(sum(logs[name]) / len(logs[name])), len(logs[name]),
            ", %d below %g%s" % (below[name], args.floor,
                                 " (%d apart)" % below_apart[name] if reps else "")
            if name in mine else "",
            geomean(speed_logs[name]), geomean(rss_logs[name])))
if reps:
    for name in mine + peers:
        spreads = sorted(max(v) / min(v) for (w, t, a), v in reps.items()
                         if a == name and len(v) > 1)
        if spreads:
            print("%-10s repetitions of a cell %.2fx apart at the median cell (%d cells)" % (
                name, spreads[len(spreads) // 2], len(spreads)))
