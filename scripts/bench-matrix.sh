#!/bin/bash
# bench-matrix.sh - every workload x allocator x thread count, repeated; the table and the plot.
#
#   scripts/bench-matrix.sh [--quick] [--threads 1,2,4,8] [--reps N] [--allocators a,b,...]
#                           [--workloads pattern,...] [--seconds S] [--out DIR] [--no-install]
#                           [--extra NAME=LIB.so] [--plan]
#
# Allocators: glibc (no preload), cmalloc (build/libcmalloc.so), jemalloc, tcmalloc, mimalloc
# (the Debian packages' libraries), each switched in with LD_PRELOAD on the very same binaries.
# Those that are missing are installed (apt-get, when root or with sudo) or skipped with a notice.
# --extra NAME=LIB.so adds another allocator (say a cmalloc build with other options); repeatable.
# --plan prints the workloads, allocators and run count, and runs nothing.
# Workloads: build/bench/{alloc,server,churn}_bench in several modes, the order-book replay
# (build/orderbook, when it exists), cmalloc's explicit pool and arena against every malloc
# (build/bench/pool_bench, fixed work, run at one thread) and unmodified real programs (python3
# running bench/real_python.py, sqlite3 running bench/real_sqlite.sql) timed with hyperfine.
#
# Every (workload, threads) cell is run --reps times for every allocator, and the allocators are
# interleaved: repetition r runs all workloads for all allocators before repetition r+1 starts,
# and the allocator order rotates from one cell to the next, so drift on a noisy machine (other
# jobs, thermal, page cache) hits every allocator alike. The medians of the repetitions are
# reported. Output in --out (default bench/results/latest/):
#   runs.csv     every single run;       matrix.csv  medians, one row per cell and allocator
#   matrix.md    a table per workload, ratios to jemalloc;   matrix.png  ops/s and peak RSS plots
#   failures.txt the exact command of every run that crashed or printed no result (if any)
# --quick: short runs (under 3 minutes on a 2-core machine); the default full run: under 30.
if [ -z "${BASH_VERSION:-}" ]; then exec bash "$0" "$@"; fi
set -u -o pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

quick=0
threads_list="1,2,4,8"
reps=""
only_allocators=""
only_workloads=""
seconds=""
out="bench/results/latest"
install=1
plan_only=0
extras=()

usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --threads) threads_list="$2"; shift ;;
    --threads=*) threads_list="${1#*=}" ;;
    --reps) reps="$2"; shift ;;
    --reps=*) reps="${1#*=}" ;;
    --allocators) only_allocators="$2"; shift ;;
    --allocators=*) only_allocators="${1#*=}" ;;
    --workloads) only_workloads="$2"; shift ;;
    --workloads=*) only_workloads="${1#*=}" ;;
    --seconds) seconds="$2"; shift ;;
    --seconds=*) seconds="${1#*=}" ;;
    --out) out="$2"; shift ;;
    --out=*) out="${1#*=}" ;;
    --no-install) install=0 ;;
    --extra) extras+=("$2"); shift ;;
    --extra=*) extras+=("${1#*=}") ;;
    --plan) plan_only=1 ;;
    -h|--help) usage 0 ;;
    *) echo "bench-matrix: unknown option '$1'" >&2; usage ;;
  esac
  shift
done
case "$threads_list" in *[!0-9,]*|"") echo "bench-matrix: --threads wants a list like 1,2,4" >&2; exit 2 ;; esac
threads_list=$(echo "$threads_list" | tr ',' ' ')

# Run lengths. quick: ~0.15 s a run, 3 repetitions; full: ~1.1 s a run, 5 repetitions.
# hf_*: hyperfine runs (and warm-up runs) of each whole program per repetition.
if [ "$quick" = 1 ]; then
  mode_name="quick"; : "${reps:=3}"; : "${seconds:=0.08}"; warmup=0.02
  hf_runs=1; hf_warmup=0; ob_messages=100000
else
  mode_name="full"; : "${reps:=5}"; : "${seconds:=0.8}"; warmup=0.2
  hf_runs=2; hf_warmup=1; ob_messages=500000
fi
case "$reps" in ''|*[!0-9]*|0) echo "bench-matrix: --reps wants a positive number" >&2; exit 2 ;; esac
case "$seconds" in ''|*[!0-9.]*|*.*.*|.) echo "bench-matrix: --seconds wants a number like 0.5" >&2; exit 2 ;; esac

