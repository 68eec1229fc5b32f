#!/bin/sh
# bench-matrix.sh - the benchmark matrix; the program is scripts/bench-matrix.py (its head says
# what it runs and how to read the output). This entry point stays for `make bench`, the tests
# and the commands in README.md and docs/PERFORMANCE.md.
exec python3 "$(dirname "$0")/bench-matrix.py" "$@"
