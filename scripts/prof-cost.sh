#!/bin/sh
# prof-cost.sh - what the profiler and guarded allocations cost: the matrix's cmalloc workloads
# (scripts/bench-matrix.sh's alloc, server and churn benchmarks and the order-book replay) run
# under cmalloc three ways, interleaved, repeated, medians reported as ops/s and as a ratio to
# the run with everything off:
#   off     no CMALLOC_ options
#   prof    CMALLOC_PROF=1 (default rate, 512 KiB)
#   guard   CMALLOC_GUARD_RATE=1000
#
#   scripts/prof-cost.sh [--reps N] [--seconds S] [--threads "1 2"] [--before LIB]
#   scripts/prof-cost.sh --instructions
#
# --before LIB adds a fourth way, interleaved with the others: the guard setting under LIB (say
# an earlier commit's build/libcmalloc.so, copied aside), shown as "guard before × off", so a
# change to the guard is measured against what it replaces in the same run.
#
# --instructions counts instead, with callgrind as tests/test_fastpath_budget.sh does, the
# instructions of a malloc+free pair that hits the thread cache (64 and 1000 bytes) in each
# setting: a figure the machine's load does not change.
#
# Prints a Markdown table. On a shared or busy machine differences of a few percent are noise:
# look at the spread (min..max of the ratios) printed beside each median.
set -eu
reps=5
seconds=0.5
threads="1 2"
instructions=0
before=
while [ $# -gt 0 ]; do
    case "$1" in
    --instructions) instructions=1 ;;
    --reps) reps=$2; shift ;;
    --seconds) seconds=$2; shift ;;
    --threads) threads=$2; shift ;;
    --before) before=$(realpath "$2"); shift ;;
    *) echo "usage: $0 [--reps N] [--seconds S] [--threads \"1 2\"] [--before LIB] | --instructions" >&2; exit 2 ;;
    esac
    shift
done
settings="off|
prof|CMALLOC_PROF=1
guard|CMALLOC_GUARD_RATE=1000"
if [ "$instructions" = 1 ]; then
    make -s all
    cc -O2 -fno-builtin tests/data/fastpath_pair.c -o build/tests/fastpath_pair
    count() { # settings, pairs, size: instructions of the whole run
        env $1 LD_PRELOAD="$PWD/build/libcmalloc.so" valgrind --tool=callgrind --callgrind-out-file=/dev/null \
            build/tests/fastpath_pair "$2" "$3" 2>&1 | sed -n 's/.*refs: *//p' | tr -d ,
    }
    echo "| setting | malloc(64)+free | malloc(1000)+free |"
    echo "|---|---:|---:|"
    echo "$settings" | while IFS='|' read -r name environment; do
        line="| $name \`${environment:-(none)}\` |"
        for size in 64 1000; do
            base=$(count "$environment" 0 "$size")
            full=$(count "$environment" 200000 "$size")
            line="$line $(( (full - base) / 200000 )) |"
        done
        echo "$line"
    done
    exit 0
fi
make -s all build/bench/alloc_bench build/bench/server_bench build/bench/churn_bench build/orderbook >/dev/null
lib="$PWD/build/libcmalloc.so"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/prof-cost.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
build/orderbook gen --messages 500000 --seed 1 >"$tmp/messages"

# name|command (threads and seconds are added to the bench programs)
workloads="alloc-immediate-64|build/bench/alloc_bench --mode=immediate --size-dist=fixed --size 64
alloc-window-mixed|build/bench/alloc_bench --mode=window --size-dist=mixed --size 4096 --window 4096
alloc-crossthread|build/bench/alloc_bench --mode=crossthread --size-dist=mixed --size 1024
server|build/bench/server_bench --slots 16384 --max-size 8192
churn|build/bench/churn_bench --objects 256 --max-size 4096
orderbook|build/orderbook replay $tmp/messages"

configs="off prof guard"
if [ -n "$before" ]; then
    settings="$settings
guard-before|CMALLOC_GUARD_RATE=1000"
    configs="$configs guard-before"
fi

run() { # config, command...: prints ops/s
    config=$1
    shift
    environment=$(echo "$settings" | sed -n "s/^$config|//p")
    preload=$lib
    [ "$config" != guard-before ] || preload=$before
    env $environment LD_PRELOAD="$preload" "$@" 2>&1 | sed -n 's/.*ops_per_sec=\([0-9]*\).*/\1/p; s/^messages_per_second: *//p'
}

for r in $(seq "$reps"); do
    echo "$workloads" | while IFS='|' read -r name command; do
        for t in $threads; do
            case "$name" in
            orderbook) [ "$t" = 1 ] || continue; args="" ;;
            *) args="--threads $t --seconds $seconds" ;;
            esac
            for config in $configs; do
                # shellcheck disable=SC2086
                value=$(run "$config" $command $args)
                echo "$name $t $config $r $value" >>"$tmp/results"
            done
        done
    done
    echo "prof-cost: repetition $r of $reps done" >&2
done

python3 - "$tmp/results" <<'EOF'
import collections, statistics, sys
runs = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    name, threads, config, rep, value = line.split()
    runs[(name, int(threads))].setdefault(config, {})[rep] = float(value)
configs_shown = ["prof", "guard"]
if any("guard-before" in configs for configs in runs.values()):
    configs_shown.append("guard-before")
print("| workload | threads | off (ops/s) | " + " | ".join(c.replace("-", " ") + " × off" for c in configs_shown) + " |")
print("|---|---:|---:|" + "---:|" * len(configs_shown))
for (name, threads), configs in runs.items():
    off = configs["off"]
    cells = []
    for config in configs_shown:
        ratios = sorted(configs[config][r] / off[r] for r in off if r in configs[config])
        cells.append("%.3f (%.2f..%.2f)" % (statistics.median(ratios), ratios[0], ratios[-1]))
    print("| %s | %d | %.0f | %s |" % (name, threads, statistics.median(off.values()), " | ".join(cells)))
EOF
