#!/bin/sh
# test_layering.sh - no circle of src/'s files depending on each other, as the compiler and
# the preprocessor see them (tests/test_layers.sh checks the Makefile's order by reading the
# code; this reads what was built). A file depends on
#   - the file that defines a function its object calls (nm: U in its .o, T or W in another's),
#     which counts the inline code of every header it includes, as compiled into it;
#   - each src/ header it #includes; a header depends on the headers it includes and on the
#     file that defines each function its inline code calls (a call inside braces: function
#     bodies, not macros or prototypes).
# It fails on any circle, printing its edges with the functions behind them. Calls through
# function pointers handed down at init (check.c's stack printers, error.c's report details,
# init.c's fork hooks) are no dependency: the lower file never names the upper one. Exempt: the
# debug build's hooks (-DCM_DEBUG: every slow path walks the heap, cm_debug_walk, and an
# assertion reports, cm_assert_failed, both in stats.c); they do not exist in a release build.
# LAYERING_OBJECTS (default build/obj) is where the objects are. Runtime: a few seconds.
set -u
objects=${LAYERING_OBJECTS:-build/obj}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cmalloc-layering.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
found=0
for object in "$objects"/*.o; do
    [ -f "$object" ] || continue
    name=$(basename "$object" .o)
    source=$(cd src && ls "$name.c" "$name.cc" 2>/dev/null | head -1)
    [ -n "$source" ] || continue # an object of no src/ file (a test's)
    found=$((found + 1))
    nm "$object" | awk -v file="$source" '
        $2 == "T" || $2 == "W" { print "D", file, $3 }
        $1 == "U" { print "U", file, $2 }'
done >"$tmp/facts"
[ "$found" -gt 0 ] || { echo "test_layering: no objects of src/ in $objects (run make first)"; exit 1; }

for file in src/*.c src/*.cc src/*.h; do
    [ -f "$file" ] || continue
    awk -v file="${file#src/}" '
        # comments removed, then each #include "x.h" and each name called inside braces
        {
            line = $0; code = ""
            while (line != "") {
                if (in_comment) {
                    end = index(line, "*/")
                    if (!end) { line = ""; break }
                    line = substr(line, end + 2); in_comment = 0
                    continue
                }
                block = index(line, "/*"); rest = index(line, "//")
                if (rest && (!block || rest < block)) { code = code substr(line, 1, rest - 1); break }
                if (!block) { code = code line; break }
                code = code substr(line, 1, block - 1); line = substr(line, block + 2); in_comment = 1
            }
        }
        code ~ /^[ \t]*#[ \t]*include[ \t]*"/ {
            split(code, part, "\""); print "I", file, part[2]; next
        }
        code ~ /^[ \t]*#/ { continuing = code ~ /\\$/; next }
        continuing { continuing = code ~ /\\$/; next } # the rest of a macro
        file ~ /\.h$/ {
            for (i = 1; i <= length(code); i++) {
                c = substr(code, i, 1)
                if (c == "{") depth++
                else if (c == "}") depth--
                else if (depth > 0 && c ~ /[A-Za-z_]/ && (i == 1 || substr(code, i - 1, 1) !~ /[A-Za-z0-9_]/)) {
                    word = substr(code, i)
                    if (match(word, /^[A-Za-z_][A-Za-z0-9_]*[ \t]*\(/)) {
                        callee = substr(word, 1, RLENGTH - 1); sub(/[ \t]+$/, "", callee)
                        print "C", file, callee
                    }
                }
            }
        }' "$file"
done >>"$tmp/facts"

awk '
    $1 == "D" { defined[$3] = $2; next }
    { fact[++facts] = $0 }
    END {
        exempt["cm_debug_walk"] = exempt["cm_assert_failed"] = 1
        for (i = 1; i <= facts; i++) {
            split(fact[i], f, " ")
            from = f[2]; to = (f[1] == "I") ? f[3] : defined[f[3]]
            if (to == "" || to == from || (f[3] in exempt)) continue
            why = (f[1] == "I") ? "#include" : f[3]
            key = from SUBSEP to
            if (!(key in edge)) { edge[key] = why; node[from] = node[to] = 1 }
            else if (length(edge[key]) < 200 && index(" " edge[key] " ", " " why " ") == 0)
                edge[key] = edge[key] " " why
        }
        # Which file reaches which (the transitive closure); an edge is on a circle when its target
        # reaches back to its source.
        for (key in edge) reach[key] = 1
        for (k in node) for (i in node) if ((i, k) in reach) for (j in node) if ((k, j) in reach) reach[i, j] = 1
        circles = 0
        for (key in edge) {
            split(key, end, SUBSEP)
            if ((end[2], end[1]) in reach) {
                print "layering: " end[1] " -> " end[2] " (" edge[key] ")"
                circles++; in_circle[end[1]] = 1
            }
        }
        files = 0
        for (n in in_circle) files++
        print circles ? "~ " files " files in circles, through the " circles " dependencies above" : "~ no circle"
        exit circles > 0
    }' "$tmp/facts" >"$tmp/report"
status=$?
sort "$tmp/report" | sed 's/^~ /layering: /'
exit $status
