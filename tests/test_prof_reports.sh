#!/bin/sh
# test_prof_reports.sh - the profiler's, the guard's and the debug mode's reports and their
# behaviour at the edges, the way a user meets them: tests/data/prof_reports.c built as an
# ordinary program (no -rdynamic) run under LD_PRELOAD=libcmalloc.so, and statically linked
# with libcmalloc.a.
#   - the leak report at exit never hangs beside a thread inside dlopen (40 runs under a
#     timeout; at d1a4356, 13 of 40 runs hung);
#   - a SIGSEGV sent with raise, kill or pthread_kill kills the process (139) with the guard on,
#     as it does without cmalloc;
#   - a static program works with the profiler and the guard on (allocations, a profile with
#     samples, a guarded overflow reported and fatal);
#   - CMALLOC_PROF_SIGNAL by any catchable signal's name, refusals worded as they are (and the
#     refused signal not listed as in force by CMALLOC_VERBOSE); a dump that fails is reported
#     once naming its file; CMALLOC_PROF_DUMP= (empty) gets one warning;
#   - the profile at exit survives wrappers (timeout, sh -c) and several children of one parent
#     (google-pprof names the program's function from the file), %p and %e name files; the
#     stats report at exit names the file that holds its process's profile;
#   - leak and guard reports name the functions of a program built without -rdynamic, dynamic
#     and static, as "function+0xoff (object+0xvaddr)"; a guard report starts with the stack of
#     the faulting access, then the allocation's, then the free's; scripts/cmalloc-symbolize
#     turns a frame into function file:line;
#   - frames in libc, stripped of .symtab, are named from its debug file by build-id (memset's
#     implementation in a guarded overflow by memset, __libc_start_call_main); a stripped
#     program is named from the debug file its .gnu_debuglink names when that file is its own
#     (build-id, or CRC-32 without one), and not from another build's;
#   - CMALLOC_CHECK reports (overflow, double free, write after free) give the stack of the call
#     that found the error and the block's allocation stack; a write to a freed block still in
#     the quarantine at exit is reported at exit;
# TEST_LIB_DIR (default build) is where libcmalloc.so and libcmalloc.a are taken from, so
# that the same checks can be run against another build.
set -u
lib_dir=${TEST_LIB_DIR:-build}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cmalloc-reports.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "  FAIL: $*"; failures=$((failures + 1)); }
preload="$(cd "$lib_dir" && pwd)/libcmalloc.so"
prog="$tmp/prof_reports"
${CC:-cc} -O1 -g tests/data/prof_reports.c -o "$prog" -pthread ||
    { echo "test_prof_reports: cannot build the test program"; exit 1; }
run() { LD_PRELOAD="$preload" "$@"; }

# The leak report names frames after dropping the profiler's lock: a thread inside dlopen holds
# the loader's lock and makes sampled allocations. 40 runs, each under a 5 s timeout (a run takes well under 1 s).
${CC:-cc} -O1 -g -shared -fPIC tests/data/prof_plugin.c -o "$tmp/plugin.so" ||
    fail "cannot build the plugin"
hung=0
for i in $(seq 40); do
    CMALLOC_PROF_LEAKS=1 CMALLOC_PROF_RATE=1 run timeout 5 "$prog" leak-dlopen "$tmp/plugin.so" \
        2>"$tmp/leak-dlopen.txt"
    status=$?
    if [ "$status" -eq 124 ]; then
        hung=$((hung + 1))
    elif [ "$status" -ne 0 ] || ! grep -q 'leak report' "$tmp/leak-dlopen.txt"; then
        head -5 "$tmp/leak-dlopen.txt"
        fail "leak report beside dlopen, run $i: status $status"
        break
    fi
done
[ "$hung" -eq 0 ] || fail "the leak report hung at exit beside a thread in dlopen: $hung of 40 runs"

