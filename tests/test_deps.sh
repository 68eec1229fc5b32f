#!/bin/sh
# test_deps.sh - scripts/deps.sh adds what is missing and nothing else; `make test` and
# `make bench` run it first.
#
# Machine states are simulated without a container: PATH holds only fake dpkg-query, apt-get
# and sudo, fake tools (each a script that answers --version) for the tools a state has, and
# the few real utilities deps.sh itself uses. The fake dpkg-query says the packages in
# $FAKE_MISSING ("all": every one) are not installed; the fake apt-get and sudo only record
# how they were called, so nothing is ever installed. Checked:
#   - on a bare machine --dry-run names every package and the exact apt-get command, with
#     --no-remove and --no-install-recommends, and calls no apt-get; with everything there it
#     names nothing;
#   - a machine with gnuplot-qt (a working `gnuplot`, the package gnuplot-nox not installed):
#     deps.sh --bench asks apt for nothing, so nothing can replace gnuplot-qt; where something
#     else is missing, apt-get is called with --no-remove;
#   - with the real apt-get, in simulation (-s): installing the other gnuplot flavour than the
#     one on this machine removes it, and with deps.sh's options (read from its dry run) apt
#     refuses instead ("remove is disabled") and removes nothing;
#   - a tool counts as there only when its command works (a `cc` that fails is missing);
#   - --bench and --sanitize add their packages; --list prints them; an unknown flag is refused;
#   - `make -n test` and `make -n bench` (with DEPS=... --dry-run) run deps.sh before any
#     command of theirs; `make -n all` does not run it.
set -u
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cmalloc-deps.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
MAKE=${MAKE:-make}
failures=0
fail() { echo "  FAIL: $*"; failures=$((failures + 1)); }

mkdir "$tmp/bin" "$tmp/tools"
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
for utility in sh grep tr id cat; do ln -s "$(command -v $utility)" "$tmp/bin/$utility"; done
chmod +x "$tmp/bin/"*
export FAKE_LOG="$tmp/calls"

# tools NAME...: the machine's working commands are exactly these (each answers --version).
tools() {
    rm -f "$tmp/tools/"*
    for t; do printf '#!/bin/sh\necho "%s 1.0"\n' "$t" > "$tmp/tools/$t"; chmod +x "$tmp/tools/$t"; done
}
all_tools="cc c++ make pkg-config python3 perl sqlite3 valgrind google-pprof hyperfine gnuplot clang"
fake() { PATH="$tmp/bin:$tmp/tools" "$@"; }

base="build-essential libcmocka-dev pkg-config python3 perl sqlite3 valgrind google-perftools libunwind8 libc6-dbg"
options="-y -qq --no-remove --no-install-recommends"

# A bare machine, then one with everything.
tools
out=$(FAKE_MISSING=all fake scripts/deps.sh --dry-run)
[ "$out" = "deps.sh: would install: $base
deps.sh: would run: apt-get install $options $base" ] || fail "dry run on a bare machine: '$out'"
[ ! -e "$FAKE_LOG" ] || fail "dry run called: $(cat "$FAKE_LOG")"
out=$(FAKE_MISSING=all fake scripts/deps.sh --bench --sanitize --dry-run)
for p in libjemalloc2 libtcmalloc-minimal4 libmimalloc2.0 hyperfine gnuplot-nox clang libclang-rt-14-dev; do
    case "$out" in *" $p"*) ;; *) fail "--bench --sanitize does not install $p: '$out'" ;; esac
done
tools $all_tools
out=$(FAKE_MISSING= fake scripts/deps.sh --bench --sanitize --dry-run)
[ "$out" = "deps.sh: would install: nothing" ] || fail "dry run with everything there: '$out'"
FAKE_MISSING= fake scripts/deps.sh --bench --sanitize
[ ! -e "$FAKE_LOG" ] || fail "everything there, yet: $(cat "$FAKE_LOG")"

# Only cmocka missing: exactly it, with the options that cannot remove anything.
FAKE_MISSING=libcmocka-dev fake scripts/deps.sh > /dev/null
grep -q "^apt-get install $options libcmocka-dev\$" "$FAKE_LOG" ||
    fail "deps.sh did not apt-get install libcmocka-dev alone with $options: $(cat "$FAKE_LOG")"
if [ "$(id -u)" -ne 0 ]; then grep -q "^sudo\$" "$FAKE_LOG" || fail "not root, yet no sudo"; fi
rm -f "$FAKE_LOG"