# ---- packages ------------------------------------------------------------------------------
bench_packages="libjemalloc2 libtcmalloc-minimal4 libmimalloc2.0 hyperfine gnuplot-nox python3 sqlite3"
install_missing() {
  command -v dpkg-query >/dev/null 2>&1 || return 0
  local missing="" p
  for p in $bench_packages; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
  done
  [ -z "$missing" ] && return 0
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"
    else echo "bench-matrix: notice: not root, cannot install:$missing (continuing without)"; return 0; fi
  fi
  echo "bench-matrix: installing$missing"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >/dev/null 2>&1 || true
  # one at a time, so a package missing from this release does not block the others
  for p in $missing; do
    $sudo apt-get install -y -qq "$p" >/dev/null 2>&1 || echo "bench-matrix: notice: could not install $p"
  done
}
[ "$install" = 1 ] && [ "$plan_only" = 0 ] && install_missing

# ---- binaries --------------------------------------------------------------------------------
# (make bench has built them already; run on its own, the script brings them up to date)
own_bins="build/bench/alloc_bench build/bench/server_bench build/bench/churn_bench build/bench/peak_rss build/bench/pool_bench"
own_bins="$own_bins build/bench/xmalloc_bench build/bench/mstress_bench build/bench/larson_bench"
if [ "$plan_only" = 0 ]; then
  make -s $own_bins || { echo "bench-matrix: building the benchmark programs failed" >&2; exit 1; }
  make -s build/libcmalloc.so > "${TMPDIR:-/tmp}/bench-matrix-make.$$" 2>&1 ||
    echo "bench-matrix: notice: make build/libcmalloc.so failed$( [ -e build/libcmalloc.so ] && echo "; using the existing build/libcmalloc.so")"
  make -s build/orderbook > "${TMPDIR:-/tmp}/bench-matrix-make.$$" 2>&1 ||
    echo "bench-matrix: notice: make build/orderbook failed$( [ -x build/orderbook ] && echo "; using the existing binary")"
  rm -f "${TMPDIR:-/tmp}/bench-matrix-make.$$"
fi

# ---- allocators ----------------------------------------------------------------------------
find_lib() { # first existing library among the names, in the usual library directories
  local n d
  for n in "$@"; do
    for d in "/usr/lib/$(uname -m)-linux-gnu" /usr/lib64 /usr/lib /usr/local/lib; do
      [ -e "$d/$n" ] && { echo "$d/$n"; return 0; }
    done
  done
  return 1
}
alloc_names=""
declare -A alloc_lib
add_alloc() { # name library ("" for none)
  local name=$1 lib=$2
  if [ -n "$only_allocators" ] && ! echo ",$only_allocators," | grep -q ",$name,"; then return; fi
  if [ -n "$lib" ]; then
    # the library must load and work: a trivial program under it must run cleanly
    local err
    err=$(LD_PRELOAD="$lib" /bin/true 2>&1)
    if [ $? -ne 0 ] || [ -n "$err" ]; then
      echo "bench-matrix: notice: skipping $name: LD_PRELOAD=$lib /bin/true fails: $(echo "$err" | head -1)"
      return
    fi
  fi
  alloc_lib[$name]=$lib
  alloc_names="$alloc_names $name"
}
add_alloc glibc ""
if [ -e build/libcmalloc.so ]; then add_alloc cmalloc "$ROOT/build/libcmalloc.so"
else echo "bench-matrix: notice: build/libcmalloc.so is missing (make all failed?); cmalloc skipped"; fi
for spec in "jemalloc libjemalloc.so.2 libjemalloc.so" \
            "tcmalloc libtcmalloc_minimal.so.4 libtcmalloc.so.4 libtcmalloc_minimal.so" \
            "mimalloc libmimalloc.so.2 libmimalloc.so.2.0 libmimalloc.so"; do
  set -- $spec
  name=$1; shift
  if lib=$(find_lib "$@"); then add_alloc "$name" "$lib"
  else echo "bench-matrix: notice: $name is not installed; skipped"; fi
done
set --
for x in ${extras[@]+"${extras[@]}"}; do
  case "$x" in
    *=*) [ -e "${x#*=}" ] && add_alloc "${x%%=*}" "$(cd "$(dirname "${x#*=}")" && pwd)/$(basename "${x#*=}")" ||
           echo "bench-matrix: notice: --extra $x: no such library" ;;
    *) echo "bench-matrix: --extra wants NAME=LIB.so" >&2; exit 2 ;;
  esac
