#!/bin/sh
# deps.sh - installs what building and testing cmalloc needs on a Debian machine, adding only
# what is missing: it never removes, replaces or upgrades a package.
#
#   scripts/deps.sh [--bench] [--sanitize] [--dry-run | --list]
#
#   (none)       the build and `make test`: compiler, cmocka, pkg-config and the programs the
#                tests run under cmalloc (python3, perl, sqlite3, valgrind for the fast-path budget,
#                google-perftools for google-pprof in tests/test_prof.sh), libunwind8,
#                which the profiler loads when it is on (stacks 7x cheaper than libgcc's), and
#                libc6-dbg, libc's debug file, from which reports name libc's functions
#                (tests/test_prof_reports.sh checks they do)
#   --bench      also the allocators compared against and the benchmark tools (`make bench`)
#   --sanitize   also clang and its runtimes (`make fuzz`, `make sanitize`)
#   --dry-run    print what is missing and the exact apt-get command that would add it; install
#                nothing
#   --list       print the packages wanted, one line (README's list is checked against it)
#
# A tool counts as there when its command works (`gnuplot --version` from any gnuplot
# package: gnuplot-qt, gnuplot-x11 or gnuplot-nox), a library when dpkg says its package is
# installed. apt-get is asked with --no-remove (it aborts rather than remove or replace
# anything, e.g. gnuplot-qt for gnuplot-nox) and --no-install-recommends (only what the
# package needs), so the machine keeps every package it had. Cheap when everything is there
# (one check per package), so `make test` and `make bench` run it every time before building
# anything. Installs through sudo when not root.
set -eu

# Each wanted package, with what shows it is there: "=cmd:A,B" every command named runs with
# --version; nothing: dpkg-query says the package is installed.
base="build-essential=cmd:cc,c++,make libcmocka-dev pkg-config=cmd:pkg-config
      python3=cmd:python3 perl=cmd:perl sqlite3=cmd:sqlite3 valgrind=cmd:valgrind
      google-perftools=cmd:google-pprof libunwind8 libc6-dbg"
bench="libjemalloc2 libtcmalloc-minimal4 libmimalloc2.0 hyperfine=cmd:hyperfine gnuplot-nox=cmd:gnuplot"
sanitize="clang=cmd:clang libclang-rt-14-dev"
APT_OPTIONS="-y -qq --no-remove --no-install-recommends"

want=$base
mode=install
for arg in "$@"; do
    case "$arg" in
        --bench) want="$want $bench" ;;
        --sanitize) want="$want $sanitize" ;;
        --dry-run) mode=dry-run ;;
        --list) mode=list ;;
        *) echo "usage: scripts/deps.sh [--bench] [--sanitize] [--dry-run | --list]" >&2; exit 2 ;;
    esac
done

# present ENTRY: true when the package of "name[=cmd:A,B]" is there, as said above.
present() {
    case "$1" in
        *=cmd:*)
            commands=${1#*=cmd:}
            for command in $(echo "$commands" | tr ',' ' '); do
                "$command" --version < /dev/null > /dev/null 2>&1 || return 1
            done ;;
        *) dpkg-query -W -f='${Status}' "$1" 2> /dev/null | grep -q "install ok installed" ;;
    esac
}

names="" missing=""
for entry in $want; do
    names="$names ${entry%%=*}"
    present "$entry" || missing="$missing ${entry%%=*}"
done
if [ "$mode" = list ]; then
    echo "${names# }"
    exit 0
fi
if [ "$mode" = dry-run ]; then
    echo "deps.sh: would install:${missing:- nothing}"
    [ -z "$missing" ] || echo "deps.sh: would run: apt-get install $APT_OPTIONS$missing"
    exit 0
fi
[ -z "$missing" ] && exit 0
echo "deps.sh: installing$missing"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq || true
$SUDO apt-get install $APT_OPTIONS $missing