# A SIGSEGV that was sent, not a fault, kills the process with the guard on.
for how in raise kill pthread_kill; do
    CMALLOC_GUARD_RATE=1 run "$prog" "$how" >"$tmp/$how.txt" 2>&1
    status=$?
    [ "$status" -eq 139 ] ||
        fail "SIGSEGV sent by $how with CMALLOC_GUARD_RATE=1: status $status, not 139 ($(cat "$tmp/$how.txt"))"
done

# A static program (libcmalloc.a, -static) with the profiler or the guard on: libc allocates
# before it can unwind, and a static program cannot dlopen libunwind; both work there.
static="$tmp/prof_reports_static"
${CC:-cc} -O1 -g -static tests/data/prof_reports.c -o "$static" "$lib_dir/libcmalloc.a" -pthread \
    2>"$tmp/static-build.txt" || { cat "$tmp/static-build.txt"; fail "cannot link the static program"; }
for options in CMALLOC_GUARD_RATE=1 CMALLOC_GUARD_RATE=100 "CMALLOC_PROF=1 CMALLOC_PROF_RATE=1" \
    "CMALLOC_PROF=1 CMALLOC_GUARD_RATE=10"; do
    env $options "$static" work 2000 >"$tmp/static.txt" 2>&1 ||
        fail "static program with $options: status $? ($(head -c 300 "$tmp/static.txt"))"
done
CMALLOC_PROF_DUMP="$tmp/static.heap" CMALLOC_PROF_RATE=4K "$static" work 2000 ||
    fail "static program with CMALLOC_PROF_DUMP: status $?"
grep -q '^heap profile: *[1-9]' "$tmp/static.heap" 2>/dev/null ||
    fail "static program: no samples in the profile ($(head -1 "$tmp/static.heap" 2>&1))"
CMALLOC_GUARD_RATE=1 "$static" overflow 2>"$tmp/static-overflow.txt"
status=$?
[ "$status" -eq 139 ] && grep -q 'heap buffer overflow' "$tmp/static-overflow.txt" ||
    fail "static program, guarded overflow: status $status, not 139 with a report ($(head -c 300 "$tmp/static-overflow.txt"))"

# CMALLOC_PROF_SIGNAL takes every catchable signal by name (with or without SIG, SIGRTMIN+n);
# a refusal says why. Each signal-requested dump writes <path>.<pid>.<n>.heap.
for sig in SIGINT TERM SIGQUIT SIGALRM SIGRTMIN SIGRTMIN+3 SIGRTMAX-1 SIGPWR; do
    rm -f "$tmp"/sig.*
    CMALLOC_PROF_SIGNAL=$sig CMALLOC_PROF_RATE=1 CMALLOC_PROF_DUMP="$tmp/sig" run "$prog" \
        signal-dump "$sig" >"$tmp/sig-out.txt" 2>&1
    status=$?
    [ "$status" -eq 0 ] && [ ! -s "$tmp/sig-out.txt" ] && ls "$tmp"/sig.*.1.heap >/dev/null 2>&1 ||
        fail "CMALLOC_PROF_SIGNAL=$sig: status $status, $(ls "$tmp" | grep -c '^sig\..*heap') dumps ($(cat "$tmp/sig-out.txt"))"
done
expect_refusal() { # value, words the warning must hold; CMALLOC_VERBOSE lists no signal
    CMALLOC_VERBOSE=1 CMALLOC_PROF_SIGNAL=$1 run "$prog" nothing 2>"$tmp/refusal.txt"
    grep -q "ignoring CMALLOC_PROF_SIGNAL=$1 ($2" "$tmp/refusal.txt" ||
        fail "CMALLOC_PROF_SIGNAL=$1: no refusal saying '$2' ($(cat "$tmp/refusal.txt"))"
    grep -q "^  CMALLOC_PROF_SIGNAL=  " "$tmp/refusal.txt" ||
        fail "CMALLOC_PROF_SIGNAL=$1, refused: CMALLOC_VERBOSE lists it as in force ($(grep '^  CMALLOC_PROF_SIGNAL' "$tmp/refusal.txt"))"
}
expect_refusal SIGKILL 'this signal cannot be caught'
expect_refusal STOP 'this signal cannot be caught'
expect_refusal SIGSEGV 'this signal reports faults'
expect_refusal SIGNOPE 'not a signal name or number'
expect_refusal SIGRTMIN+99 'not a signal name or number'
expect_refusal 32 'the system refused a handler for it'

