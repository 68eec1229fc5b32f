#!/bin/sh
# test_install.sh - make install / make uninstall into temporary prefixes.
#
# Checked: `make install PREFIX=$tmp/prefix` writes exactly the shared library with its soname
# links (libcmalloc.so -> libcmalloc.so.0 -> libcmalloc.so.0.1.0, whose SONAME is
# libcmalloc.so.0), the static library, the headers (cmalloc.h, and cmalloc.hpp when the tree
# has one), the launcher and cmalloc.pc; `pkg-config --cflags --libs cmalloc` against it builds
# a program that runs on the installed cmalloc (it sees its own malloc in cmalloc's counters and
# maps the installed library); `make uninstall` removes every one of those files and nothing
# else (a file of someone else's in the same directories stays), and the directories install
# created, none that were there before (an empty bin/ stays), also after installing twice;
# install to a custom prefix prints the -Wl,-rpath flag, and scripts/install-finish.sh runs
# ldconfig only for a directory the loader searches. The same with DESTDIR staging
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
        echo "$1/share/cmalloc/created-directories"
    } | sort
}
present() { find "$1" \( -type f -o -type l \) ! -name 'someone-else*' | sort; }

# ---- PREFIX -----------------------------------------------------------------------------------
prefix=$tmp/prefix
mkdir -p "$prefix/lib" "$prefix/include" "$prefix/bin"
echo keep > "$prefix/lib/someone-else.so"
echo keep > "$prefix/include/someone-else.h"
dirs_before=$(find "$prefix" -type d | sort)
$MAKE -s install PREFIX="$prefix" > "$tmp/log" 2>&1 || fail "make install: $(tail -3 "$tmp/log")"
grep -q -- "-Wl,-rpath,$prefix/lib" "$tmp/log" || fail "install to a custom prefix does not give the rpath flag: $(cat "$tmp/log")"
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
# The directories install made (lib/pkgconfig, share/cmalloc, share) are gone; those that
# were there (bin, empty, among them) stay.
[ "$(find "$prefix" -type d | sort)" = "$dirs_before" ] ||
    fail "directories after uninstall: $(find "$prefix" -type d | tr '\n' ' '), before install: $(echo $dirs_before)"
# Installed twice, uninstalled once: the directories of the first install still go.
$MAKE -s install PREFIX="$tmp/twice" > /dev/null 2>&1 && $MAKE -s install PREFIX="$tmp/twice" > /dev/null 2>&1 &&
    $MAKE -s uninstall PREFIX="$tmp/twice" > /dev/null 2>&1 || fail "install twice, uninstall"
[ ! -e "$tmp/twice" ] || fail "after two installs and an uninstall: $(find "$tmp/twice" | tr '\n' ' ')"

# ldconfig: run for a directory the loader searches, not for others (a fake ldconfig lists
# $FAKE_SEARCHED as searched and records being run; as non-root the command to run is said).
mkdir -p "$tmp/fakebin" "$tmp/searched/lib"
cat > "$tmp/fakebin/ldconfig" <<'S'
#!/bin/sh
if [ "${1:-}" = -v ]; then echo "$FAKE_SEARCHED: (from a fake ld.so.conf)"; else echo ran >> "$FAKE_LDCONFIG_LOG"; fi
S
chmod +x "$tmp/fakebin/ldconfig"
export FAKE_SEARCHED="$tmp/searched/lib" FAKE_LDCONFIG_LOG="$tmp/ldconfig.log"
out=$(PATH="$tmp/fakebin:$PATH" scripts/install-finish.sh "$tmp/searched/lib")
if [ "$(id -u)" -eq 0 ]; then
    [ "$(cat "$FAKE_LDCONFIG_LOG" 2> /dev/null)" = ran ] || fail "install-finish did not run ldconfig for a searched directory: $out"
else
    case "$out" in *"sudo ldconfig"*) ;; *) fail "install-finish, not root: does not say to run sudo ldconfig: $out" ;; esac
fi
rm -f "$FAKE_LDCONFIG_LOG"
out=$(PATH="$tmp/fakebin:$PATH" scripts/install-finish.sh "$prefix/lib")
[ ! -e "$FAKE_LDCONFIG_LOG" ] || fail "install-finish ran ldconfig for $prefix/lib, which the loader does not search"
case "$out" in *"-Wl,-rpath,$prefix/lib"*) ;; *) fail "install-finish for a custom prefix: $out" ;; esac

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
[ -z "$(find "$stage" -mindepth 1)" ] || fail "directories left after uninstall (DESTDIR): $(find "$stage" -mindepth 1 | tr '\n' ' ')"

if [ $failures -ne 0 ]; then
    echo "test_install: $failures failure(s)"
    exit 1
fi
echo "test_install: install, pkg-config build and run, uninstall (PREFIX and DESTDIR); nothing left behind"