# A tool whose command fails is missing.
tools $all_tools
printf '#!/bin/sh\nexit 1\n' > "$tmp/tools/cc"
out=$(FAKE_MISSING= fake scripts/deps.sh --dry-run | head -1)
[ "$out" = "deps.sh: would install: build-essential" ] || fail "a cc that fails counted as there: '$out'"

# gnuplot-qt installed: `gnuplot` works, the package gnuplot-nox is not there.
tools $all_tools
out=$(FAKE_MISSING="gnuplot-nox gnuplot-x11" fake scripts/deps.sh --bench --dry-run)
[ "$out" = "deps.sh: would install: nothing" ] || fail "gnuplot-qt machine: deps.sh --bench would install: '$out'"
FAKE_MISSING="gnuplot-nox gnuplot-x11" fake scripts/deps.sh --bench
[ ! -e "$FAKE_LOG" ] || fail "gnuplot-qt machine: deps.sh --bench called: $(cat "$FAKE_LOG")"
FAKE_MISSING="gnuplot-nox libjemalloc2" fake scripts/deps.sh --bench > /dev/null
[ "$(grep '^apt-get install' "$FAKE_LOG")" = "apt-get install $options libjemalloc2" ] ||
    fail "gnuplot-qt machine missing jemalloc: $(cat "$FAKE_LOG")"
rm -f "$FAKE_LOG"

# The real apt-get, simulating: the other gnuplot flavour replaces the installed one unless
# apt is given deps.sh's options, which make it refuse.
tools $all_tools
used=$(FAKE_MISSING=libcmocka-dev fake scripts/deps.sh --dry-run | sed -n 's/^deps.sh: would run: apt-get install \(.*\) libcmocka-dev$/\1/p')
[ "$used" = "$options" ] || fail "dry run's apt-get options: '$used'"
installed=""
for flavour in gnuplot-nox gnuplot-qt gnuplot-x11; do
    dpkg-query -W -f='${Status}' "$flavour" 2> /dev/null | grep -q "install ok installed" && installed=$flavour
done
other=$([ "$installed" = gnuplot-qt ] && echo gnuplot-nox || echo gnuplot-qt)
if [ -n "$installed" ] && apt-cache show "$other" > /dev/null 2>&1; then
    before=$failures
    apt-get -s -qq install "$other" > "$tmp/sim" 2>&1
    grep -q "^Remv $installed" "$tmp/sim" || fail "apt-get -s install $other does not remove $installed here: $(head -3 "$tmp/sim")"
    apt-get -s $used install "$other" > "$tmp/sim" 2>&1 && fail "apt-get -s $used install $other succeeded"
    grep -q "remove is disabled" "$tmp/sim" && ! grep -q "^Remv" "$tmp/sim" ||
        fail "apt-get -s $used install $other: $(head -3 "$tmp/sim")"
    [ $failures -eq $before ] &&
        echo "test_deps: real apt, simulated: $other would replace $installed; with deps.sh's options apt refuses"
else
    echo "test_deps: real apt not simulated (no gnuplot package installed here, or no apt lists); the fake-state checks above stand"
fi

out=$(fake scripts/deps.sh --list)
[ "$out" = "$base" ] || fail "--list: '$out'"
fake scripts/deps.sh --nonsense 2>/dev/null && fail "deps.sh accepted --nonsense"

# make: deps.sh (its dry run here) comes first, before any command of the goal. The tools are
# this machine's own here, so the bench goal may also name those of --bench that it lacks
# (hyperfine, gnuplot-nox on a machine that never ran the matrix).
for goal in test bench; do
    FAKE_MISSING=libcmocka-dev PATH="$tmp/bin:$PATH" $MAKE --no-print-directory -n $goal DEPS="./scripts/deps.sh --dry-run" > "$tmp/make.out" 2>&1
    case "$(head -1 "$tmp/make.out") " in
    "deps.sh: would install: libcmocka-dev "*) ;;
    *) fail "make -n $goal does not start with deps.sh: $(head -2 "$tmp/make.out")" ;;
    esac
done
FAKE_MISSING=libcmocka-dev PATH="$tmp/bin:$PATH" $MAKE --no-print-directory -n all DEPS="./scripts/deps.sh --dry-run" > "$tmp/make.out" 2>&1
grep -q "deps.sh" "$tmp/make.out" && fail "make all runs deps.sh"
[ ! -e "$FAKE_LOG" ] || fail "make -n called apt-get: $(cat "$FAKE_LOG")"

if [ $failures -ne 0 ]; then
    echo "test_deps: $failures failure(s)"
    exit 1
fi
echo "test_deps: deps.sh adds only what is missing (a working command counts), never removes (gnuplot-qt kept); make test and make bench run it first"