# A dump that cannot be written is reported once, naming the file: each signal-requested one
# (two here) and the one at exit.
missing="$tmp/no-such-directory/app"
CMALLOC_PROF_SIGNAL=USR1 CMALLOC_PROF_RATE=1 CMALLOC_PROF_DUMP="$missing" run "$prog" signal-dump USR1 \
    2>"$tmp/unwritable.txt"
for name in "$missing\.[0-9]*\.0\.heap" "$missing\.[0-9]*\.1\.heap" "$missing"; do
    [ "$(grep -c "^cmalloc: could not write the heap profile to $name (ENOENT)\$" "$tmp/unwritable.txt")" -eq 1 ] ||
        fail "an unwritable dump ($name) is not reported exactly once: $(cat "$tmp/unwritable.txt")"
done
# An empty CMALLOC_PROF_DUMP names no file: one warning saying so, no failure to write "".
CMALLOC_PROF_DUMP= run "$prog" work 10 2>"$tmp/empty.txt"
grep -q 'ignoring CMALLOC_PROF_DUMP= (empty' "$tmp/empty.txt" && ! grep -q 'could not write' "$tmp/empty.txt" ||
    fail "CMALLOC_PROF_DUMP= (empty): $(cat "$tmp/empty.txt")"

# The profile at exit under a wrapper, a shell and as several children of one parent: no
# process's exit destroys another's profile; the program's function is named by google-pprof
# from CMALLOC_PROF_DUMP's file (the program exits before the wrapper), and each child's
# profile is in a file of its own.
names_work() { # profile: google-pprof names the program's allocating function from it
    google-pprof --text "$prog" "$1" 2>/dev/null | grep -q allocate_in_work_function
}
command -v google-pprof >/dev/null || fail "google-pprof is missing (run scripts/deps.sh)"
for wrapper in "timeout 60" "sh -c" "children"; do
    rm -f "$tmp"/w.heap*
    case $wrapper in
    "sh -c") CMALLOC_PROF_DUMP="$tmp/w.heap" CMALLOC_PROF_RATE=4K run sh -c "\"$prog\" work 2000; true" ;;
    children) CMALLOC_PROF_DUMP="$tmp/w.heap" CMALLOC_PROF_RATE=4K run "$prog" children 3 2>/dev/null ;;
    *) CMALLOC_PROF_DUMP="$tmp/w.heap" CMALLOC_PROF_RATE=4K run $wrapper "$prog" work 2000 2>/dev/null ;;
    esac
    names_work "$tmp/w.heap" ||
        fail "under $wrapper, w.heap does not name the program's function ($(head -1 "$tmp/w.heap" 2>&1))"
    if [ "$wrapper" = children ]; then
        named=0
        for f in "$tmp"/w.heap*; do names_work "$f" && named=$((named + 1)); done
        [ "$named" -eq 4 ] || fail "3 children and their parent: $named profiles name the function, not 4 ($(ls "$tmp"))"
    fi
done
# The stats report at exit names the file its process's profile went to (the profile is
# written first): under timeout and sh -c, the program's first run takes the name, its second
# gets <name>.<pid>, timeout's exit comes last; each report names its own file, and google-pprof
# names the program's function from each of the program's two.
rm -f "$tmp"/s.heap*
CMALLOC_PROF=1 CMALLOC_PROF_DUMP="$tmp/s.heap" CMALLOC_STATS=1 CMALLOC_PROF_RATE=4K \
    run timeout 60 sh -c "\"$prog\" work 2000; \"$prog\" work 2000; true" 2>"$tmp/stats-named.txt"