done
alloc_names=${alloc_names# }
[ -n "$alloc_names" ] || { echo "bench-matrix: no allocator to run" >&2; exit 1; }
nalloc=$(echo $alloc_names | wc -w)

# ---- workloads -----------------------------------------------------------------------------
# name | kind | command (after the binary's own options: --threads/--seconds are added) | what
# kind: bench = build/bench program printing a RESULT line, one run per thread count;
#       explicit, explicit+arena = a bench program with fixed work (pool_bench), run at one
#       thread only, whose malloc runs under every allocator and which also runs as the
#       pseudo-allocators cmalloc-pool (--alloc pool) and, for explicit+arena, cmalloc-arena;
#       orderbook = build/orderbook replay; program = whole unmodified program under hyperfine,
#       threads do not apply (run once, listed as threads 1).
py=/usr/bin/python3; [ -x "$py" ] || py=$(command -v python3 || true)
sq=$(command -v sqlite3 || true)
ob_file=""
workloads=()
add_workload() { # name kind command...
  local name=$1
  if [ -n "$only_workloads" ]; then
    local keep=0 pat
    for pat in $(echo "$only_workloads" | tr ',' ' '); do
      case "$name" in $pat) keep=1 ;; esac
    done
    [ "$keep" = 1 ] || return 0
  fi
  workloads+=("$*")
}
add_workload alloc-immediate-64 bench build/bench/alloc_bench --mode=immediate --size-dist=fixed --size 64
add_workload alloc-window-mixed bench build/bench/alloc_bench --mode=window --size-dist=mixed --size 4096 --window 4096
add_workload alloc-window-powerlaw bench build/bench/alloc_bench --mode=window --size-dist=powerlaw --size 1048576 --window 1024
add_workload alloc-crossthread bench build/bench/alloc_bench --mode=crossthread --size-dist=mixed --size 1024
add_workload server bench build/bench/server_bench --slots 16384 --max-size 8192
add_workload churn bench build/bench/churn_bench --objects 256 --max-size 4096
# issue 9's three server patterns, written here from their descriptions (see each .c's head)
add_workload xmalloc bench build/bench/xmalloc_bench --batch 4096 --size 64 --queue 100
add_workload mstress bench build/bench/mstress_bench --slots 1000 --life 10000
add_workload larson bench build/bench/larson_bench --window 5000 --round 50000
# cmalloc's pool and arena against every allocator's malloc (issue 10): N allocations, then N
# frees; cmalloc-pool / cmalloc-arena are those runs with cmalloc preloaded and --alloc pool/arena
add_workload pool-16x1m explicit+arena build/bench/pool_bench --count 1000000 --size 16 --free-order fifo
for s in 8 24; do
  for o in fifo random; do
    add_workload "pool-${s}x512k-$o" explicit build/bench/pool_bench --count 524288 --size $s --free-order $o
  done
done
explicit_extra=""
if [ -n "${alloc_lib[cmalloc]:-}" ] && [ "$plan_only" = 0 ]; then
  if LD_PRELOAD=${alloc_lib[cmalloc]} build/bench/pool_bench --alloc pool --count 1000 --rounds 1 > /dev/null 2>&1 &&
     LD_PRELOAD=${alloc_lib[cmalloc]} build/bench/pool_bench --alloc arena --count 1000 --rounds 1 > /dev/null 2>&1; then
    explicit_extra="cmalloc-pool cmalloc-arena"
  else
    echo "bench-matrix: notice: build/bench/pool_bench --alloc pool/arena does not run under cmalloc; cmalloc-pool and cmalloc-arena skipped"
  fi
fi
extras_of() { # kind: the pseudo-allocators that run it besides the real ones
  case "$1" in
    explicit) [ -n "$explicit_extra" ] && echo cmalloc-pool ;;
    explicit+arena) echo $explicit_extra ;;
    orderbook) [ "$ob_pool" = 1 ] && echo cmalloc-pool ;;
  esac
  return 0
}

