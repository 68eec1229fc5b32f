#!/bin/sh
# test_install.sh - make install / make uninstall into temporary prefixes.
#
# Checked: `make install PREFIX=$tmp/prefix` writes exactly the shared library with its soname
# links (libcmalloc.so -> libcmalloc.so.0 -> libcmalloc.so.0.1.0, whose SONAME is
# libcmalloc.so.0), the static library, the headers (cmalloc.h, and cmalloc.hpp when the tree
# has one), the launcher and cmalloc.pc; `pkg-config --cflags --libs cmalloc` against it builds
# a program that runs on the installed cmalloc (it sees its own malloc in cmalloc's counters and
# maps the installed library); `make uninstall` removes every one of those files and nothing
# else (a file of someone else's in the same directories stays). The same with DESTDIR staging
# for PREFIX=/opt/cmalloc-test: files land under DESTDIR, and cmalloc.pc and the launcher name
# the final paths, not the staging ones.
set -u
top=$(pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cmalloc-install.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
CC=${CC:-cc}
MAKE=${MAKE:-make}
failures=0
fail() { echo "  FAIL: $*"; failures=$((failures + 1)); }

expected() { # the files install must write under $1, sorted
    {
        echo "$1/bin/cmalloc"
        for h in include/cmalloc.h include/cmalloc.hpp; do [ -f "$h" ] && echo "$1/include/${h#include/}"; done
        echo "$1/lib/libcmalloc.a"
        echo "$1/lib/libcmalloc.so"
        echo "$1/lib/libcmalloc.so.0"
        echo "$1/lib/libcmalloc.so.0.1.0"
        echo "$1/lib/pkgconfig/cmalloc.pc"
    } | sort
}
present() { find "$1" \( -type f -o -type l \) ! -name 'someone-else*' | sort; }

# ---- PREFIX -----------------------------------------------------------------------------------
prefix=$tmp/prefix
mkdir -p "$prefix/lib" "$prefix/include"
echo keep > "$prefix/lib/someone-else.so"
echo keep > "$prefix/include/someone-else.h"
$MAKE -s install PREFIX="$prefix" > "$tmp/log" 2>&1 || fail "make install: $(tail -3 "$tmp/log")"
[ "$(present "$prefix")" = "$(expected "$prefix")" ] ||
    fail "installed files differ: $(present "$prefix" | tr '\n' ' ') want $(expected "$prefix" | tr '\n' ' ')"
[ "$(readlink "$prefix/lib/libcmalloc.so")" = libcmalloc.so.0 ] || fail "libcmalloc.so -> $(readlink "$prefix/lib/libcmalloc.so")"
[ "$(readlink "$prefix/lib/libcmalloc.so.0")" = libcmalloc.so.0.1.0 ] || fail "libcmalloc.so.0 -> $(readlink "$prefix/lib/libcmalloc.so.0")"
readelf -d "$prefix/lib/libcmalloc.so.0.1.0" | grep -q 'SONAME.*\[libcmalloc.so.0\]' || fail "installed library has no SONAME libcmalloc.so.0"
[ -x "$prefix/bin/cmalloc" ] || fail "launcher not executable"

cat > "$tmp/app.c" <<'C'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmalloc.h>

int main(void)
{
    cmalloc_stats before, during;
    cmalloc_stats_get(&before);
    char *p = malloc(1 << 20);
    memset(p, 1, 1 << 20);
    cmalloc_stats_get(&during);
    free(p);
    if (during.bytes_in_use < before.bytes_in_use + (1 << 20)) {
        printf("malloc(1 MiB) not counted by cmalloc\n");
        return 1;
    }
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[4096];
    while (maps && fgets(line, sizeof line, maps))
        if (strstr(line, "libcmalloc.so"))
            fputs(strchr(line, '/'), stdout);
    return 0;
}
C
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
flags=$(pkg-config --cflags --libs cmalloc) || fail "pkg-config --cflags --libs cmalloc failed"
case "$flags" in *"-I$prefix/include"*"-L$prefix/lib"*|*"-L$prefix/lib"*"-I$prefix/include"*) ;;
    *) fail "pkg-config flags do not name the prefix: $flags" ;; esac
if $CC "$tmp/app.c" $flags -Wl,-rpath,"$prefix/lib" -o "$tmp/app" 2> "$tmp/log"; then
    out=$("$tmp/app") || fail "app failed: $out"
    echo "$out" | grep -q "^$prefix/lib/libcmalloc.so.0.1.0\$" || fail "app does not map the installed library: $out"
else
    fail "cc app.c \$(pkg-config --cflags --libs cmalloc): $(head -3 "$tmp/log")"
fi

$MAKE -s uninstall PREFIX="$prefix" > "$tmp/log" 2>&1 || fail "make uninstall: $(tail -3 "$tmp/log")"
[ -z "$(present "$prefix")" ] || fail "left behind after uninstall: $(present "$prefix" | tr '\n' ' ')"
[ -f "$prefix/lib/someone-else.so" ] && [ -f "$prefix/include/someone-else.h" ] ||
    fail "uninstall removed files it did not install"

# ---- DESTDIR staging --------------------------------------------------------------------------
stage=$tmp/stage
final=/opt/cmalloc-test
$MAKE -s install DESTDIR="$stage" PREFIX="$final" > "$tmp/log" 2>&1 || fail "make install DESTDIR: $(tail -3 "$tmp/log")"
[ "$(present "$stage")" = "$(expected "$stage$final")" ] || fail "staged files differ: $(present "$stage" | tr '\n' ' ')"
grep -q "^libdir=$final/lib\$" "$stage$final/lib/pkgconfig/cmalloc.pc" || fail "staged cmalloc.pc does not name $final/lib"
grep -q "^installed_libdir=$final/lib\$" "$stage$final/bin/cmalloc" || fail "staged launcher does not name $final/lib"
[ ! -e "$final" ] || fail "install with DESTDIR wrote to $final"
$MAKE -s uninstall DESTDIR="$stage" PREFIX="$final" > "$tmp/log" 2>&1 || fail "make uninstall DESTDIR: $(tail -3 "$tmp/log")"
[ -z "$(present "$stage")" ] || fail "left behind after uninstall (DESTDIR): $(present "$stage" | tr '\n' ' ')"

if [ $failures -ne 0 ]; then
    echo "test_install: $failures failure(s)"
    exit 1
fi
echo "test_install: install, pkg-config build and run, uninstall (PREFIX and DESTDIR); nothing left behind"
