#!/bin/sh
# test_bench_smoke.sh - every benchmark program runs briefly under glibc and prints a RESULT line
# that parses (all keys, in order, numbers where numbers belong), fault_cost its table,
# thread_stacks its pairs a second; then a one-cell matrix goes through scripts/bench-matrix.sh
# (the entry point of scripts/bench-matrix.py) and yields matrix.csv/md with the right header,
# and the summary it prints is checked on made-up runs whose answer is known, and
# scripts/vs-best-peer.py's mean and cells below its floor on the same (and the gaps no
# repetition overlaps, on made-up repetitions); scripts/bench-ab.sh
# prints its two tables. Run by `make test` from the top directory (which builds
# build/bench/* and the library); about 4 s.
set -u
fail=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench-smoke.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

check_result() { # name output-file
  line=$(grep '^RESULT ' "$2" | head -n 1)
  if [ -z "$line" ]; then echo "FAIL $1: no RESULT line"; sed 's/^/  | /' "$2"; fail=1; return; fi
  echo "$line" | awk -v name="$1" '
    BEGIN { split("workload threads params ops_per_sec wall_s p50_ns p99_ns p999_ns max_ns peak_rss_kib", want, " ") }
    { bad = ""
      if (NF != 11) bad = bad " fields=" NF
      for (i = 1; i <= 10; i++) {
        k = substr($(i + 1), 1, index($(i + 1), "=") - 1); v = substr($(i + 1), index($(i + 1), "=") + 1)
        if (k != want[i]) bad = bad " key" i "=" k
        if (i >= 4 && v !~ /^[0-9]+(\.[0-9]+)?$/) bad = bad " " k "=" v
      }
      ops = substr($5, index($5, "=") + 1); if (ops + 0 <= 0) bad = bad " zero-ops"
      if (bad != "") { print "FAIL " name ":" bad; print "  " $0; exit 1 }
      print "ok   " name ": " $5 " " $8 " " $11 }' || fail=1
}

run() { # name command...
  name=$1; shift
  if ! "$@" > "$tmp/out" 2> "$tmp/err"; then
    echo "FAIL $name: exit status $? from: $*"; sed 's/^/  | /' "$tmp/err"; fail=1; return
  fi
  check_result "$name" "$tmp/out"
}

short="--seconds 0.05 --warmup 0.01"
for m in immediate window crossthread; do
  run "alloc_bench $m" build/bench/alloc_bench --mode=$m --size-dist=mixed --size 2048 --threads 2 $short
done
run "alloc_bench powerlaw" build/bench/alloc_bench --mode=window --size-dist=powerlaw --size 1M --window 64 $short
# the matrix's mixed window (4,096 blocks, the size table's length): each op's new block takes a
# size of its own, not the one it frees (which the index coming round with the ring once gave)
build/bench/alloc_bench --mode=window --size-dist=mixed --size 4096 --window 4096 $short \
  > "$tmp/out" 2>&1
share=$(sed -n 's/^ *replacements *\([0-9.]*\)%.*/\1/p' "$tmp/out")
if [ -z "$share" ] || awk -v s="$share" 'BEGIN { exit !(s >= 5) }'; then
  echo "FAIL alloc_bench window: same-size replacements '$share'%"; sed 's/^/  | /' "$tmp/out"; fail=1
else echo "ok   alloc_bench window: $share% of replacements take the size they free"; fi
# --sharing-block: the threads' live objects counted on blocks of a page, a count of the window's
# objects; a size that is no power of two is refused
build/bench/alloc_bench --mode=window --size-dist=mixed --size 4096 --window 256 --threads 2 \
  --sharing-block 4096 $short > "$tmp/out" 2>&1
counted='s/^ *sharing *\([0-9]*\) of \([0-9]*\) live objects share a 4096-byte block.*/\1 \2/p'
line=$(sed -n "$counted" "$tmp/out")
if [ -z "$line" ] ||
   ! awk -v s="$line" 'BEGIN { split(s, f, " "); exit !(f[1] <= f[2] && f[2] == 512) }'
