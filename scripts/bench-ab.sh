#!/bin/bash
# bench-ab.sh - builds head to head on rows of the matrix, interleaved, in a few minutes.
#
#   scripts/bench-ab.sh [--reps N] [--seconds S] [--rows a,b,...] [--pin CPUS]
#                       NAME=LIB.so [NAME=LIB.so ...]
#
# Every repetition runs each row once under each library in turn (LD_PRELOAD), so drift on a
# noisy machine hits them alike, and each repetition starts one library later than the one
# before, so that none always runs right after another; prints the median ops/s and peak RSS
# of each row and library, and then each library's speed against the first one's as the
# median of the ratios within a repetition (runs next to each other, in the same phase of the
# machine), with the lowest and highest of those ratios: a ratio whose range holds 1.00 is
# within this machine's spread. --pin CPUS runs every program under `taskset -c CPUS` (0: all
# threads on one vCPU, where threads that hand memory to each other share a core in every run
# and the rows with more threads than cores no longer depend on where the scheduler puts them).
# The rows are the matrix's programs with the matrix's parameters (scripts/bench-matrix.py):
#   xmalloc1 xmalloc2   producer/consumer at 1 and 2 thread pairs
#   xpin1 xshuf1        the same, each producer and consumer pinned to CPUs of their own
#                       (--pin 1), the batches freed in allocation order or shuffled
#                       (--shuffle 1): every object crosses cores, in every run
#   larson2 mstress2    threads replaced while their blocks live on, 2 lanes
#   rpm1 rpm2           the rpmalloc-style row at 1 and 2 threads
#   xthr2               alloc-crossthread, 2 producers and 2 consumers
#   xthrpin1            alloc-crossthread, 1 producer and 1 consumer pinned apart (--pin)
#   larson8 mstress8 rpm8 xmalloc4 churn8   more threads than this machine's cores (memory)
#   churn1              thread churn, one thread at a time
#   imm1 mixed1 pow1    the fast path: 64-byte malloc/free, windows of mixed and of power-law
#                       sizes (alloc-immediate-64, alloc-window-mixed, alloc-window-powerlaw),
#                       at any thread count (imm2, pow4, ...)
#   tiny1               16-byte malloc/free (not a matrix row): alloc_bench writes bytes 0
#                       and 15, so each free follows narrow stores into the free mark's word
#   server1 server2     requests with temporaries over a shared 16,384-slot live set
#   pool16 pool8 pool24 pool8r pool24r   the pool rows through malloc: 1M x 16 B, 512k x 8 B
#                       and x 24 B freed in allocation order, and the last two in random order
#   pool8r4m pool24r4m  the random ones with 4M objects (64 and 128 MiB of blocks, past the
#                       L3 as the full matrix's pool rows are when other work contends for it)
#   sqlite python       the matrix's whole programs (sqlite3, python3 on bench/), each run
#                       timed whole: median milliseconds instead of ops/s (--seconds unused)
#   ob1 obp1 obpool1 obppool1   the order book as the matrix runs it (500,000 messages, seed 1,
#                       8 passes; --seconds unused), at any book count (ob4, obp2, ...): one
#                       book per thread, with a gateway thread per book (p), orders from
#                       cmalloc's pool (pool: cmalloc builds only); ops/s are messages
# Default rows: the first seven; default 5 repetitions of 0.3 s. A figure from it is the
# command line that printed it; compare only libraries of one run (docs/DESIGN.md says why).
# Needs build/bench (make bench, or make build/bench/<program>), and build/orderbook for ob rows.
set -euo pipefail
cd "$(dirname "$0")/.."
reps=5 seconds=0.3 rows=xmalloc1,xmalloc2,larson2,mstress2,rpm1,rpm2,xthr2 pin=()
while [ $# -gt 0 ]; do
    case $1 in
    --reps) reps=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    --pin) pin=(taskset -c "$2"); shift 2 ;;
    -h | --help) sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *=*) break ;;
    *) echo "bench-ab: unknown argument $1 (--help)" >&2; exit 2 ;;
    esac
