# real_python.py - an allocation-heavy Python program, run unmodified by the system python3
# (/usr/bin/python3) under each allocator and timed as a whole process with hyperfine by
# scripts/bench-matrix.sh. CPython serves objects of up to 512 bytes from its own pymalloc
# arenas (256 KiB each, from mmap), so what the allocator under test sees is what real Python
# programs send it: dict and list storage as they grow, str/bytes above 512 bytes, and the
# arenas' churn. Fixed work (seeded), no I/O; prints a checksum so the work cannot be skipped.
# How to read it: wall time of the whole process, lower is better; peak RSS of the process.
import json
import random

rng = random.Random(12345)
checksum = 0

# 1. dicts of records, grown and dropped: dict/list resizes and medium strings
for round_ in range(2):
    table = {}
    for i in range(20000):
        key = "key-%d-%d" % (round_, i)
        table[key] = {"id": i, "name": "x" * rng.randint(1, 900), "tags": [rng.random() for _ in range(rng.randint(0, 12))]}
    checksum += sum(len(v["name"]) for v in table.values()) % 1000003
    del table

# 2. text building and splitting: many strings above pymalloc's 512-byte limit
parts = []
for i in range(10000):
    s = ("%08x" % rng.getrandbits(32)) * rng.randint(1, 200)
    parts.append(s)
    if len(parts) > 500:
        blob = ",".join(parts)
        checksum += len(blob.split(",")) + len(blob) % 997
        parts = parts[250:]

# 3. JSON round trips of nested documents
doc = [{"user": i, "items": [{"sku": rng.randint(0, 10**6), "qty": rng.randint(1, 9)} for _ in range(rng.randint(1, 30))]} for i in range(1500)]
for _ in range(3):
    text = json.dumps(doc)
    doc = json.loads(text)
    checksum += len(text) % 1000003

# 4. a sort of tuples, then bytearrays that grow and shrink
rows = [(rng.random(), "r%d" % i, i) for i in range(30000)]
rows.sort()
checksum += rows[len(rows) // 2][2]
buf = bytearray()
for i in range(5000):
    buf += b"y" * rng.randint(1, 4000)
    if len(buf) > 1 << 20:
        checksum += len(buf) % 991
        buf = bytearray(buf[len(buf) // 2:])

print("checksum", checksum)
