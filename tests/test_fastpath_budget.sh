#!/bin/sh
# test_fastpath_budget.sh - guards the fast path mechanically: callgrind counts the
# instructions of a malloc+free pair that hits the thread cache (tests/data/fastpath_pair.c,
# loop and PLT jumps included) and the test fails when a size exceeds its recorded budget.
# Instruction counts do not depend on machine load, so the budget can be tight. Raise it only
# with a reason in the commit message. valgrind comes from scripts/deps.sh.
set -eu
BUDGET=${FASTPATH_BUDGET:-73}               # sizes up to 1 KiB
BUDGET_MEDIUM=${FASTPATH_BUDGET_MEDIUM:-76} # above: one more size test
N=20000
command -v valgrind >/dev/null || { echo "test_fastpath_budget: valgrind is missing (run scripts/deps.sh)"; exit 1; }
mkdir -p build/tests
cc -O2 -fno-builtin tests/data/fastpath_pair.c -o build/tests/fastpath_pair
lib="$PWD/build/libcmalloc.so"
count() { # instructions of the whole run
    LD_PRELOAD="$lib" valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        build/tests/fastpath_pair "$1" "$2" 2>&1 | sed -n 's/.*refs: *//p' | tr -d ,
}
status=0
for size in 16 64 1000 20000; do
    base=$(count 0 "$size")
    full=$(count "$N" "$size")
    per_pair=$(( (full - base) / N ))
    verdict=ok
    budget=$BUDGET
    [ "$size" -le 1024 ] || budget=$BUDGET_MEDIUM
    [ "$per_pair" -le "$budget" ] || { verdict="OVER BUDGET ($budget)"; status=1; }
    echo "malloc($size)+free: $per_pair instructions per pair: $verdict"
done
exit $status
