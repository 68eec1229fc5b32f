#!/bin/sh
# test_stats_json.sh - cmalloc_stats_print_json and CMALLOC_STATS=json, parsed by Python.
#
# A program linked with the static library (so cmalloc serves it, one thread) takes snapshots
# around a known allocation pattern: 1000 x 48 B and 300 x 1000 B (size classes 48 and 1024),
# 10 x 300 KiB (large: whole page-heap spans) and 3 x 4 MiB (each its own mapping), then frees
# everything. Python checks that
#   - each snapshot is one JSON object on one line, with version, options and every field;
#   - the numbers add up inside a snapshot: in_use == sum over classes of in_use * size + large
#     + mapped bytes, the layer bytes equal the sums of the per-class counts, objects_out ==
#     in_use + central_cache + thread_cache, and the spans hold the objects out;
#   - between snapshots the counts moved by exactly the pattern (+1000 objects of 48 B, +300 of
#     1024 B, +10 large and +3 mapped blocks, totals.in_use by the bytes requested rounded to
#     their classes and pages), and back after the frees;
#   - two snapshots in a row are identical (writing one allocates nothing that stays);
#   - CMALLOC_STATS=json prints the object at exit, and CMALLOC_CONF shows in its options;
# that scripts/cmalloc-stats diffs and plots the snapshots; and nm shows that src/stats_json.c calls nothing but cmalloc's own functions (no malloc,
# no stdio).
set -eu
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cmalloc-json.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
CC=${CC:-cc}

cat >"$tmp/pattern.c" <<'C'
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <cmalloc.h>

static void snapshot(const char *dir, const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.json", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        exit(2);
    cmalloc_stats_print_json(fd);
    close(fd);
}

int main(int argc, char **argv)
{
    static void *small48[1000], *small1000[300], *large[10], *mapped[3];
    if (argc != 2)
        return 2;
    free(malloc(1)); /* initialize before the first snapshot */
    snapshot(argv[1], "before");
    for (int i = 0; i < 1000; i++)
        small48[i] = malloc(48);
    for (int i = 0; i < 300; i++)
        small1000[i] = malloc(1000);
    for (int i = 0; i < 10; i++)
        large[i] = malloc(300 << 10);
    for (int i = 0; i < 3; i++)
        mapped[i] = malloc(4 << 20);
    snapshot(argv[1], "during");
    snapshot(argv[1], "during_again");
    for (int i = 0; i < 1000; i++)
        free(small48[i]);
    for (int i = 0; i < 300; i++)
        free(small1000[i]);
    for (int i = 0; i < 10; i++)
        free(large[i]);
    for (int i = 0; i < 3; i++)
        free(mapped[i]);
    snapshot(argv[1], "after");
    return 0;
}
C
$CC -std=gnu11 -O1 -fno-builtin -Iinclude "$tmp/pattern.c" build/libcmalloc.a -lpthread -o "$tmp/pattern"

# Background release off: the numbers must not move between snapshots behind the test's back.
CMALLOC_BACKGROUND_RELEASE=0 CMALLOC_RELEASE_DELAY_MS=-1 CMALLOC_STATS=json \
    CMALLOC_CONF=thread_cache_max:1M "$tmp/pattern" "$tmp" 2>"$tmp/exit.txt"

python3 - "$tmp" src/options.c include/cmalloc.h <<'PY'
import json, re, sys
tmp, options_c, header = sys.argv[1:]
PAGE = 8192
failures = []
def check(cond, what):
    if not cond:
        failures.append(what)

def load(name):
    text = open(f"{tmp}/{name}.json").read()
    check(text.endswith("\n") and text.count("\n") == 1, f"{name}: one line ending in a newline")
    return json.loads(text)

version = re.search(r'#define CMALLOC_VERSION "([^"]+)"', open(header).read()).group(1)
option_names = sorted(n.lower() for n in re.findall(r'^ *\{"([A-Z_]+)", &cm_', open(options_c).read(), re.M))
snaps = {n: load(n) for n in ("before", "during", "during_again", "after")}