then echo "FAIL alloc_bench --sharing-block 4096: '$line'"; sed 's/^/  | /' "$tmp/out"; fail=1
else echo "ok   alloc_bench --sharing-block 4096: $line"; fi
if build/bench/alloc_bench --sharing-block 100 > "$tmp/out" 2>&1 ||
   ! grep -q "power of two" "$tmp/out"
then echo "FAIL alloc_bench --sharing-block 100 was taken"; fail=1
else echo "ok   alloc_bench --sharing-block 100 refused"; fi
run "server_bench" build/bench/server_bench --threads 2 --slots 2048 $short
run "churn_bench" build/bench/churn_bench --threads 2 --objects 64 $short
# the server-pattern benchmarks, shrunk so each thread's part (a batch, a life, a round) is short
run "xmalloc_bench" build/bench/xmalloc_bench --threads 2 --batch 256 --queue 8 $short
run "xmalloc_bench pinned, shuffled" build/bench/xmalloc_bench --threads 2 --batch 256 --queue 8 \
  --pin 1 --shuffle 1 $short
run "alloc_bench crossthread pinned" build/bench/alloc_bench --mode=crossthread --size 2048 \
  --threads 2 --pin $short
run "mstress_bench" build/bench/mstress_bench --threads 2 --slots 100 --life 500 $short
run "larson_bench" build/bench/larson_bench --threads 2 --window 200 --round 1000 $short
run "rpmalloc_bench" build/bench/rpmalloc_bench --threads 2 --blocks 200 --round 20 $short
# thread_stacks times a loop as a whole (no latency samples): its RESULT line's pairs a second
stacks='^RESULT workload=thread_stacks threads=8 params=blocks=2;block_mib=4;pairs=1000 '
if build/bench/thread_stacks --threads 8 --blocks 2 --pairs 1000 --rounds 2 > "$tmp/out" 2>&1 &&
   grep -q "${stacks}ops_per_sec=[1-9][0-9]* " "$tmp/out"
then echo "ok   thread_stacks"
else echo "FAIL thread_stacks:"; sed 's/^/  | /' "$tmp/out"; fail=1; fi

# peak_rss passes the exit status through and reports a figure
if build/bench/peak_rss -- sh -c 'exit 7' 2> "$tmp/err"; then rc=0; else rc=$?; fi
if [ "$rc" -ne 7 ] || ! grep -q '^peak_rss_kib=[0-9][0-9]*$' "$tmp/err"; then
  echo "FAIL peak_rss: status $rc, stderr: $(cat "$tmp/err")"; fail=1
else echo "ok   peak_rss"; fi

# fault_cost prints a row per chunk size, both costs positive; a chunk that is no multiple of
# 4 KiB, or larger than the mapping, is refused with status 2
if build/bench/fault_cost --chunk 4,8 --mib 1 --rounds 1 > "$tmp/out" 2> "$tmp/err" &&
   [ "$(awk 'NR > 1 && $1 ~ /^(4|8)$/ && $2 > 0 && $3 > 0' "$tmp/out" | wc -l)" -eq 2 ]; then
  if build/bench/fault_cost --chunk 6 > /dev/null 2>&1; then rc=0; else rc=$?; fi
  if [ "$rc" -eq 2 ]; then echo "ok   fault_cost"; else echo "FAIL fault_cost: --chunk 6 gave $rc"; fail=1; fi
  if build/bench/fault_cost --chunk 2048 --mib 1 > /dev/null 2>&1; then rc=0; else rc=$?; fi
  [ "$rc" -eq 2 ] || { echo "FAIL fault_cost: a chunk past the mapping gave $rc"; fail=1; }
else echo "FAIL fault_cost:"; sed 's/^/  | /' "$tmp/out" "$tmp/err"; fail=1; fi

