#!/bin/sh
# test_deb.sh - `make deb` builds a Debian package that installs and removes cleanly.
#
# Checked: build/cmalloc_<version>_<arch>.deb holds exactly the library with its soname links
# (whose SONAME is libcmalloc.so.0), the static library, the headers, the launcher (naming
# /usr/lib as its library directory) and cmalloc.pc, under /usr; its control names the
# package, the Makefile's version and this machine's architecture, and asks for dpkg's ldconfig
# trigger. Installed with the real dpkg into an empty root (dpkg --root, so this machine is not
# touched; --force-depends since that root has no libc6), every file is there and the launcher
# from it runs a program on the installed library; `dpkg -r` then leaves nothing of it.
set -u
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cmalloc-deb.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
MAKE=${MAKE:-make}
failures=0
fail() { echo "  FAIL: $*"; failures=$((failures + 1)); }

version=$(sed -n 's/^VERSION *:= *//p' Makefile)
arch=$(dpkg --print-architecture)
deb=build/cmalloc_${version}_$arch.deb
$MAKE -s deb > "$tmp/log" 2>&1 || { echo "test_deb: make deb failed: $(tail -3 "$tmp/log")"; exit 1; }
[ -f "$deb" ] || { echo "test_deb: make deb made no $deb"; exit 1; }

files=$(dpkg-deb -c "$deb" | awk '{print $6}' | grep -v '/$' | sort)
want=$(printf '%s\n' ./usr/bin/cmalloc ./usr/include/cmalloc.h \
    $([ -f include/cmalloc.hpp ] && echo ./usr/include/cmalloc.hpp) ./usr/lib/libcmalloc.a \
    ./usr/lib/libcmalloc.so ./usr/lib/libcmalloc.so.0 "./usr/lib/libcmalloc.so.$version" \
    ./usr/lib/pkgconfig/cmalloc.pc | sort)
[ "$files" = "$want" ] || fail "package contents: $(echo $files), want $(echo $want)"
dpkg-deb -c "$deb" | grep -q "./usr/lib/libcmalloc.so.0 -> libcmalloc.so.$version\$" || fail "libcmalloc.so.0 is not a link to libcmalloc.so.$version"
[ "$(dpkg-deb -f "$deb" Package)" = cmalloc ] || fail "Package: $(dpkg-deb -f "$deb" Package)"
[ "$(dpkg-deb -f "$deb" Version)" = "$version" ] || fail "Version: $(dpkg-deb -f "$deb" Version)"
[ "$(dpkg-deb -f "$deb" Architecture)" = "$arch" ] || fail "Architecture: $(dpkg-deb -f "$deb" Architecture)"
dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./triggers 2> /dev/null | grep -q "^activate-noawait ldconfig\$" ||
    fail "no ldconfig trigger in the package"
mkdir "$tmp/x"
dpkg-deb -x "$deb" "$tmp/x"
readelf -d "$tmp/x/usr/lib/libcmalloc.so.$version" | grep -q 'SONAME.*\[libcmalloc.so.0\]' || fail "packaged library has no SONAME libcmalloc.so.0"
grep -q '^installed_libdir=/usr/lib$' "$tmp/x/usr/bin/cmalloc" || fail "packaged launcher does not name /usr/lib"
grep -q '^libdir=/usr/lib$' "$tmp/x/usr/lib/pkgconfig/cmalloc.pc" || fail "packaged cmalloc.pc does not name /usr/lib"

root=$tmp/root
mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates"
: > "$root/var/lib/dpkg/status"
if dpkg --root="$root" --log=/dev/null --force-depends -i "$deb" > "$tmp/log" 2>&1; then
    [ "$(dpkg --root="$root" -s cmalloc 2> /dev/null | sed -n 's/^Status: //p')" = "install ok installed" ] ||
        fail "dpkg -i: cmalloc not installed in the root"
    for f in $want; do [ -e "$root/${f#./}" ] || fail "dpkg -i: $f missing"; done
    out=$("$root/usr/bin/cmalloc" --print-library 2>&1)
    [ "$out" = "$root/usr/bin/../lib/libcmalloc.so.0" ] || [ "$out" = "$root/usr/lib/libcmalloc.so.0" ] ||
        fail "the installed launcher finds '$out'"
    "$root/usr/bin/cmalloc" cat /proc/self/maps | grep -q "$root/usr/lib/libcmalloc.so.$version\$" ||
        fail "the installed launcher does not run a program on the installed library"
    dpkg --root="$root" --log=/dev/null -r cmalloc > "$tmp/log" 2>&1 || fail "dpkg -r: $(tail -3 "$tmp/log")"
    left=$(find "$root" -path "$root/var" -prune -o -mindepth 1 -print)
    [ -z "$left" ] || fail "dpkg -r left: $left"
    dpkg --root="$root" -s cmalloc > /dev/null 2>&1 && fail "dpkg -r: cmalloc still installed"
else
    fail "dpkg -i into an empty root: $(tail -5 "$tmp/log")"
fi

if [ $failures -ne 0 ]; then
    echo "test_deb: $failures failure(s)"
    exit 1
fi
echo "test_deb: $deb holds library, links, headers, launcher and cmalloc.pc; installs, runs and removes cleanly (dpkg --root)"
