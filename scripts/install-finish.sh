#!/bin/sh
# install-finish.sh - what `make install` does last (with no DESTDIR): makes the installed
# library findable by programs linked with -lcmalloc, or says exactly what to do.
#
#   scripts/install-finish.sh LIBDIR
#
# LIBDIR among the loader's directories (ldconfig's list, /lib, /usr/lib): as root, runs
# ldconfig, without which libcmalloc.so.0 is not found until the cache is next rebuilt; not
# root, prints the command to run. Elsewhere (a custom prefix): prints the -Wl,-rpath flag
# (or LD_LIBRARY_PATH) a program needs to find it.
set -eu
libdir=$1
real=$(readlink -f "$libdir" || echo "$libdir")
searched=$( (ldconfig -v -N 2> /dev/null || /sbin/ldconfig -v -N 2> /dev/null || true) |
    sed -n 's|^\(/[^:]*\):.*|\1|p'; echo /lib; echo /usr/lib)
for dir in $searched; do
    if [ "$(readlink -f "$dir" 2> /dev/null)" = "$real" ]; then
        if [ "$(id -u)" -eq 0 ]; then
            ldconfig
            echo "cmalloc: installed in $libdir; ran ldconfig, so programs linked with -lcmalloc find it"
        else
            echo "cmalloc: installed in $libdir; now run: sudo ldconfig (programs linked with -lcmalloc need the loader's cache updated)"
        fi
        exit 0
    fi
done
echo "cmalloc: installed in $libdir, which the loader does not search: link programs with"
echo "  -Wl,-rpath,$libdir   (or run them with LD_LIBRARY_PATH=$libdir)"