done
[ $# -gt 0 ] || { echo "bench-ab: name at least one NAME=LIB.so (--help)" >&2; exit 2; }
for lib in "$@"; do
    [ -f "${lib#*=}" ] || { echo "bench-ab: ${lib#*=}: no such library" >&2; exit 2; }
done

row_command() {
    case $1 in
    xmalloc*) echo "build/bench/xmalloc_bench --batch 4096 --size 64 --queue 100 --threads ${1#xmalloc}" ;;
    xpin*) echo "build/bench/xmalloc_bench --batch 4096 --size 64 --queue 100 --pin 1" \
        "--threads ${1#xpin}" ;;
    xshuf*) echo "build/bench/xmalloc_bench --batch 4096 --size 64 --queue 100 --pin 1 --shuffle 1" \
        "--threads ${1#xshuf}" ;;
    larson*) echo "build/bench/larson_bench --window 5000 --round 50000 --threads ${1#larson}" ;;
    mstress*) echo "build/bench/mstress_bench --slots 1000 --life 10000 --threads ${1#mstress}" ;;
    rpm*) echo "build/bench/rpmalloc_bench --blocks 1000 --round 100 --max-size 16384 --threads ${1#rpm}" ;;
    imm*) echo "build/bench/alloc_bench --mode=immediate --size-dist=fixed --size 64 --threads ${1#imm}" ;;
    tiny*) echo "build/bench/alloc_bench --mode=immediate --size-dist=fixed --size 16" \
        "--threads ${1#tiny}" ;;
    mixed*) echo "build/bench/alloc_bench --mode=window --size-dist=mixed --size 4096 --window 4096" \
        "--threads ${1#mixed}" ;;
    pow*) echo "build/bench/alloc_bench --mode=window --size-dist=powerlaw --size 1048576" \
        "--window 1024 --threads ${1#pow}" ;;
    xthrpin*) echo "build/bench/alloc_bench --mode=crossthread --size-dist=mixed --size 1024 --pin" \
        "--threads ${1#xthrpin}" ;;
    xthr*) echo "build/bench/alloc_bench --mode=crossthread --size-dist=mixed --size 1024 --threads ${1#xthr}" ;;
    churn*) echo "build/bench/churn_bench --objects 256 --max-size 4096 --threads ${1#churn}" ;;
    server*) echo "build/bench/server_bench --slots 16384 --max-size 8192 --threads ${1#server}" ;;
    pool16) echo "build/bench/pool_bench --count 1000000 --size 16 --free-order fifo" ;;
    pool8 | pool24) echo "build/bench/pool_bench --count 524288 --size ${1#pool} --free-order fifo" ;;
    pool8r | pool24r) echo "build/bench/pool_bench --count 524288 --size ${1:4:-1} --free-order random" ;;
    sqlite) echo "sqlite3 :memory: '.read bench/real_sqlite.sql'" ;;
    python) echo "python3 bench/real_python.py" ;;
    pool8r4m | pool24r4m) # five rounds: one is half a second
        echo "build/bench/pool_bench --count 4194304 --size ${1:4:-3}" \
            "--free-order random --rounds 5" ;;
    obppool[0-9]*) echo "build/orderbook replay ORDERS --passes 8 --pipeline --alloc pool" \
        "--threads ${1#obppool}" ;;
    obpool[0-9]*) echo "build/orderbook replay ORDERS --passes 8 --alloc pool" \
        "--threads ${1#obpool}" ;;
    obp[0-9]*) echo "build/orderbook replay ORDERS --passes 8 --pipeline --threads ${1#obp}" ;;
    ob[0-9]*) echo "build/orderbook replay ORDERS --passes 8 --threads ${1#ob}" ;;
    *) echo "bench-ab: unknown row $1 (--help)" >&2; return 2 ;;
    esac
}

# A whole program's run: its wall time in ms and peak RSS (build/bench/peak_rss), or exit 1.
whole_program() { # row command NAME=LIB
    local rss_file start end
    rss_file=$(mktemp)
    start=$(date +%s%N)
    eval "local words=($2)" # split as the shell would: sqlite's '.read FILE' is one word
    build/bench/peak_rss --append "$rss_file" -- ${pin[@]+"${pin[@]}"} \
        env LD_PRELOAD="${3#*=}" "${words[@]}" \
        >/dev/null 2>&1 || { echo "bench-ab: $1 failed under ${3#*=}: $2" >&2; exit 1; }
    end=$(date +%s%N)
    echo "$1 ${3%%=*} $(((end - start) / 1000000)) $(tail -n 1 "$rss_file") ms"
    rm -f "$rss_file"
}

