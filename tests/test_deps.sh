#!/bin/sh
# test_deps.sh - `make test` and `make bench` install what they need on a fresh Debian machine.
#
# A fresh machine is simulated without a container: fake dpkg-query, apt-get and sudo come
# first in PATH. The fake dpkg-query says that libcmocka-dev (or, in a second run, every
# package) is not installed; the fake apt-get and sudo only record how they were called, so
# nothing is ever installed. Checked:
#   - scripts/deps.sh --dry-run names exactly the missing packages, and calls no apt-get;
#   - scripts/deps.sh installs exactly those with apt-get (through sudo when not root);
#   - --bench and --sanitize add their packages; an unknown flag is refused;
#   - `make -n test` and `make -n bench` (with DEPS=... --dry-run) run deps.sh before any
#     command of theirs, so the first command on a fresh machine installs cmocka before it is
#     needed; `make -n all` does not run it.
set -u
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cmalloc-deps.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
MAKE=${MAKE:-make}
failures=0
fail() { echo "  FAIL: $*"; failures=$((failures + 1)); }

mkdir "$tmp/bin"
cat > "$tmp/bin/dpkg-query" <<'S'
#!/bin/sh
# Reports every package installed except those in $FAKE_MISSING ("all": none installed).
for arg; do package=$arg; done
case " $FAKE_MISSING " in *" $package "*|*" all "*) exit 1 ;; esac
printf 'install ok installed'
S
cat > "$tmp/bin/apt-get" <<'S'
#!/bin/sh
echo "apt-get $*" >> "$FAKE_LOG"
S
cat > "$tmp/bin/sudo" <<'S'
#!/bin/sh
echo "sudo" >> "$FAKE_LOG"
exec "$@"
S
chmod +x "$tmp/bin/"*
export FAKE_LOG="$tmp/calls"
fake() { PATH="$tmp/bin:$PATH" "$@"; }

base="build-essential libcmocka-dev pkg-config python3 perl sqlite3 valgrind google-perftools libunwind8"

out=$(FAKE_MISSING=libcmocka-dev fake scripts/deps.sh --dry-run)
[ "$out" = "deps.sh: would install: libcmocka-dev" ] || fail "dry run without cmocka: '$out'"
[ ! -e "$FAKE_LOG" ] || fail "dry run called: $(cat "$FAKE_LOG")"

out=$(FAKE_MISSING=all fake scripts/deps.sh --dry-run)
[ "$out" = "deps.sh: would install: $base" ] || fail "dry run on a bare machine: '$out'"
out=$(FAKE_MISSING=all fake scripts/deps.sh --bench --sanitize --dry-run)
for p in libjemalloc2 libtcmalloc-minimal4 libmimalloc2.0 hyperfine clang libclang-rt-14-dev; do
    case "$out" in *" $p"*) ;; *) fail "--bench --sanitize does not install $p: '$out'" ;; esac
done
out=$(FAKE_MISSING= fake scripts/deps.sh --dry-run)
[ "$out" = "deps.sh: would install: nothing" ] || fail "dry run with everything there: '$out'"
fake scripts/deps.sh --nonsense 2>/dev/null && fail "deps.sh accepted --nonsense"

FAKE_MISSING=libcmocka-dev fake scripts/deps.sh > /dev/null
grep -q "^apt-get install -y -qq libcmocka-dev\$" "$FAKE_LOG" || fail "deps.sh did not apt-get install libcmocka-dev: $(cat "$FAKE_LOG")"
if [ "$(id -u)" -ne 0 ]; then grep -q "^sudo\$" "$FAKE_LOG" || fail "not root, yet no sudo"; fi
rm -f "$FAKE_LOG"

# make: deps.sh (its dry run here) comes first, before any command of the goal.
for goal in test bench; do
    FAKE_MISSING=libcmocka-dev fake $MAKE --no-print-directory -n $goal DEPS="./scripts/deps.sh --dry-run" > "$tmp/make.out" 2>&1
    [ "$(head -1 "$tmp/make.out")" = "deps.sh: would install: libcmocka-dev" ] ||
        fail "make -n $goal does not start with deps.sh: $(head -2 "$tmp/make.out")"
done
FAKE_MISSING=libcmocka-dev fake $MAKE --no-print-directory -n all DEPS="./scripts/deps.sh --dry-run" > "$tmp/make.out" 2>&1
grep -q "deps.sh" "$tmp/make.out" && fail "make all runs deps.sh"
[ ! -e "$FAKE_LOG" ] || fail "make -n called apt-get: $(cat "$FAKE_LOG")"

if [ $failures -ne 0 ]; then
    echo "test_deps: $failures failure(s)"
    exit 1
fi
echo "test_deps: deps.sh installs exactly what is missing; make test and make bench run it first"