ob_pool=0
if [ -x build/orderbook ]; then
  add_workload orderbook orderbook build/orderbook replay
  add_workload orderbook-pipeline orderbook build/orderbook replay --pipeline
  # the order book can take its orders from cmalloc's object pool: run that as one more
  # "allocator", cmalloc-pool, when cmalloc is in the matrix and its pool API works
  if [ -n "${alloc_lib[cmalloc]:-}" ]; then
    probe=$(mktemp "${TMPDIR:-/tmp}/bench-matrix-probe.XXXXXX")
    if build/orderbook gen --messages 2000 --seed 1 > "$probe" 2>/dev/null &&
       LD_PRELOAD=${alloc_lib[cmalloc]} build/orderbook replay "$probe" --alloc pool > /dev/null 2>&1; then
      ob_pool=1
    else
      echo "bench-matrix: notice: the order book's --alloc pool does not run under cmalloc; cmalloc-pool skipped"
    fi
    rm -f "$probe"
  fi
else
  echo "bench-matrix: notice: build/orderbook is missing; the order-book replay is skipped"
fi
if ! command -v hyperfine >/dev/null 2>&1; then
  echo "bench-matrix: notice: hyperfine is missing; the real-program workloads are skipped"
else
  if [ -n "$py" ]; then add_workload python program "$py" bench/real_python.py
  else echo "bench-matrix: notice: python3 is missing; the python workload is skipped"; fi
  if [ -n "$sq" ]; then add_workload sqlite program "$sq" :memory: ".read bench/real_sqlite.sql"
  else echo "bench-matrix: notice: sqlite3 is missing; the sqlite workload is skipped"; fi
fi
[ ${#workloads[@]} -gt 0 ] || { echo "bench-matrix: no workload selected" >&2; exit 1; }

# the runs, in order: repetition, workload, threads; allocators inside each cell
total=0
for w in "${workloads[@]}"; do
  set -- $w
  if [ "$2" = program ]; then total=$((total + nalloc))
  elif [ "${2#explicit}" != "$2" ]; then total=$((total + nalloc + $(extras_of "$2" | wc -w)))
  else
    for t in $threads_list; do total=$((total + nalloc)); [ "$2" = orderbook ] && total=$((total + ob_pool)); done
  fi
done
set --
total=$((total * reps))

echo "bench-matrix: $mode_name run: ${#workloads[@]} workloads x {$alloc_names} x threads {$threads_list} x $reps repetitions = $total runs"
echo "bench-matrix: ${seconds}s measured per run (+${warmup}s warm-up); medians reported; output in $out/"
if [ "$plan_only" = 1 ]; then
  for w in "${workloads[@]}"; do echo "  workload: $w"; done
  for a in $alloc_names; do echo "  allocator: $a ${alloc_lib[$a]:-(no preload)}"; done
  [ "$ob_pool" = 1 ] && echo "  allocator: cmalloc-pool (order book: cmalloc with --alloc pool)"
  echo "  pseudo-allocators of pool_bench: cmalloc-pool cmalloc-arena (probed when the matrix runs)"
  exit 0
fi

mkdir -p "$out"
# One matrix at a time per output directory (the working tree may be shared): wait for the other.
if command -v flock >/dev/null 2>&1; then
  exec 9> "$out/.lock"
  if ! flock -n 9; then
    echo "bench-matrix: another bench-matrix run is writing $out; waiting for it (up to 15 min)"
    flock -w 900 9 || { echo "bench-matrix: gave up waiting for $out/.lock" >&2; exit 1; }
  fi
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench-matrix.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# Snapshot the programs and cmalloc's library: the working tree may be rebuilt while the matrix
# runs, and every run of the matrix must use the very same files. (Messages show the originals.)
snap="$tmp/snap"
mkdir -p "$snap/bench"
cp build/bench/alloc_bench build/bench/server_bench build/bench/churn_bench build/bench/peak_rss build/bench/pool_bench "$snap/bench/"
cp build/bench/xmalloc_bench build/bench/mstress_bench build/bench/larson_bench "$snap/bench/"
[ -x build/orderbook ] && cp build/orderbook "$snap/orderbook"
declare -A run_lib
for a in $alloc_names; do run_lib[$a]=${alloc_lib[$a]}; done
if [ -n "${alloc_lib[cmalloc]:-}" ]; then
  cp "${alloc_lib[cmalloc]}" "$snap/libcmalloc.so" && run_lib[cmalloc]="$snap/libcmalloc.so"
fi
runs="$out/runs.csv"
failures="$out/failures.txt"
echo "rep,workload,allocator,threads,params,ops_per_sec,wall_s,p50_ns,p99_ns,p999_ns,max_ns,peak_rss_kib" > "$runs"
: > "$failures"

# machine and run description, for the report
{
  echo "nproc=$(nproc)"
  echo "cpu=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //')"
  echo "kernel=$(uname -sr)"
  echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- src include 2>/dev/null || echo ' (src/ modified)')"
  echo "mode=$mode_name"
  echo "reps=$reps"
  echo "seconds=$seconds"
  echo "warmup=$warmup"
  echo "threads=$threads_list"
  for a in $alloc_names; do
    v=""
    case $a in
      glibc) v=$(ldd --version 2>/dev/null | head -1 | sed 's/.* //') ;;
      jemalloc) v=$(dpkg-query -W -f='${Version}' libjemalloc2 2>/dev/null) ;;
      tcmalloc) v=$(dpkg-query -W -f='${Version}' libtcmalloc-minimal4 2>/dev/null) ;;
      mimalloc) v=$(dpkg-query -W -f='${Version}' libmimalloc2.0 2>/dev/null) ;;
      cmalloc) v=$(git rev-parse --short HEAD 2>/dev/null) ;;
    esac
    echo "allocator=$a|${alloc_lib[$a]:-(none)}|$v"
  done
} > "$out/machine.txt"