# An order-book run: messages/s and peak RSS (build/bench/peak_rss), or exit 1.
order_book() { # row command NAME=LIB
    local rss_file out
    rss_file=$(mktemp)
    out=$(build/bench/peak_rss --append "$rss_file" -- ${pin[@]+"${pin[@]}"} \
        env LD_PRELOAD="${3#*=}" ${2/ORDERS/$orders}) ||
        { echo "bench-ab: $1 failed under ${3#*=}: $2" >&2; exit 1; }
    echo "$1 ${3%%=*} $(echo "$out" | sed -n 's/^messages_per_second: //p') \
$(tail -n 1 "$rss_file") ops"
    rm -f "$rss_file"
}

results=$(mktemp) orders=
trap 'rm -f "$results" ${orders:+"$orders"}' EXIT
for row in ${rows//,/ }; do
    command=$(row_command "$row")
    if [ "${row#ob}" != "$row" ] && [ -z "$orders" ]; then # the matrix's stream, made once
        orders=$(mktemp)
        build/orderbook gen --messages 500000 --seed 1 >"$orders"
    fi
    libs=("$@")
    for ((rep = 0; rep < reps; rep++)); do
        for ((i = 0; i < ${#libs[@]}; i++)); do
            lib=${libs[(rep + i) % ${#libs[@]}]}
            case $row in
            sqlite | python) whole_program "$row" "$command" "$lib" ;;
            ob*) order_book "$row" "$command" "$lib" ;;
            *)
                line=$(${pin[@]+"${pin[@]}"} env LD_PRELOAD="${lib#*=}" $command \
                    --seconds "$seconds" | grep '^RESULT') || {
                    echo "bench-ab: $row under ${lib#*=} printed no result: $command" >&2
                    exit 1
                }
                ops=${line##*ops_per_sec=} rss=${line##*peak_rss_kib=}
                echo "$row ${lib%%=*} ${ops%% *} ${rss%% *} ops" ;;
            esac | sed "s/\$/ $rep/" >>"$results"
        done
    done
done

python3 - "$results" "$@" <<'EOF'
import collections, statistics, sys
ops = collections.defaultdict(dict)  # (row, name) -> {repetition: ops/s or ms}
rss, rows, unit = collections.defaultdict(list), [], {}
for line in open(sys.argv[1]):
    row, name, o, r, unit[row], rep = line.split()
    ops[row, name][rep] = int(o)
    rss[row, name].append(int(r))
    if row not in rows:
        rows.append(row)
names = [a.split("=")[0] for a in sys.argv[2:]]
def rate(x, row):
    if unit[row] == "ms":
        return "%d ms" % x
    return "%.1fM" % (x / 1e6) if x >= 1e5 else "%.0f" % x
print("%-9s" % "row" + "".join("%20s" % n for n in names) +
      "   (median ops/s or ms a run, peak RSS)")
for row in rows:
    print("%-9s" % row + "".join("%12s %5.1fMiB" % (rate(statistics.median(ops[row, n].values()),
                                                        row),
                                                   statistics.median(rss[row, n]) / 1024)
                                  for n in names))
if len(names) > 1:
    print()
    print("%-9s" % "row" + "".join("%20s" % n for n in names[1:]) +
          "   (speed x %s: median of the ratios within a repetition [lowest highest])" % names[0])
    for row in rows:
        first, cells = ops[row, names[0]], []
        for n in names[1:]:  # ms rows: less is faster
            ratios = [first[rep] / v if unit[row] == "ms" else v / first[rep]
                      for rep, v in ops[row, n].items() if first.get(rep)]
            cells.append("%5.2f [%4.2f %4.2f]" % (statistics.median(ratios), min(ratios),
                                                 max(ratios)))
        print("%-9s" % row + "".join("%20s" % c for c in cells))
EOF