for name, s in snaps.items():
    check(s["cmalloc"] == version, f"{name}: version {s['cmalloc']} != {version}")
    check(s["page_size"] == PAGE, f"{name}: page_size")
    check(sorted(s["options"]) == option_names, f"{name}: options {sorted(s['options'])} != {option_names}")
    check(s["options"]["thread_cache_max"] == 1 << 20, f"{name}: CMALLOC_CONF not in the options")
    check(s["options"]["stats"] == "json", f"{name}: stats option {s['options']['stats']}")
    check(s["totals"]["thread_caches_live"] == 1, f"{name}: one thread has a cache")
    classes = s["size_classes"]
    check(all(c["objects_out"] == c["in_use"] + c["central_cache"] + c["thread_cache"] for c in classes),
          f"{name}: objects_out == in_use + central_cache + thread_cache")
    check(all(c["spans"] * (c["pages"] * PAGE // c["size"]) >= c["objects_out"] for c in classes),
          f"{name}: spans hold the objects out")
    check(s["layers"]["central_caches"] == sum(c["central_cache"] * c["size"] for c in classes),
          f"{name}: central_caches == sum of central_cache * size")
    check(s["layers"]["calling_thread_cache"] == sum(c["thread_cache"] * c["size"] for c in classes),
          f"{name}: calling_thread_cache == sum of thread_cache * size")
    check(s["layers"]["thread_caches"] == s["layers"]["calling_thread_cache"], f"{name}: one thread's cache")
    small = sum(c["in_use"] * c["size"] for c in classes)
    check(s["totals"]["in_use"] == small + s["large"]["bytes"] + s["mapped_blocks"]["bytes"]
          - s["layers"]["quarantine"] - s["layers"]["sample_stash"],
          f"{name}: totals.in_use {s['totals']['in_use']} != small {small} + large + mapped")

def by_size(s):
    return {c["size"]: c for c in s["size_classes"]}

b, d, a = snaps["before"], snaps["during"], snaps["after"]
check(d == snaps["during_again"], "two snapshots in a row differ")
def in_use(s, size):
    return by_size(s).get(size, {}).get("in_use", 0)
check(in_use(d, 48) - in_use(b, 48) == 1000, f"class 48: in_use {in_use(b, 48)} -> {in_use(d, 48)}, want +1000")
check(in_use(d, 1024) - in_use(b, 1024) == 300, f"class 1024: in_use {in_use(b, 1024)} -> {in_use(d, 1024)}, want +300")
check(by_size(d)[48]["spans"] >= 1000 * 48 // (by_size(d)[48]["pages"] * PAGE), "class 48: too few spans")
large_each = -(-(300 << 10) // PAGE) * PAGE
check(d["large"]["count"] - b["large"]["count"] == 10, "large.count +10")
check(d["large"]["bytes"] - b["large"]["bytes"] == 10 * large_each, f"large.bytes +{d['large']['bytes'] - b['large']['bytes']}, want {10 * large_each}")
check(d["mapped_blocks"]["count"] - b["mapped_blocks"]["count"] == 3, "mapped_blocks.count +3")
mapped_delta = d["mapped_blocks"]["bytes"] - b["mapped_blocks"]["bytes"]
check(3 * (4 << 20) <= mapped_delta <= 3 * ((4 << 20) + PAGE), f"mapped_blocks.bytes +{mapped_delta}")
want = 1000 * 48 + 300 * 1024 + 10 * large_each + mapped_delta
check(d["totals"]["in_use"] - b["totals"]["in_use"] == want, f"totals.in_use +{d['totals']['in_use'] - b['totals']['in_use']}, want +{want}")
check(d["totals"]["mapped"] >= d["totals"]["in_use"], "mapped >= in_use")
for size in (48, 1024):
    check(in_use(a, size) == in_use(b, size), f"class {size}: in_use back to {in_use(b, size)} after the frees")
for key in ("large", "mapped_blocks"):
    check(a[key]["count"] == b[key]["count"], f"{key}.count back after the frees")
check(a["totals"]["in_use"] == b["totals"]["in_use"], "totals.in_use back after the frees")

exit_lines = [l for l in open(f"{tmp}/exit.txt").read().splitlines() if l.startswith('{"cmalloc":')]
check(len(exit_lines) == 1, f"CMALLOC_STATS=json: {len(exit_lines)} JSON lines at exit, want 1")
if exit_lines:
    e = json.loads(exit_lines[0])
    check(e["cmalloc"] == version and "size_classes" in e, "exit JSON has version and size classes")

for f in failures:
    print("  FAIL:", f)
if failures:
    sys.exit(1)
print(f"test_stats_json: 4 snapshots and the exit report parsed; in use +{want} bytes as allocated, back after free")
PY

# scripts/cmalloc-stats reads the same snapshots: the diff shows the 10 large blocks and 1000
# more 48-byte objects, the plot one bar per snapshot.
scripts/cmalloc-stats diff "$tmp/before.json" "$tmp/during.json" > "$tmp/diff.txt"
grep -q "^large blocks  *[0-9]*  *[0-9]*  *+10\$" "$tmp/diff.txt" &&
    grep -q "^ *48 B  *[0-9]* (+1000)" "$tmp/diff.txt" ||
    { echo "test_stats_json: cmalloc-stats diff:"; cat "$tmp/diff.txt"; exit 1; }
[ "$(scripts/cmalloc-stats plot "$tmp/before.json" "$tmp/exit.txt" | grep -c '|')" = 2 ] ||
    { echo "test_stats_json: cmalloc-stats plot did not draw two bars"; exit 1; }
echo "test_stats_json: cmalloc-stats diff and plot read the snapshots"

# What the writer calls: cmalloc's own functions and data, and what the compiler may emit.
bad=$(nm -u build/obj/stats_json.o | awk '{print $2}' |
      grep -v -E '^(cm_|cmalloc_|_GLOBAL_OFFSET_TABLE_$|memset$|memcpy$|__stack_chk_fail$)' || true)
if [ -n "$bad" ]; then
    echo "test_stats_json: src/stats_json.c calls outside cmalloc (may allocate): $bad"
    exit 1
fi
echo "test_stats_json: stats_json.o calls only cmalloc's own functions"