awk '/^cmalloc stats .*: pid [0-9]*, program / { pid = $6; sub(",", "", pid); program = $8 }
    /^  heap profile: *written at exit to / { print program, pid, $NF }' "$tmp/stats-named.txt" \
    >"$tmp/named.txt"
[ "$(grep -c '^prof_reports ' "$tmp/named.txt")" -eq 2 ] && [ "$(grep -c "^prof_reports [0-9]* $tmp/s.heap\$" "$tmp/named.txt")" -eq 1 ] &&
    [ "$(grep -c '^timeout ' "$tmp/named.txt")" -eq 1 ] ||
    fail "the stats reports do not name the program's two profiles and timeout's: $(cat "$tmp/named.txt")"
while read -r program pid file; do
    [ "$file" = "$tmp/s.heap" ] || [ "$file" = "$tmp/s.heap.$pid" ] ||
        fail "$program (pid $pid): its stats report names $file, not s.heap or s.heap.$pid"
    [ "$program" = timeout ] && { [ -s "$file" ] || fail "timeout: $file, named by its report, is empty"; }
    [ "$program" = prof_reports ] && { names_work "$file" ||
        fail "$file, named by the program's stats report, does not name its function ($(head -1 "$file" 2>&1))"; }
done <"$tmp/named.txt"
# A second run replaces the first run's profile (the first process to start empties it).
CMALLOC_PROF_DUMP="$tmp/w.heap" CMALLOC_PROF_RATE=4K run "$prog" nothing 2>"$tmp/rerun.txt"
[ ! -s "$tmp/rerun.txt" ] && ! names_work "$tmp/w.heap" ||
    fail "a second run did not write w.heap itself ($(cat "$tmp/rerun.txt"))"
# %p and %e: the process id and the program's name.
rm -f "$tmp"/p.*
CMALLOC_PROF_DUMP="$tmp/p.%e.%p.heap" CMALLOC_PROF_RATE=4K run sh -c "\"$prog\" work 2000; true"
set -- "$tmp"/p.prof_reports.[0-9]*.heap
[ -f "$1" ] && names_work "$1" || fail "CMALLOC_PROF_DUMP with %e and %p: $(ls "$tmp")"

