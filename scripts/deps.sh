#!/bin/sh
# deps.sh - installs what building and testing cmalloc needs on a fresh Debian machine.
#
#   scripts/deps.sh [--bench] [--sanitize] [--dry-run]
#
#   (none)       the build and `make test`: compiler, cmocka, pkg-config and the programs the
#                tests run under cmalloc (python3, perl, sqlite3, valgrind for the fast-path budget,
#                google-perftools for google-pprof in tests/test_prof.sh), and libunwind8,
#                which the profiler loads when it is on (stacks 7x cheaper than libgcc's)
#   --bench      also the allocators compared against and the benchmark tools (`make bench`)
#   --sanitize   also clang and its runtimes (`make fuzz`, `make sanitize`)
#   --dry-run    print what would be installed ("deps.sh: would install: ..."), install nothing
#
# Idempotent and cheap when everything is there (one dpkg-query per package), so `make test`
# and `make bench` run it every time before building anything. Installs with apt-get, through
# sudo when not root.
set -eu
want="build-essential libcmocka-dev pkg-config python3 perl sqlite3 valgrind google-perftools libunwind8"
dry_run=0
for arg in "$@"; do
    case "$arg" in
        --bench) want="$want libjemalloc2 libtcmalloc-minimal4 libmimalloc2.0 hyperfine gnuplot-nox" ;;
        --sanitize) want="$want clang libclang-rt-14-dev" ;;
        --dry-run) dry_run=1 ;;
        *) echo "usage: scripts/deps.sh [--bench] [--sanitize] [--dry-run]" >&2; exit 2 ;;
    esac
done
missing=""
for p in $want; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ "$dry_run" = 1 ]; then
    echo "deps.sh: would install:${missing:- nothing}"
    exit 0
fi
[ -z "$missing" ] && exit 0
echo "deps.sh: installing$missing"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq || true
$SUDO apt-get install -y -qq $missing