n=0
human() { # a number to 3 significant digits with k/M/G
  awk -v x="$1" 'BEGIN { if (x == "") { print "-"; exit }
    if (x >= 1e9) printf "%.3gG", x / 1e9; else if (x >= 1e6) printf "%.3gM", x / 1e6;
    else if (x >= 1e3) printf "%.3gk", x / 1e3; else printf "%.3g", x }'
}
mib() { awk -v k="$1" 'BEGIN { if (k == "") print "-"; else printf "%.1f MiB", k / 1024 }'; }

rotate() { # the allocator list (plus the names after $1) rotated left by $1
  local k=$1; shift
  local arr=($alloc_names "$@") i m
  m=${#arr[@]}
  for ((i = 0; i < m; i++)); do echo -n "${arr[$(((i + k) % m))]} "; done
}

record_failure() { # workload allocator threads rc command-text output-file
  local sig=""
  [ "$4" -gt 128 ] 2>/dev/null && sig=" (signal $(kill -l $(($4 - 128)) 2>/dev/null || echo $(($4 - 128))))"
  {
    echo "== $1 allocator=$2 threads=$3: exit $4$sig"
    echo "   command: $5"
    [ -s "$6" ] && tail -n 5 "$6" | sed 's/^/   | /'
  } >> "$failures"
}

# seconds a single run may take before it is killed
limit=$(awk -v s="$seconds" -v w="$warmup" 'BEGIN { printf "%d", 30 + 10 * (s + w) }')

ob_ready=0
prepare_orderbook() {
  [ "$ob_ready" = 1 ] && return 0
  ob_file="$tmp/orders.txt"
  echo "bench-matrix: generating $ob_messages order-book messages (seed 1)"
  if ! "$snap/orderbook" gen --messages "$ob_messages" --seed 1 > "$ob_file" 2> "$tmp/gen.err"; then
    echo "bench-matrix: notice: build/orderbook gen failed: $(head -1 "$tmp/gen.err"); order book skipped"
    ob_file=""
  fi
  ob_ready=1
  [ -n "$ob_file" ]
}

# Turns one run's output into a runs.csv line (appended) and the progress text (printed); exits
# 1 when there is no result. Reads a bench program's RESULT line, or the order book's
# "key: value" summary plus peak_rss's "peak_rss_kib=N" line (stderr file, second argument).
parse_awk='
  function human(x) {
    if (x == "") return "-"; x = x + 0
    if (x >= 1e9) return sprintf("%.3gG", x / 1e9); if (x >= 1e6) return sprintf("%.3gM", x / 1e6)
    if (x >= 1e3) return sprintf("%.3gk", x / 1e3); return sprintf("%.3g", x) }
  /^RESULT / { for (i = 2; i <= NF; i++) { k = substr($i, 1, index($i, "=") - 1); v[k] = substr($i, index($i, "=") + 1) }
               got = 1 }
  /^messages_per_second:/ { got = 1 }
  /^[a-z_0-9]+: / { k = $1; sub(/:$/, "", k); ob[k] = $2 }
  /^peak_rss_kib=/ { rss = substr($0, 14) }
  END {
    if (!got) exit 1
    if (!("ops_per_sec" in v)) {
      v["workload"] = w; v["threads"] = t; v["params"] = params; v["ops_per_sec"] = ob["messages_per_second"]
      v["wall_s"] = ob["seconds"]; v["p50_ns"] = ob["latency_p50_ns"]; v["p99_ns"] = ob["latency_p99_ns"]
      v["p999_ns"] = ob["latency_p999_ns"]; v["max_ns"] = ob["latency_max_ns"]; v["peak_rss_kib"] = rss
    }
    printf "%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s\n", rep, v["workload"], alloc, v["threads"], v["params"],
      v["ops_per_sec"], v["wall_s"], v["p50_ns"], v["p99_ns"], v["p999_ns"], v["max_ns"], v["peak_rss_kib"] >> runs
    printf "%s %s ops/s  p50 %s ns  p99 %s ns  peak RSS %.1f MiB  (%.1f s)\n", prefix, human(v["ops_per_sec"]),
      v["p50_ns"] == "" ? "-" : v["p50_ns"], v["p99_ns"] == "" ? "-" : v["p99_ns"], v["peak_rss_kib"] / 1024, took
  }'

run_bench_cell() { # rep kind threads allocator name command...
  local rep=$1 kind=$2 t=$3 a=$4 name=$5; shift 5
  local lib rlib o="$tmp/out" e="$tmp/err" rc start params="" prefix
  local cmd=("$@")
  if [ "$a" = cmalloc-pool ] || [ "$a" = cmalloc-arena ]; then
    lib=${alloc_lib[cmalloc]}; rlib=${run_lib[cmalloc]}; cmd+=(--alloc "${a#cmalloc-}")
  else lib=${alloc_lib[$a]}; rlib=${run_lib[$a]}; fi
  [ "${kind#explicit}" != "$kind" ] && kind=bench
  if [ "$kind" = bench ]; then
    cmd+=(--threads "$t" --seconds "$seconds" --warmup "$warmup" --label "$name")
  else
    cmd=("${cmd[@]:0:2}" "$ob_file" "${cmd[@]:2}" --threads "$t")
    params="messages=$ob_messages"
    case " ${cmd[*]} " in *" --pipeline "*) params="$params;pipeline" ;; esac
  fi
  local exe=("$snap/${cmd[0]#build/}" "${cmd[@]:1}") # the snapshot of build/...
  start=$EPOCHREALTIME
  if [ "$kind" = bench ]; then
    env ${rlib:+LD_PRELOAD=$rlib} timeout -k 5 "$limit" "${exe[@]}" > "$o" 2> "$e"; rc=$?
  else
    timeout -k 5 "$limit" "$snap/bench/peak_rss" -- env ${rlib:+LD_PRELOAD=$rlib} "${exe[@]}" > "$o" 2> "$e"; rc=$?
  fi
  local took=$(( (${EPOCHREALTIME/./} - ${start/./}) / 1000 ))
  n=$((n + 1))
  printf -v prefix "[%4d/%d] rep %d/%d %-21s T=%-2s %-12s" "$n" "$total" "$rep" "$reps" "$name" "$t" "$a"
  if [ "$rc" -ne 0 ] || ! awk -v rep="$rep" -v alloc="$a" -v w="$name" -v t="$t" -v params="$params" \
       -v runs="$runs" -v prefix="$prefix" -v took="${took}e-3" "$parse_awk" "$o" "$e"; then
    local shown="${lib:+LD_PRELOAD=$lib }${cmd[*]}"
    [ "$kind" = orderbook ] && shown="build/orderbook gen --messages $ob_messages --seed 1 > orders.txt && ${shown/$ob_file/orders.txt}"
    [ "$rc" -eq 0 ] && rc="0, no result printed"
    record_failure "$name" "$a" "$t" "$rc" "$shown" "$e"
    echo "$prefix FAILED (exit $rc): $shown"
  fi
}

