#!/bin/sh
# test_launcher.sh - scripts/cmalloc runs programs under cmalloc.
#
# Checked: it finds the library in the build tree, next to itself, in an install (make install
# into a temporary prefix, with the launcher run from $PREFIX/bin and through a symlink) and
# from --lib; the program really has libcmalloc mapped (/proc/self/maps); an existing
# LD_PRELOAD is kept, after cmalloc; the exit status is the program's; --stats prints the
# report at exit, --stats=json the JSON object; --check and --conf set CMALLOC_CHECK and
# CMALLOC_CONF (appended to one already set); with no library to be found it says so and
# exits 125; a bad option or no command prints the usage and exits 2; --help prints the usage
# and every option, exit 0; a library path holding a space and a colon works (a link), or
# exits 125 saying why.
set -u
top=$(pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cmalloc-launcher.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
CC=${CC:-cc}
MAKE=${MAKE:-make}
failures=0
fail() { echo "  FAIL: $*"; failures=$((failures + 1)); }

# maps LAUNCHER EXPECTED_LIBRARY [ARGS]: the launcher maps EXPECTED_LIBRARY into the program.
maps() {
    launcher=$1 want=$2
    shift 2
    if ! "$launcher" "$@" cat /proc/self/maps > "$tmp/maps" 2> "$tmp/err"; then
        fail "$launcher $*: failed: $(cat "$tmp/err")"
    elif ! grep -q " $(readlink -f "$want")\$" "$tmp/maps"; then
        fail "$launcher $*: $want not mapped in the program: $(grep cmalloc "$tmp/maps" | head -1)"
    fi
}

# From the build tree.
maps scripts/cmalloc build/libcmalloc.so
[ "$(scripts/cmalloc --print-library)" = "$top/build/libcmalloc.so" ] ||
    fail "--print-library: $(scripts/cmalloc --print-library), want $top/build/libcmalloc.so"

# Exit status is the program's.
scripts/cmalloc sh -c 'exit 7'
[ $? -eq 7 ] || fail "exit status 7 not passed through"
scripts/cmalloc -- false
[ $? -eq 1 ] || fail "exit status 1 of false not passed through"

# An existing LD_PRELOAD is kept, after cmalloc's library.
printf 'int cmalloc_test_marker;\n' > "$tmp/marker.c"
$CC -shared -fPIC "$tmp/marker.c" -o "$tmp/libmarker.so"
preload=$(LD_PRELOAD="$tmp/libmarker.so" scripts/cmalloc sh -c 'echo "$LD_PRELOAD"')
[ "$preload" = "$top/build/libcmalloc.so $tmp/libmarker.so" ] || fail "LD_PRELOAD became '$preload'"
LD_PRELOAD="$tmp/libmarker.so" scripts/cmalloc cat /proc/self/maps > "$tmp/maps"
grep -q libmarker.so "$tmp/maps" && grep -q libcmalloc.so "$tmp/maps" ||
    fail "the program did not map both libmarker.so and libcmalloc.so"

# --stats, --stats=json, --check, --conf.
scripts/cmalloc --stats python3 -c 'x = [str(i) for i in range(1000)]' 2> "$tmp/err" >/dev/null
grep -q "^cmalloc stats (version" "$tmp/err" || fail "--stats: no report on stderr: $(head -2 "$tmp/err")"
scripts/cmalloc --stats=json --conf mmap_threshold:2M true 2> "$tmp/err"
python3 -c 'import json,sys; d = json.loads(open(sys.argv[1]).read()); sys.exit(d["options"]["mmap_threshold"] != 2 << 20)' "$tmp/err" ||
    fail "--stats=json --conf mmap_threshold:2M: $(head -c 300 "$tmp/err")"
[ "$(scripts/cmalloc --check sh -c 'echo "$CMALLOC_CHECK"')" = 1 ] || fail "--check does not set CMALLOC_CHECK=1"
conf=$(CMALLOC_CONF=check:0 scripts/cmalloc --conf stats:1 --conf=verbose:0 sh -c 'echo "$CMALLOC_CONF"')
[ "$conf" = "check:0,stats:1,verbose:0" ] || fail "--conf appended to CMALLOC_CONF: '$conf'"

# Usage errors and a missing library.
scripts/cmalloc --bogus true 2> "$tmp/err"
[ $? -eq 2 ] && grep -q "unknown option '--bogus'" "$tmp/err" || fail "--bogus: no usage error"
scripts/cmalloc 2> "$tmp/err"
[ $? -eq 2 ] && grep -q "^usage: cmalloc" "$tmp/err" || fail "no command: no usage"
mkdir "$tmp/alone"
cp scripts/cmalloc "$tmp/alone/cmalloc"
"$tmp/alone/cmalloc" true 2> "$tmp/err"
[ $? -eq 125 ] && grep -q "cannot find the cmalloc library" "$tmp/err" || fail "no library: $(cat "$tmp/err")"
maps "$tmp/alone/cmalloc" build/libcmalloc.so --lib build/libcmalloc.so

# --help: the usage and every option of the library's table, on stdout, exit status 0.
scripts/cmalloc --help > "$tmp/help" 2> "$tmp/err"
[ $? -eq 0 ] || fail "--help: exit status not 0"
grep -q "^usage: cmalloc" "$tmp/help" || fail "--help: no usage on stdout"
for name in $(sed -n 's/^ *{"\([A-Z_]*\)", &cm_.*/\1/p' src/options.c); do
    grep -q "^  CMALLOC_$name=" "$tmp/help" || fail "--help does not list CMALLOC_$name"
done
grep -q "^  CMALLOC_VERBOSE=0 " "$tmp/help" || fail "--help: VERBOSE not shown at its default"
[ -s "$tmp/err" ] && fail "--help wrote to stderr: $(head -2 "$tmp/err")"

# A library whose path holds a space and a colon (LD_PRELOAD splits at both): preloaded
# through a link, beside the launcher and with --lib, with --stats working; when no private
# link directory can be made (or the one there is not the user's alone), exit 125 and why.
odd="$tmp/a dir:with colon"
mkdir "$odd"
cp scripts/cmalloc build/libcmalloc.so "$odd/"
links="$tmp/links"
mkdir "$links"
TMPDIR=$links maps "$odd/cmalloc" "$odd/libcmalloc.so"
TMPDIR=$links maps "$tmp/alone/cmalloc" "$odd/libcmalloc.so" --lib "$odd/libcmalloc.so"
TMPDIR=$links XDG_RUNTIME_DIR= "$odd/cmalloc" --stats /bin/echo hi > "$tmp/out" 2> "$tmp/err"
[ "$(cat "$tmp/out")" = hi ] && grep -q "^cmalloc stats (version .*program echo\$" "$tmp/err" ||
    fail "library path with a space and a colon: --stats /bin/echo: $(head -2 "$tmp/err")"
[ "$(stat -c %a "$links/cmalloc-links-$(id -u)")" = 700 ] || fail "link directory not mode 700"
mkdir -m 755 "$tmp/loose" "$tmp/loose/cmalloc-links-$(id -u)"
XDG_RUNTIME_DIR="$tmp/not-a-dir" TMPDIR="$tmp/loose" "$odd/cmalloc" /bin/true 2> "$tmp/err"
[ $? -eq 125 ] && grep -q "holds a space or a colon, which LD_PRELOAD cannot carry" "$tmp/err" ||
    fail "no private link directory: want exit 125 and the reason: $(cat "$tmp/err")"
[ -z "$(ls "$tmp/loose/cmalloc-links-$(id -u)")" ] || fail "a link was made in a directory others may write"

# Next to itself.
mkdir "$tmp/side"
cp scripts/cmalloc build/libcmalloc.so "$tmp/side/"
maps "$tmp/side/cmalloc" "$tmp/side/libcmalloc.so"

# From an install, run from bin/ and through a symlink elsewhere.
if $MAKE -s install PREFIX="$tmp/prefix" > "$tmp/install.log" 2>&1; then
    maps "$tmp/prefix/bin/cmalloc" "$tmp/prefix/lib/libcmalloc.so.0"
    ln -s "$tmp/prefix/bin/cmalloc" "$tmp/alone/linked"
    maps "$tmp/alone/linked" "$tmp/prefix/lib/libcmalloc.so.0"
    [ "$("$tmp/prefix/bin/cmalloc" --print-library)" = "$tmp/prefix/lib/libcmalloc.so.0" ] ||
        fail "installed --print-library: $("$tmp/prefix/bin/cmalloc" --print-library)"
else
    fail "make install PREFIX=$tmp/prefix: $(tail -3 "$tmp/install.log")"
fi

if [ $failures -ne 0 ]; then
    echo "test_launcher: $failures failure(s)"
    exit 1
fi
echo "test_launcher: build tree, beside itself, install, symlink and --lib; LD_PRELOAD kept; exit status, --stats, --check, --conf"
