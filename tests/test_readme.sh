#!/bin/sh
# test_readme.sh - README.md says what the project does, for users, in at most 300 lines.
#
# Checked: README.md has at most 300 lines; the package lists it states are exactly what
# scripts/deps.sh installs (--list, --bench --list and --sanitize --list, split as README
# splits them); every `make TARGET` it names is a target of the Makefile (its rule database,
# read with deps.sh left out); every scripts/ path it names exists and is executable; .ci/run runs
# README's test command; every relative link in README.md, CHANGELOG.md and docs/*.md leads to
# a file that exists; and no project text (README, CHANGELOG, docs, bench/results, and the
# comments of src, include, tests, scripts and bench) speaks of work sessions, engineers or
# issue numbers instead of commits, versions and measurements.
set -u
MAKE=${MAKE:-make}
failures=0
fail() { echo "  FAIL: $*"; failures=$((failures + 1)); }

lines=$(wc -l < README.md)
[ "$lines" -le 300 ] || fail "README.md has $lines lines, more than 300 (move material to docs/)"

# The three package lists: "- build and tests: `...`", "- `make bench` (`--bench`) adds: `...`",
# "- `make fuzz` and `make sanitize` (`--sanitize`) add: `...`".
stated() { sed -n "s/^- $1.*: \`\([a-z0-9 .+-]*\)\`\$/\1/p" README.md; }
base=$(scripts/deps.sh --list)
with_bench=$(scripts/deps.sh --bench --list)
with_sanitize=$(scripts/deps.sh --sanitize --list)
[ "$(stated 'build and tests')" = "$base" ] ||
    fail "README's build and test packages '$(stated 'build and tests')', deps.sh --list '$base'"
[ "$base $(stated '`make bench`')" = "$with_bench" ] ||
    fail "README's bench packages '$(stated '`make bench`')', deps.sh --bench adds '${with_bench#"$base "}'"
[ "$base $(stated '`make fuzz`')" = "$with_sanitize" ] ||
    fail "README's sanitize packages '$(stated '`make fuzz`')', deps.sh --sanitize adds '${with_sanitize#"$base "}'"

targets=$($MAKE -qp DEPS=true 2> /dev/null | sed -n 's/^\([a-z][a-z-]*\):.*/\1/p' | sort -u)
for target in $(grep -o 'make [a-z][a-z-]*' README.md | sed 's/^make //' | sort -u); do
    echo "$targets" | grep -qx "$target" || fail "README names 'make $target', which the Makefile does not have"
done
for path in $(grep -o 'scripts/[a-z][a-z.-]*' README.md | sort -u); do
    [ -x "$path" ] || fail "README names $path, which is not an executable file"
done
grep -q '^    make test ' README.md && grep -q '^make test$' .ci/run || fail ".ci/run does not run README's 'make test'"

for doc in README.md CHANGELOG.md docs/*.md; do
    dir=$(dirname "$doc")
    for link in $(grep -o '](\([^)#]*\)' "$doc" | sed 's/^](//' | grep -v '^[a-z]*:' | sort -u); do
        [ -e "$dir/$link" ] || fail "$doc links to $link, which does not exist"
    done
done

# Split so that this file does not match itself.
words='\bsess''ions?\b|\bengin''eers?\b|\biss''ues? [0-9]|\bthe iss''ue\b'
hits=$(grep -rniE "$words" README.md CHANGELOG.md docs bench/results --include='*.md' 2> /dev/null
       grep -rniE "$words" src include tests scripts bench Makefile .ci 2> /dev/null |
           grep -v '^tests/test_readme.sh:')
[ -z "$hits" ] || fail "project text speaks of sessions, engineers or issues:
$(echo "$hits" | cut -c1-160)"

if [ $failures -ne 0 ]; then
    echo "test_readme: $failures failure(s)"
    exit 1
fi
echo "test_readme: $lines lines; package lists as deps.sh; make targets, scripts and links exist; no session, engineer or issue in project text"