run_program_cell() { # rep name command... : one hyperfine invocation, every allocator a command
  local rep=$1 name=$2; shift 2
  local order a lib args=() i=0 pparams
  pparams="$(basename "$1");$(echo "$*" | grep -o 'bench/[^ ]*' | head -1)"
  order=$(rotate "$rep")
  rm -f "$tmp"/rss.*
  for a in $order; do
    lib=${run_lib[$a]}
    # hyperfine -N runs the command without a shell: the same argv for every allocator
    local c="$snap/bench/peak_rss --append $tmp/rss.$a -- env"
    [ -n "$lib" ] && c="$c LD_PRELOAD=$lib"
    local arg q=""
    for arg in "$@"; do case "$arg" in *" "*) q="$q '$arg'" ;; *) q="$q $arg" ;; esac; done
    args+=(-n "$a" "$c$q")
  done
  local rc
  hyperfine -N -i --style none --warmup "$hf_warmup" --runs "$hf_runs" --export-json "$tmp/hf.json" "${args[@]}" \
    > "$tmp/hf.out" 2>&1; rc=$?
  # every command's timed runs: "name ok t1 t2 ...", or "name fail code..." when a run failed
  python3 -c '
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    codes = [c for c in (r.get("exit_codes") or []) if c]
    if codes:
        print(r["command"], "fail", " ".join(str(c) for c in codes))
    else:
        print(r["command"], "ok", " ".join("%.6f" % x for x in r["times"]))
