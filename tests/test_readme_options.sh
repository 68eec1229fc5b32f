#!/bin/sh
# test_readme_options.sh - the README's option table and src/options.c's table name the same
# options (the table in options.c is the source; a new option must be documented).
set -eu
code=$(sed -n 's/^ *{"\([A-Z_]*\)", &cm_.*/\1/p' src/options.c | sort)
doc=$(sed -n 's/^| `CMALLOC_\([A-Z_]*\)` |.*/\1/p' README.md | sort)
[ -n "$code" ] || { echo "test_readme_options: no options found in src/options.c"; exit 1; }
if [ "$code" != "$doc" ]; then
    echo "test_readme_options: src/options.c and README.md's table differ:"
    echo "  options.c: $(echo $code)"
    echo "  README.md: $(echo $doc)"
    exit 1
fi
echo "test_readme_options: $(echo "$code" | wc -l) options, documented alike"
