#!/bin/sh
# Installs what building and testing cmalloc needs on a fresh Debian machine.
# Idempotent: packages already present are skipped, so it is cheap to run every time.
set -eu
want="build-essential libcmocka-dev pkg-config python3 perl sqlite3 valgrind"
case "${1:-}" in
  --bench) want="$want libjemalloc2 libtcmalloc-minimal4 libmimalloc2.0 hyperfine gnuplot-nox" ;;
  --sanitize) want="$want clang libclang-rt-14-dev" ;;   # make fuzz, make sanitize
esac
missing=""
for p in $want; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "deps.sh: installing$missing"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq || true
$SUDO apt-get install -y -qq $missing