# Stacks name the program's functions without -rdynamic (from its .symtab), each frame as
# "function+0xoff (object+0xvaddr)"; a guard report gives the faulting access first, then the
# allocation (then the free); scripts/cmalloc-symbolize adds file:line with addr2line.
frame() { # function: the pattern of a frame naming it in this program
    echo "#[0-9]* 0x[0-9a-f]* $1+0x[0-9a-f]* ($2+0x[0-9a-f]*)"
}
# Line numbers of the sections of a report and of the first frame after each: each section's
# first frame must name the function given.
expect_sections() { # report, then pairs: section heading, function
    report=$1
    shift
    last=0
    while [ $# -ge 2 ]; do
        at=$(grep -n "^  $1" "$report" | head -1 | cut -d: -f1)
        first=$([ -n "$at" ] && sed -n "$((at + 1))p" "$report")
        if [ -z "$at" ] || [ "$at" -le "$last" ] || ! echo "$first" | grep -q "$(frame "$2" "$binary")"; then
            fail "$(basename "$report"): '$1' is not followed by a frame naming $2 in order:"
            cat "$report"
        fi
        last=${at:-0}
        shift 2
    done
}
for binary in "$prog" "$static"; do
    use() { if [ "$binary" = "$prog" ]; then run "$@"; else "$@"; fi; }
    kind=$([ "$binary" = "$prog" ] && echo dynamic || echo static)
    CMALLOC_PROF_LEAKS=1 CMALLOC_PROF_RATE=64K use "$binary" leak 2>"$tmp/leak-$kind.txt"
    grep -q "$(frame leaky_function "$binary")" "$tmp/leak-$kind.txt" ||
        { cat "$tmp/leak-$kind.txt"; fail "$kind: the leak report does not name leaky_function"; }
    CMALLOC_GUARD_RATE=1 use "$binary" overflow 2>"$tmp/overflow-$kind.txt"
    expect_sections "$tmp/overflow-$kind.txt" "the access, at:" write_past_end "allocated at:" make_block
    CMALLOC_GUARD_RATE=1 use "$binary" use-after-free 2>"$tmp/uaf-$kind.txt"
    grep -q 'use after free' "$tmp/uaf-$kind.txt" || fail "$kind: no use after free reported"
    expect_sections "$tmp/uaf-$kind.txt" "the access, at:" write_after_drop "allocated at:" make_block \
        "freed at:" drop_block
done
# An object stripped of .symtab (Debian's libc) has its frames named from its separate debug
# file, found by its build-id under /usr/lib/debug/.build-id (libc6-dbg, which scripts/deps.sh
# installs): a guarded overflow done by memset names memset's implementation in the access's
# first frame, and the leak report names __libc_start_call_main and, of the aliases at the
# next frame's address, __libc_start_main (the global one, without its symbol version). Without
# the debug file of the libc the program loads, the test says so and checks libc's frames as
# object+offset only.
CMALLOC_GUARD_RATE=1 run "$prog" overflow-memset 2>"$tmp/overflow-memset.txt"
binary=$prog
expect_sections "$tmp/overflow-memset.txt" "allocated at:" make_block
access=$(grep -A1 '^  the access, at:' "$tmp/overflow-memset.txt" | sed -n 2p)
libc=$(echo "$access" | sed -n 's/^ *#0 0x[0-9a-f]* .*(\(\/.*libc\.so\.6\)+0x[0-9a-f]*)$/\1/p')
grep -A2 '^  the access, at:' "$tmp/overflow-memset.txt" | sed -n 3p | grep -q "^ *$(frame memset_past_end "$prog")\$" &&
    [ -n "$libc" ] ||
    { cat "$tmp/overflow-memset.txt"; fail "overflow by memset: the access is not in libc, called from memset_past_end"; }
build_id=$([ -n "$libc" ] && readelf -n "$libc" | sed -n 's/^ *Build ID: \([0-9a-f]*\)$/\1/p')
debug_file=/usr/lib/debug/.build-id/$(echo "$build_id" | cut -c1-2)/$(echo "$build_id" | cut -c3-).debug
if [ -n "$build_id" ] && [ -f "$debug_file" ]; then
    echo "$access" | grep -q "^ *#0 0x[0-9a-f]* __memset[a-z0-9_]*+0x[0-9a-f]* ($libc+0x[0-9a-f]*)\$" ||
        { cat "$tmp/overflow-memset.txt"; fail "overflow by memset: #0 does not name libc's __memset (debug file $debug_file)"; }
    grep -q "#[0-9]* 0x[0-9a-f]* __libc_start_call_main+0x[0-9a-f]* ($libc+0x[0-9a-f]*)\$" "$tmp/leak-dynamic.txt" &&
        grep -q "#[0-9]* 0x[0-9a-f]* __libc_start_main+0x[0-9a-f]* ($libc+0x[0-9a-f]*)\$" "$tmp/leak-dynamic.txt" ||
        { cat "$tmp/leak-dynamic.txt"; fail "the leak report does not name __libc_start_call_main and __libc_start_main (debug file $debug_file)"; }
else
    echo "test_prof_reports: no debug file for $libc (build-id '$build_id'; scripts/deps.sh installs libc6-dbg): libc's frames checked as object+offset only"
    echo "$access" | grep -q "^ *#0 0x[0-9a-f]* ($libc+0x[0-9a-f]*)\$" ||
        { cat "$tmp/overflow-memset.txt"; fail "overflow by memset: #0 is not libc's object+offset"; }
fi

# A program stripped of .symtab whose .gnu_debuglink names a file in <its directory>/.debug/ is
# named from that file's .symtab when the file is the program's debug file (the same build-id,
# or for a program built without one, the CRC-32 the link holds), and not named at all when the
# file there is another build's.
for build_id in sha1 none; do
    dir="$tmp/link-$build_id"
    mkdir -p "$dir/.debug"
    for opt in O0 O1; do
        ${CC:-cc} -$opt -g -Wl,--build-id=$build_id tests/data/prof_reports.c -o "$dir/prog-$opt" -pthread &&
            objcopy --only-keep-debug "$dir/prog-$opt" "$dir/prog-$opt.debug" &&
            strip -s "$dir/prog-$opt" || fail "cannot build and split prog-$opt (--build-id=$build_id)"
    done
    cp "$dir/prog-O1.debug" "$dir/.debug/prog.debug"
    objcopy --add-gnu-debuglink="$dir/.debug/prog.debug" "$dir/prog-O1" "$dir/prog" ||
        fail "objcopy --add-gnu-debuglink (--build-id=$build_id)"
    for debug in prog-O1 prog-O0; do
        cp "$dir/$debug.debug" "$dir/.debug/prog.debug"
        CMALLOC_PROF_LEAKS=1 CMALLOC_PROF_RATE=64K run "$dir/prog" leak 2>"$tmp/link.txt"
        first=$(grep -A1 'allocated at:' "$tmp/link.txt" | sed -n 2p)
        if [ "$debug" = prog-O1 ]; then
            echo "$first" | grep -q "$(frame leaky_function "$dir/prog")" ||
                { cat "$tmp/link.txt"; fail "--build-id=$build_id, stripped, its debug file in .debug/: leaky_function not named"; }
        else
            echo "$first" | grep -q "^ *#0 0x[0-9a-f]* ($dir/prog+0x[0-9a-f]*)\$" ||
                { cat "$tmp/link.txt"; fail "--build-id=$build_id, stripped, another build's debug file in .debug/: #0 is named from it"; }
        fi
    done
done

# CMALLOC_CHECK reports: the stack of the call that found the error, then the block's
# allocation stack; a write to a freed block still quarantined at exit is reported then.
for binary in "$prog" "$static"; do
    use() { if [ "$binary" = "$prog" ]; then run "$@"; else "$@"; fi; }
    kind=$([ "$binary" = "$prog" ] && echo dynamic || echo static)
    for mode in check-overflow check-double-free check-write-after-free check-quarantine; do
        CMALLOC_CHECK=1 use "$binary" $mode 2>"$tmp/$mode-$kind.txt"
        status=$?
        [ "$status" -eq 134 ] || fail "$kind $mode: status $status, not an abort (134): $(cat "$tmp/$mode-$kind.txt")"
    done
    grep -q '^cmalloc: heap buffer overflow past the block' "$tmp/check-overflow-$kind.txt" &&
        grep -q '^cmalloc: double free' "$tmp/check-double-free-$kind.txt" &&
        grep -q '^cmalloc: write to freed memory at' "$tmp/check-write-after-free-$kind.txt" &&
        grep -q '^cmalloc: write to freed memory (found at exit, still quarantined) at' "$tmp/check-quarantine-$kind.txt" ||
        fail "$kind: a CMALLOC_CHECK report is missing"
    for mode in check-overflow check-double-free check-write-after-free; do
        expect_sections "$tmp/$mode-$kind.txt" "found by the call at:" free_checked_block \
            "allocated at:" make_block
    done
    expect_sections "$tmp/check-quarantine-$kind.txt" "allocated at:" make_block
done

store_line=$(grep -n "((volatile char \*)p)\[size + 12\] = 'x';" tests/data/prof_reports.c | cut -d: -f1)
python3 scripts/cmalloc-symbolize "$tmp/overflow-dynamic.txt" >"$tmp/symbolized.txt"
grep -A1 'the access, at:' "$tmp/symbolized.txt" | grep -q "at write_past_end .*prof_reports.c:$store_line\$" ||
    { cat "$tmp/symbolized.txt"; fail "cmalloc-symbolize does not give write_past_end at prof_reports.c:$store_line"; }

[ "$failures" -eq 0 ] || { echo "test_prof_reports: $failures failures"; exit 1; }
echo "test_prof_reports: ok"