# the matrix script end to end, one cell (glibc only, no installs, no whole programs), and an
# --extra library, which runs although --allocators does not name it
if sh scripts/bench-matrix.sh --quick --no-install --reps 1 --threads 1 --allocators glibc \
     --extra other=build/libcmalloc.so \
     --workloads alloc-immediate-64 --seconds 0.05 --out "$tmp/matrix" > "$tmp/matrix.log" 2>&1 &&
   [ "$(head -n 1 "$tmp/matrix/matrix.csv")" = "workload,allocator,threads,params,ops_per_sec,wall_s,p50_ns,p99_ns,p999_ns,max_ns,peak_rss_kib" ] &&
   grep -q '^alloc-immediate-64,glibc,1,' "$tmp/matrix/matrix.csv" &&
   grep -q '^alloc-immediate-64,other,1,' "$tmp/matrix/matrix.csv" &&
   grep -q '^## alloc-immediate-64' "$tmp/matrix/matrix.md"; then
  echo "ok   bench-matrix.sh one cell and an --extra"
else
  echo "FAIL bench-matrix.sh one cell:"; sed 's/^/  | /' "$tmp/matrix.log"; fail=1
fi

# The summary the matrix prints, from made-up runs whose answer is known: the fastest of each
# group and cmalloc against the fastest other allocator; an allocator that ran one cell is not
# given a row of means but a line naming its cell.
mkdir "$tmp/made-up"
{
  echo "rep,workload,allocator,threads,params,ops_per_sec,wall_s,p50_ns,p99_ns,p999_ns,max_ns,peak_rss_kib"
  for t in 1 2; do
    for pair in glibc:100 cmalloc:300 jemalloc:200 mimalloc:250; do
      echo "1,alloc-x,${pair%%:*},$t,p,${pair#*:},,,,,,1000"
    done
  done
  for pair in glibc:100 cmalloc:80 jemalloc:50 mimalloc:40; do echo "1,churn,${pair%%:*},1,p,${pair#*:},,,,,,1000"; done
  for pair in glibc:100 cmalloc:100 cmalloc-arena:1000 jemalloc:100 mimalloc:100; do
    echo "1,pool-16x1m,${pair%%:*},1,p,${pair#*:},,,,,,1000"
  done
} > "$tmp/made-up/runs.csv"
if sh scripts/bench-matrix.sh --report "$tmp/made-up" > "$tmp/summary.txt" 2>&1; then
  for want in "alloc (alloc-x; 2 cells): cmalloc is fastest, 1.20× mimalloc, the fastest other allocator." \
              "churn (churn; 1 cell): glibc is fastest; cmalloc is 0.80× glibc (20% slower)." \
              "cmalloc-arena ran one cell only (pool-16x1m, 1 thread): 10.00× jemalloc's speed, 1.00× its peak RSS there." \
              "| cmalloc | 1.38 | 1.00 | 2 of 4 | 4 |"; do
    grep -qxF "$want" "$tmp/summary.txt" || { echo "FAIL summary: no line '$want':"; sed 's/^/  | /' "$tmp/summary.txt"; fail=1; }
  done
  grep -q '^| cmalloc-arena ' "$tmp/summary.txt" && { echo "FAIL summary: a row of means for one cell"; fail=1; }
  [ "$fail" = 0 ] && echo "ok   summary: winners and cmalloc against the best other allocator"
else
  echo "FAIL bench-matrix.sh --report:"; sed 's/^/  | /' "$tmp/summary.txt"; fail=1
fi
# vs-best-peer on the same cells: cmalloc at 1.2, 1.2, 1.6 and 1.0 of the best peer, so a
# geometric mean of 1.232 and three cells below a floor of 1.3
python3 scripts/vs-best-peer.py "$tmp/made-up/matrix.csv" --peers jemalloc,mimalloc --floor 1.3 \
  > "$tmp/vs.txt" 2>&1
if grep -q '^cmalloc  *vs best peer  1.232 over 4 cells, 3 below 1.3;' "$tmp/vs.txt"; then
  echo "ok   vs-best-peer: the geometric mean and the cells below the floor"