' "$tmp/hf.json" > "$tmp/hf.times" 2>/dev/null
  # the warm-up runs appended figures too: skip them in each rss file
  for a in $order; do
    n=$((n + 1))
    local prefix
    printf -v prefix "[%4d/%d] rep %d/%d %-21s T=%-2s %-12s" "$n" "$total" "$rep" "$reps" "$name" 1 "$a"
    local times status
    status=$(awk -v a="$a" '$1 == a { print $2 }' "$tmp/hf.times")
    times=$(awk -v a="$a" '$1 == a { $1 = ""; $2 = ""; print }' "$tmp/hf.times")
    if [ "$rc" -ne 0 ] || [ "$status" != ok ] || [ -z "$times" ]; then
      lib=${alloc_lib[$a]}
      local why="hyperfine exit $rc" code=$rc
      [ "$status" = fail ] && why="exit status $(echo $times)" && code=$(echo $times | cut -d' ' -f1)
      record_failure "$name" "$a" 1 "$code" "${lib:+LD_PRELOAD=$lib }$*" "$tmp/hf.out"
      echo "$prefix FAILED ($why): ${lib:+LD_PRELOAD=$lib }$*"
      continue
    fi
    local rsss k=0 tm
    rsss=($(tail -n +$((hf_warmup + 1)) "$tmp/rss.$a" 2>/dev/null))
    for tm in $times; do
      echo "$rep,$name,$a,1,$pparams,,$tm,,,,,${rsss[$k]:-}" >> "$runs"
      k=$((k + 1))
    done
    echo "$prefix $(echo $times | awk '{ s = 0; for (i = 1; i <= NF; i++) s += $i; printf "%.3f s", s / NF }') wall  peak RSS $(mib "${rsss[0]:-}")"
  done
}

began=$(date +%s)
cell=0
for ((rep = 1; rep <= reps; rep++)); do
  for w in "${workloads[@]}"; do
    set -- $w
    name=$1 kind=$2; shift 2
    if [ "$kind" = program ]; then
      if [ "$name" = sqlite ]; then run_program_cell "$rep" "$name" "$1" :memory: ".read bench/real_sqlite.sql"
      else run_program_cell "$rep" "$name" "$@"; fi
      continue
    fi
    if [ "$kind" = orderbook ] && ! prepare_orderbook; then
      for t in $threads_list; do n=$((n + nalloc + ob_pool)); done
      continue
    fi
    cell_threads=$threads_list
    [ "${kind#explicit}" != "$kind" ] && cell_threads=1 # fixed work: one thread
    for t in $cell_threads; do
      cell=$((cell + 1))
      extra=$(extras_of "$kind")
      for a in $(rotate $((cell + rep)) $extra); do
        run_bench_cell "$rep" "$kind" "$t" "$a" "$name" "$@"
      done
    done
  done
done
set --
echo "bench-matrix: $n runs in $(( $(date +%s) - began )) s"
[ -s "$failures" ] && echo "bench-matrix: $(grep -c '^==' "$failures") runs failed; see $failures"

python3 scripts/bench-report.py "$out" || { echo "bench-matrix: the report failed" >&2; exit 1; }
echo "bench-matrix: wrote $out/matrix.csv $out/matrix.md$( [ -e "$out/matrix.png" ] && echo " $out/matrix.png")"
