#!/bin/sh
# test_stats_report.sh - the report at exit reaches the user, says whose it is, and goes where
# CMALLOC_STATS_FILE says; scripts/cmalloc-stats says in one line what is wrong with a file.
#
# Checked, with real programs under the launcher or LD_PRELOAD:
#   - `cmalloc --stats /bin/echo hi` (and ls, cat, which like echo close stderr in an atexit
#     handler before the library's destructor runs) prints the report on stderr, and its first
#     line names the program and its pid (the launcher execs, so the pid is the shell's $$);
#     --stats=json the same as "pid" and "program" members;
#   - a program that points fd 2 at a file after start gets the report in that file; one that
#     closes every descriptor and reuses the copy's number for a file does not;
#   - CMALLOC_STATS_FILE=dir/%e.%p (and stats_file: in CMALLOC_CONF): under bash running three
#     programs (dash would _exit, running no destructor: no report of its own), one file per process, each named by its program and pid and headed by the
#     same; %% is a percent sign; a path without %p shared by two processes holds both reports
#     (appended, never truncated); a file that cannot be opened gets one line naming it on
#     stderr, and the report follows there;
#   - scripts/cmalloc-stats with a missing file, a directory or a file of bad JSON prints one
#     line (no traceback) and exits non-zero.
set -u
top=$(pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cmalloc-stats-report.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
lib=$top/build/libcmalloc.so
failures=0
fail() { echo "  FAIL: $*"; failures=$((failures + 1)); }

# header FILE PROGRAM PID: the first line of FILE is the report's header naming both.
header() {
    first=$(head -1 "$1")
    case "$first" in
        "cmalloc stats (version "*"): pid $3, program $2") ;;
        *) fail "$4: first line '$first', want the header naming $2 and pid $3" ;;
    esac
}

for program in "/bin/echo hi" "ls /" "cat /dev/null"; do
    name=${program%% *}
    name=${name##*/}
    sh -c 'echo $$ > "$1"; shift; exec "$@"' sh "$tmp/pid" scripts/cmalloc --stats $program \
        > "$tmp/out" 2> "$tmp/err"
    header "$tmp/err" "$name" "$(cat "$tmp/pid")" "cmalloc --stats $program"
    grep -q "^  in use: " "$tmp/err" || fail "cmalloc --stats $program: no report body: $(head -3 "$tmp/err")"
done
[ "$(scripts/cmalloc --stats /bin/echo hi 2> /dev/null)" = hi ] || fail "--stats changed echo's output"

sh -c 'echo $$ > "$1"; exec scripts/cmalloc --stats=json /bin/echo hi' sh "$tmp/pid" > /dev/null 2> "$tmp/err"
python3 - "$tmp/err" "$(cat "$tmp/pid")" <<'PY' || fail "--stats=json /bin/echo: $(head -c 200 "$tmp/err")"
import json, sys
line = [l for l in open(sys.argv[1]) if l.startswith('{"cmalloc":')][-1]
d = json.loads(line)
sys.exit(not (d["pid"] == int(sys.argv[2]) and d["program"] == "echo"))
PY

# fd 2 pointed elsewhere by the program itself: the report follows it.
CMALLOC_STATS=1 LD_PRELOAD=$lib python3 -c '
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
os.dup2(fd, 2)' "$tmp/redirected" 2> "$tmp/err"
grep -q "^cmalloc stats (version .*program python3" "$tmp/redirected" ||
    fail "fd 2 redirected by the program: report not in its file: $(head -2 "$tmp/redirected") / $(head -2 "$tmp/err")"

# A program that closes every descriptor and puts another file on the numbers the copy of
# stderr had, then closes fd 2: the report is not written into that file.
CMALLOC_STATS=1 LD_PRELOAD=$lib python3 -c '
import os, sys
os.closerange(2, 64)
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
for n in range(3, 10):
    if n != fd:
        os.dup2(fd, n)
os.close(fd)' "$tmp/reused" 2> /dev/null
[ -s "$tmp/reused" ] && fail "the report went into a file the program opened on the copy's number: $(head -1 "$tmp/reused")"

# One file per process, named and headed alike.
mkdir "$tmp/each"
CMALLOC_STATS=1 CMALLOC_STATS_FILE="$tmp/each/%e.%p" LD_PRELOAD=$lib \
    bash -c '/bin/echo one > /dev/null; /bin/echo two > /dev/null; cat /dev/null; true' 2> "$tmp/err"
[ -s "$tmp/err" ] && fail "STATS_FILE: stderr not empty: $(head -2 "$tmp/err")"
count=0
for f in "$tmp/each"/*; do
    [ -f "$f" ] || continue
    base=${f##*/}
    header "$f" "${base%.*}" "${base##*.}" "STATS_FILE $base"
    count=$((count + 1))
done
[ "$(ls "$tmp/each" | grep -c '^echo\.')" = 2 ] && [ "$(ls "$tmp/each" | grep -c '^cat\.')" = 1 ] &&
    [ "$(ls "$tmp/each" | grep -c '^bash\.')" = 1 ] || fail "STATS_FILE: files $(ls "$tmp/each" | tr '\n' ' '), want bash, two echo, one cat"

CMALLOC_CONF="stats:json,stats_file:$tmp/conf-%%-%e.json" LD_PRELOAD=$lib /bin/echo hi > /dev/null
grep -q '^{"cmalloc":.*"program":"echo"' "$tmp/conf-%-echo.json" 2> /dev/null ||
    fail "stats_file: in CMALLOC_CONF with %%: $(ls "$tmp")"

# A shared path: both reports, appended.
CMALLOC_STATS=1 CMALLOC_STATS_FILE="$tmp/shared" LD_PRELOAD=$lib bash -c '/bin/echo a; /bin/echo b; true' > /dev/null
[ "$(grep -c '^cmalloc stats (version' "$tmp/shared")" = 3 ] ||
    fail "a shared STATS_FILE holds $(grep -c '^cmalloc stats (version' "$tmp/shared") reports, want 3 (bash, two echo)"

# A file that cannot be opened: one line naming it, then the report on stderr.
CMALLOC_STATS=1 CMALLOC_STATS_FILE="$tmp/missing/dir/x" LD_PRELOAD=$lib /bin/true 2> "$tmp/err"
[ "$(head -1 "$tmp/err")" = "cmalloc: could not open CMALLOC_STATS_FILE '$tmp/missing/dir/x'; the report follows here" ] &&
    grep -q "^cmalloc stats (version .*program true\$" "$tmp/err" || fail "unopenable STATS_FILE: $(head -2 "$tmp/err")"

# scripts/cmalloc-stats: one line for a missing, unreadable or malformed file.
printf '{"cmalloc": nonsense\n' > "$tmp/bad.json"
for args in "diff $tmp/nothing-here $tmp/bad.json" "plot $tmp" "plot $tmp/bad.json"; do
    scripts/cmalloc-stats $args > "$tmp/out" 2> "$tmp/err" && fail "cmalloc-stats $args succeeded"
    [ "$(wc -l < "$tmp/err")" = 1 ] && grep -q "^cmalloc-stats: " "$tmp/err" ||
        fail "cmalloc-stats $args: not one line: $(head -3 "$tmp/err")"
done

if [ $failures -ne 0 ]; then
    echo "test_stats_report: $failures failure(s)"
    exit 1
fi
echo "test_stats_report: reports reach the user from echo, ls, cat; pid and program in each; STATS_FILE with %e, %p, %%; cmalloc-stats errors in one line"