else echo "FAIL vs-best-peer:"; sed 's/^/  | /' "$tmp/vs.txt"; fail=1; fi
# ... and with --spread, the cells below the floor that no repetition overlaps: cell a's
# cmalloc runs (75, 85) all below jemalloc's (95, 105), cell b's (70, 99) not below (90, 110)
mkdir "$tmp/spread"
{
  echo "workload,allocator,threads,params,ops_per_sec,wall_s,p50_ns,p99_ns,p999_ns,max_ns,peak_rss_kib"
  for row in a,cmalloc,80 a,jemalloc,100 b,cmalloc,80 b,jemalloc,100 c,cmalloc,100 c,jemalloc,100; do
    echo "${row%,*},1,p,${row##*,},,,,,,1000"
  done
} > "$tmp/spread/matrix.csv"
{
  echo "rep,workload,allocator,threads,params,ops_per_sec,wall_s,p50_ns,p99_ns,p999_ns,max_ns,peak_rss_kib"
  for row in 1,a,cmalloc,75 2,a,cmalloc,85 1,a,jemalloc,95 2,a,jemalloc,105 1,b,cmalloc,70 \
             2,b,cmalloc,99 1,b,jemalloc,90 2,b,jemalloc,110 1,c,cmalloc,100 1,c,jemalloc,100; do
    echo "${row%,*},1,p,${row##*,},,,,,,1000"
  done
} > "$tmp/spread/runs.csv"
python3 scripts/vs-best-peer.py "$tmp/spread/matrix.csv" --peers jemalloc \
  --spread "$tmp/spread/runs.csv" > "$tmp/vs-spread.txt" 2>&1
if grep -q '^cmalloc  *vs best peer .* 2 below 0.9 (1 apart);' "$tmp/vs-spread.txt" &&
   grep -q '^a  .*apart: cmalloc$' "$tmp/vs-spread.txt" &&
   ! grep -q '^b  .*apart' "$tmp/vs-spread.txt"; then
  echo "ok   vs-best-peer --spread: the gaps every repetition shows"
else echo "FAIL vs-best-peer --spread:"; sed 's/^/  | /' "$tmp/vs-spread.txt"; fail=1; fi

# bench-ab: two builds (here the same library twice) head to head, pinned to one vCPU; each
# prints its median and the ratio table (a ratio within a repetition, its lowest and highest).
# The order book's rows (ob1: one book, its stream made once) print the same two lines.
if bash scripts/bench-ab.sh --reps 2 --seconds 0.05 --rows churn1,ob1 --pin 0 \
    a=build/libcmalloc.so b=build/libcmalloc.so > "$tmp/ab.txt" 2>&1 &&
  grep -q '^churn1 .*MiB .*MiB$' "$tmp/ab.txt" &&
  grep -q '^ob1 .*M .*MiB .*M .*MiB$' "$tmp/ab.txt" &&
  grep -Eq '^churn1 +[0-9]+\.[0-9]{2} \[[0-9]+\.[0-9]{2} [0-9]+\.[0-9]{2}\]$' "$tmp/ab.txt" &&
  grep -Eq '^ob1 +[0-9]+\.[0-9]{2} \[[0-9]+\.[0-9]{2} [0-9]+\.[0-9]{2}\]$' "$tmp/ab.txt"; then
  echo "ok   bench-ab.sh medians and ratios"
else
  echo "FAIL bench-ab.sh:"; sed 's/^/  | /' "$tmp/ab.txt"; fail=1
fi
for row in nosuch obx; do
  if bash scripts/bench-ab.sh --rows $row a=build/libcmalloc.so > "$tmp/ab.txt" 2>&1; then
    echo "FAIL bench-ab.sh: an unknown row ($row) passed"; fail=1
  fi
done

[ "$fail" = 0 ] && echo "bench smoke: all ok"
exit "$fail"
