#!/bin/sh
# shellcheck disable=SC2086 # $limit is split into words on purpose
# test_programs.sh - real programs run under LD_PRELOAD=build/libcmalloc.so.
#
# Run from the top directory (make test does). For each program that is installed (python3,
# perl, sqlite3, gcc, g++), an allocation-heavy but deterministic job is run twice, without and
# with cmalloc preloaded, and:
#   - the exit status and the standard output of the two runs must be equal;
#   - the preloaded run must have been served by cmalloc: with CMALLOC_STATS=1 cmalloc prints a
#     report beginning with the line "cmalloc stats" to stderr at exit, which only happens when
#     the library was loaded and its malloc was called;
#   - the preloaded run must not print any "cmalloc:" message (invalid free, warnings).
# The Python job also forks 20 times while two threads allocate (a hung child is reported).
# Python also checks from the inside that malloc, free, calloc and realloc resolve into the
# libcmalloc.so mapping of /proc/self/maps, and the C++ program that operator new is counted by
# cmalloc_stats_get. The C++ program and g++ run again under CMALLOC_CHECK=1, which checks each
# delete against the block's family and each sized delete against the size requested, and there
# a delete through a base class without a virtual destructor, a free of new's block (an
# over-aligned one too), a delete of new[]'s and a delete[] of new's must be reported (a delete
# of malloc's block is not: a program's own operator new may take its memory from malloc).
# Programs with their own operator new and delete over an arena of their own run as they do
# without cmalloc (cmalloc's sized and array deletes hand the arena's blocks to their deletes,
# its new[] and nothrow news call their new). A program that is missing is skipped with a
# notice; the test fails when none ran. Exits non-zero on any failure, after printing which.
set -u

top=$(pwd)
lib="$top/build/libcmalloc.so"
if [ ! -f "$lib" ]; then
    echo "test_programs: $lib is missing (run make first)"
    exit 1
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cmalloc-programs.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

# $limit is "timeout 300" or empty, split into words on purpose where it is used.
limit=""
command -v timeout >/dev/null 2>&1 && limit="timeout 300"

ran=0
failures=0
failed_names=""

fail() {
    echo "  FAIL: $*"
    failures=$((failures + 1))
    failed_names="$failed_names
  $*"
}

have() {
    command -v "$1" >/dev/null 2>&1
}

skip() {
    echo "  SKIP: $1 is not installed"
}

# check NAME COMMAND...: runs COMMAND without and with cmalloc and compares.
check() {
    name=$1
    shift
    echo "-- $name"
    (unset LD_PRELOAD CMALLOC_STATS; exec $limit "$@") >"$tmp/$name.base.out" 2>"$tmp/$name.base.err"
    base_rc=$?
    env CMALLOC_STATS=1 LD_PRELOAD="$lib" $limit "$@" >"$tmp/$name.pre.out" 2>"$tmp/$name.pre.err"
    pre_rc=$?
    ran=$((ran + 1))
    ok=1
    if [ "$base_rc" -ne 0 ]; then
        fail "$name: exits $base_rc even without cmalloc (the test job is broken):"
        sed -n '1,10p' "$tmp/$name.base.err"
        return
    fi
    if [ "$pre_rc" -ne "$base_rc" ]; then
        fail "$name: exit status $pre_rc under cmalloc, $base_rc without"
        [ "$pre_rc" -eq 124 ] && echo "  (124: killed by timeout: hang or deadlock?)"
        echo "  stderr under cmalloc (first lines):"
        sed -n '1,15p' "$tmp/$name.pre.err"
        ok=0
    fi
    if ! cmp -s "$tmp/$name.base.out" "$tmp/$name.pre.out"; then
        fail "$name: standard output differs under cmalloc"
        diff "$tmp/$name.base.out" "$tmp/$name.pre.out" | sed -n '1,10p'
        ok=0
    fi
    if ! grep -q '^cmalloc stats' "$tmp/$name.pre.err"; then
        fail "$name: no 'cmalloc stats' report on stderr with CMALLOC_STATS=1: cmalloc did not serve it"
        ok=0
    fi
    if grep -q '^cmalloc:' "$tmp/$name.pre.err"; then
        fail "$name: cmalloc complained:"
        grep '^cmalloc:' "$tmp/$name.pre.err" | sed -n '1,5p'
        ok=0
    fi
    [ $ok -eq 1 ] && echo "  ok ($(wc -c <"$tmp/$name.base.out") bytes of identical output)"
}

# ---- python3 -------------------------------------------------------------------------------
cat >"$tmp/job.py" <<'EOF'
import collections, hashlib, json, re, threading, zlib

data = {}
for i in range(25000):
    data["key%d" % i] = [i, str(i) * (i % 9), {"sq": i * i, "tag": "t%d" % (i % 17)}]
text = json.dumps(data, sort_keys=True)
print("json", len(text), hashlib.sha256(text.encode()).hexdigest())
words = re.findall(r"[a-z]+\d", text)
print("words", len(words), collections.Counter(words).most_common(3))
back = json.loads(text)
assert back == data

# Buffers growing across the mmap threshold, and big ones freed again.
buf = bytearray()
for i in range(2000):
    buf += bytes([i % 251]) * (i * 7)
print("buffer", len(buf), zlib.crc32(buf))
big = [bytearray(b"x") * (1 << k) for k in range(10, 25)]
print("big", sum(len(b) for b in big))
del big
packed = zlib.compress(bytes(buf))
assert zlib.decompress(packed) == buf
print("zlib", len(packed))

# Threads allocating at once; results are combined in a fixed order.
results = [None] * 4
def work(n):
    items = [("%d-" % n) * (j % 40) for j in range(15000)]
    d = {s: len(s) for s in items}
    results[n] = (len(items), sum(d.values()))
threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
for t in threads: t.start()
for t in threads: t.join()
print("threads", results)

# fork() while two threads allocate; each child allocates and exits. A child that hangs
# (an allocator lock held across fork) is killed after 20 s and reported.
import os, signal, time
stop = []
def churn():
    while not stop:
        junk = [bytearray(i % 5000) for i in range(200)]
churners = [threading.Thread(target=churn) for _ in range(2)]
for t in churners: t.start()
good = hung = 0
for i in range(20):
    pid = os.fork()
    if pid == 0:
        d = {str(k): bytearray(k) for k in range(2000)}
        os._exit(0 if len(d) == 2000 else 1)
    deadline = time.monotonic() + 20
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            good += status == 0
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            hung += 1
            break
        time.sleep(0.001)
stop.append(True)
for t in churners: t.join()
print("forks", good, "ok,", hung, "hung")
EOF

cat >"$tmp/served.py" <<'EOF'
# Exits 0 when malloc & co. of this process resolve into the libcmalloc mapping.
import ctypes, sys
maps = []
for line in open("/proc/self/maps"):
    parts = line.split()
    if len(parts) >= 6 and "libcmalloc" in parts[5]:
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        maps.append((lo, hi))
if not maps:
    sys.exit("libcmalloc.so is not mapped in this process")
libc = ctypes.CDLL(None)
for name in ("malloc", "free", "calloc", "realloc", "posix_memalign", "malloc_usable_size"):
    address = ctypes.cast(getattr(libc, name), ctypes.c_void_p).value
    if not any(lo <= address < hi for lo, hi in maps):
        sys.exit("%s resolves to %#x, outside libcmalloc.so" % (name, address))
print("malloc served by libcmalloc")
EOF

if have python3 && ! python3 -c 'import ctypes, hashlib, json, threading, zlib' 2>/dev/null; then
    echo "  SKIP: python3 lacks a standard module the job uses (ctypes, hashlib, json, zlib)"
elif have python3; then
    check python3 env PYTHONHASHSEED=0 python3 "$tmp/job.py"
    check python3-PYTHONMALLOC=malloc env PYTHONHASHSEED=0 PYTHONMALLOC=malloc python3 "$tmp/job.py"
    echo "-- python3: malloc symbols resolve into libcmalloc.so"
    if out=$(LD_PRELOAD="$lib" $limit python3 "$tmp/served.py" 2>&1); then
        echo "  ok ($out)"
    else
        fail "python3: $out"
    fi
else
    skip python3
fi

# ---- perl ----------------------------------------------------------------------------------
cat >"$tmp/job.pl" <<'EOF'
use strict;
use warnings;
use Digest::MD5 qw(md5_hex);
my %h;
for my $i (1 .. 100000) {
    $h{"k$i"} = [ $i, "x" x ($i % 61), { n => $i * 3 } ];
}
my $s = join ",", map { $_ . "=" . length($h{$_}[1]) . ":" . $h{$_}[2]{n} } sort keys %h;
print "joined ", length($s), " ", md5_hex($s), "\n";
(my $t = $s) =~ s/k(\d+)=/K$1~/g;
print "subst ", length($t), " ", md5_hex($t), "\n";
my @parts = split /,/, $t;
my @sorted = sort { length($a) <=> length($b) or $a cmp $b } @parts;
print "sorted ", scalar(@sorted), " $sorted[0] $sorted[-1]\n";
my $big = "";
$big .= chr(65 + $_ % 26) x ($_ * 3) for 1 .. 3000;
print "big ", length($big), " ", md5_hex($big), "\n";
delete $h{"k$_"} for grep { $_ % 3 } 1 .. 100000;
print "left ", scalar(keys %h), "\n";
EOF

if have perl && ! perl -MDigest::MD5 -e 1 2>/dev/null; then
    echo "  SKIP: perl lacks Digest::MD5 (perl-base only?)"
elif have perl; then
    check perl perl "$tmp/job.pl"
else
    skip perl
fi

# ---- sqlite3 -------------------------------------------------------------------------------
cat >"$tmp/job.sql" <<'EOF'
CREATE TABLE t(id INTEGER PRIMARY KEY, grp INTEGER, name TEXT, payload BLOB);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100000)
INSERT INTO t SELECT i, i % 97, printf('name-%08d', (i * 7919) % 100003), zeroblob(i % 300) FROM n;
CREATE INDEX t_name ON t(name);
CREATE INDEX t_grp ON t(grp, name);
SELECT count(*), sum(length(payload)), min(name), max(name) FROM t;
SELECT grp, count(*), group_concat(substr(name, -3), '') FROM (SELECT * FROM t ORDER BY name)
  GROUP BY grp ORDER BY grp LIMIT 5;
UPDATE t SET payload = zeroblob(500 + id % 7), name = name || '-' || id WHERE id % 5 = 0;
DELETE FROM t WHERE id % 3 = 0;
SELECT count(*), sum(length(payload)) FROM t;
SELECT name FROM t WHERE name LIKE 'name-0000%' ORDER BY name LIMIT 3;
EOF

if have sqlite3; then
    check sqlite3 sqlite3 :memory: ".read $tmp/job.sql"
else
    skip sqlite3
fi

# ---- gcc -----------------------------------------------------------------------------------
cat >"$tmp/prog.c" <<'EOF'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
struct node { struct node *next; int value; char name[20]; };
static int compare(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }
int main(void)
{
    struct node *list = NULL;
    for (int i = 0; i < 1000; i++) {
        struct node *n = malloc(sizeof *n);
        n->value = (i * 7919) % 1009;
        snprintf(n->name, sizeof n->name, "node%d", i);
        n->next = list;
        list = n;
    }
    int values[1000], k = 0;
    for (struct node *n = list; n != NULL; n = n->next)
        values[k++] = n->value;
    qsort(values, 1000, sizeof values[0], compare);
    printf("%d %d %d %s\n", values[0], values[500], values[999], list->name);
    while (list != NULL) {
        struct node *next = list->next;
        free(list);
        list = next;
    }
    return 0;
}
EOF

if have gcc; then
    # The compiler's own output (assembly) must not depend on the allocator it runs on.
    check gcc-S gcc -O2 -S -o - "$tmp/prog.c"
    echo "-- gcc: a program compiled and linked under cmalloc runs as the one built without"
    if ! gcc -O2 -o "$tmp/prog-base" "$tmp/prog.c" 2>"$tmp/gcc-base.err"; then
        fail "gcc: cannot build prog.c even without cmalloc"
        sed -n '1,10p' "$tmp/gcc-base.err"
    elif ! env LD_PRELOAD="$lib" $limit gcc -O2 -o "$tmp/prog-pre" "$tmp/prog.c" 2>"$tmp/gcc-pre.err"; then
        fail "gcc: compiling and linking prog.c under cmalloc failed"
        sed -n '1,10p' "$tmp/gcc-pre.err"
    elif [ "$("$tmp/prog-base")" != "$("$tmp/prog-pre")" ]; then
        fail "gcc: prog.c built under cmalloc prints '$("$tmp/prog-pre")', built without: '$("$tmp/prog-base")'"
    else
        echo "  ok ($("$tmp/prog-pre"))"
    fi
else
    skip gcc
fi

# ---- g++: a C++ program using new/delete, std::string, std::vector, built on the fly ----------
cat >"$tmp/prog.cc" <<'EOF'
#include <cstdint>
#include <cstdio>
#include <dlfcn.h>
#include <map>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

struct alignas(64) Wide { unsigned char bytes[192]; };
struct alignas(4096) Page { unsigned char bytes[4096]; };

// Mirrors the first field of cmalloc_stats (include/cmalloc.h); looked up with dlsym so the
// program builds and runs without cmalloc as well.
struct Stats { size_t bytes_in_use; size_t rest[16]; };

int main()
{
    std::vector<std::string> words;
    for (int i = 0; i < 200000; i++)
        words.push_back(std::string("word-") + std::to_string(i * 7919 % 100003));
    std::map<std::string, int> counts;
    for (const auto &w : words)
        counts[w.substr(0, 8)]++;
    std::unordered_map<int, std::vector<int>> buckets;
    for (int i = 0; i < 100000; i++)
        buckets[i % 1000].push_back(i);
    unsigned long sum = 0;
    for (const auto &b : buckets)
        sum += b.second.size() * (unsigned long)b.first;
    std::printf("words %zu, prefixes %zu, first %s, sum %lu\n", words.size(), counts.size(),
                counts.begin()->first.c_str(), sum);

    // Over-aligned new and delete (aligned operator new), arrays, nothrow.
    std::vector<std::unique_ptr<Wide>> wides;
    for (int i = 0; i < 1000; i++) {
        wides.emplace_back(new Wide());
        if (reinterpret_cast<std::uintptr_t>(wides.back().get()) % 64 != 0)
            return 2;
    }
    Page *pages = new Page[3];
    if (reinterpret_cast<std::uintptr_t>(pages) % 4096 != 0)
        return 3;
    delete[] pages;
    int *n = new (std::nothrow) int[1000];
    if (n == nullptr)
        return 4;
    delete[] n;
    try {
        volatile size_t huge = (size_t)1 << 62;
        char *absurd = new char[huge];
        absurd[0] = 1;
        std::printf("new char[2^62] returned %p\n", static_cast<void *>(absurd));
        delete[] absurd;
        return 5;
    } catch (const std::bad_alloc &) {
        std::printf("bad_alloc for an absurd new[]\n");
    }
    // The new_handler is called when operator new cannot allocate, as libstdc++ does.
    static int handler_calls;
    std::set_new_handler([] {
        handler_calls++;
        std::set_new_handler(nullptr); // the next failure throws
    });
    try {
        volatile size_t huge = (size_t)1 << 62;
        char *absurd = new char[huge];
        std::printf("new char[2^62] returned %p\n", static_cast<void *>(absurd));
        return 6;
    } catch (const std::bad_alloc &) {
        std::printf("new_handler called %d time(s), then bad_alloc\n", handler_calls);
    }
    {
        volatile size_t huge = (size_t)1 << 62;
        char *a = new (std::nothrow) char[huge];
        Wide *w = new (std::nothrow) Wide[huge / sizeof(Wide)];
        std::printf("nothrow new of 2^62 bytes: %s %s\n", a ? "non-null" : "null",
                    w ? "non-null" : "null");
        try {
            void *v = ::operator new(huge, std::align_val_t(64));
            std::printf("aligned new of 2^62 bytes returned %p\n", v);
        } catch (const std::bad_alloc &) {
            std::printf("aligned new of 2^62 bytes: bad_alloc\n");
        }
        // Sized and aligned deletes with the right sizes.
        void *s = ::operator new(1000);
        ::operator delete(s, 1000);
        void *al = ::operator new(5000, std::align_val_t(4096));
        if (reinterpret_cast<std::uintptr_t>(al) % 4096 != 0)
            return 7;
        ::operator delete(al, 5000, std::align_val_t(4096));
        void *an = ::operator new[](300, std::align_val_t(256), std::nothrow);
        if (an == nullptr || reinterpret_cast<std::uintptr_t>(an) % 256 != 0)
            return 8;
        ::operator delete[](an, std::align_val_t(256), std::nothrow);
    }
    try {
        throw std::runtime_error(std::string(1000, 'e'));
    } catch (const std::exception &e) {
        std::printf("caught %zu\n", std::string(e.what()).size());
    }
    // Threads creating and destroying strings; shared_ptr across threads.
    auto shared = std::make_shared<std::vector<std::string>>(1000, std::string(100, 's'));
    std::vector<std::thread> threads;
    std::vector<size_t> lengths(4);
    for (int t = 0; t < 4; t++)
        threads.emplace_back([t, shared, &lengths] {
            std::string s;
            for (int i = 0; i < 20000; i++)
                s += std::to_string(i % (t + 7));
            lengths[t] = s.size() + shared->size();
        });
    for (auto &t : threads)
        t.join();
    std::printf("threads %zu %zu %zu %zu\n", lengths[0], lengths[1], lengths[2], lengths[3]);

    // Is operator new counted by cmalloc? Reported on stderr (not compared).
    auto get = reinterpret_cast<int (*)(Stats *)>(dlsym(RTLD_DEFAULT, "cmalloc_stats_get"));
    if (get != nullptr) {
        Stats before{}, after{};
        get(&before);
        char *volatile block = new char[4 << 20];
        block[0] = 1;
        get(&after);
        std::fprintf(stderr, "cxx: operator new served by cmalloc: %s\n",
                     after.bytes_in_use >= before.bytes_in_use + (4 << 20) ? "yes" : "no");
        delete[] block;
    }
    return 0;
}
EOF

if have g++; then
    echo "-- g++: building the C++ program"
    if g++ -std=c++17 -O2 -pthread -o "$tmp/cxxprog" "$tmp/prog.cc" -ldl 2>"$tmp/cxx-build.err"; then
        check c++-program "$tmp/cxxprog"
        if grep -q 'operator new served by cmalloc: yes' "$tmp/c++-program.pre.err"; then
            echo "  ok (operator new counted by cmalloc_stats_get)"
        else
            fail "c++-program: operator new not counted by cmalloc ($(grep 'cxx:' "$tmp/c++-program.pre.err"))"
        fi
        # cc1plus is itself a big C++ program: its output must not change under cmalloc.
        check g++-S g++ -std=c++17 -O0 -S -o - "$tmp/prog.cc"
        # The debug mode checks each delete against the block's family (new, new[] or malloc's)
        # and each sized delete against the size requested: libstdc++'s containers, strings and
        # shared_ptr (sized deallocation is on from C++14) and cc1plus pass both, and each
        # misuse below is reported (exit status 134, the report's first line as wanted).
        check c++-program-checked env CMALLOC_CHECK=1 "$tmp/cxxprog"
        check g++-S-checked env CMALLOC_CHECK=1 g++ -std=c++17 -O0 -S -o - "$tmp/prog.cc"
        cat >"$tmp/misuse.cc" <<'EOF'
#include <cstdlib>
#include <cstring>
#include <new>
struct Base { int a; ~Base() {} };
struct Derived : Base { char pad[40]; };
template <class T> static T *opaque(T *p) { __asm__ volatile("" : "+r"(p)); return p; }
int main(int, char **argv) {
    if (!std::strcmp(argv[1], "base-delete")) // hands operator delete sizeof(Base)
        delete opaque<Base>(new Derived);
    if (!std::strcmp(argv[1], "new-free"))
        std::free(opaque(new int(1)));
    if (!std::strcmp(argv[1], "new-array-delete"))
        delete opaque(new int[10]);
    if (!std::strcmp(argv[1], "new-delete-array"))
        delete[] opaque(new char);
    if (!std::strcmp(argv[1], "aligned-new-free"))
        std::free(opaque(::operator new(100, std::align_val_t(64))));
    if (!std::strcmp(argv[1], "malloc-delete")) // a block of a program's new that calls malloc
        ::operator delete(opaque(std::malloc(40)));
    return 0;
}
EOF
        misuse() { # misuse CASE WANTED: the case, under the debug mode, aborts with WANTED
            echo "-- misuse $1 (CMALLOC_CHECK=1)"
            env CMALLOC_CHECK=1 LD_PRELOAD="$lib" $limit "$tmp/misuse" "$1" 2>"$tmp/misuse.err"
            rc=$?
            if [ "$rc" -eq 134 ] && grep -q "^cmalloc: $2" "$tmp/misuse.err"; then
                echo "  ok (reported, aborted)"
            else
                fail "misuse $1: exit status $rc, not the report wanted:" \
                    "$(sed -n 1p "$tmp/misuse.err")"
            fi
        }
        # A program with its own operator new and delete (unsized, and the array forms) over an
        # arena of its own: C++'s sized deletes, which the compiler calls for `delete p`, are
        # cmalloc's under LD_PRELOAD and must hand the arena's blocks to the program's deletes,
        # as libstdc++'s defaults do (cmalloc reported them as invalid pointers at fea04e2).
        cat >"$tmp/own_new.cc" <<'EOF'
#include <cstdio>
#include <new>
#include <string>
#include <vector>
static char arena[1 << 24];
static std::size_t used;
static long live, live_arrays;
static void *bump(std::size_t n)
{
    n = (n + 15) & ~static_cast<std::size_t>(15);
    if (used + n > sizeof arena)
        throw std::bad_alloc();
    used += n;
    return arena + used - n;
}
void *operator new(std::size_t n) { return live++, bump(n); }
void operator delete(void *p) noexcept { live -= p != nullptr; }
void *operator new[](std::size_t n) { return live_arrays++, bump(n); }
void operator delete[](void *p) noexcept { live_arrays -= p != nullptr; }
struct Node { int v; Node *next; };
struct Named { std::string name; ~Named() {} };
template <class T> static T *opaque(T *p) { __asm__ volatile("" : "+r"(p)); return p; }
int main()
{
    delete opaque(new Node{1, nullptr});     // operator delete(void *, size_t)
    delete[] opaque(new Named[3]);            // operator delete[](void *, size_t)
    delete opaque(new (std::nothrow) Node{}); // nothrow new, sized delete
    std::vector<std::string> v(100, std::string(50, 'x'));
    v.clear();
    v.shrink_to_fit();
    std::printf("live %ld, arrays %ld\n", live, live_arrays);
    return 0;
}
EOF
        if g++ -std=c++17 -O1 -o "$tmp/own_new" "$tmp/own_new.cc" 2>"$tmp/own-new-build.err"; then
            check own-new-delete "$tmp/own_new"
            check own-new-delete-checked env CMALLOC_CHECK=1 "$tmp/own_new"
        else
            fail "own-new-delete: g++ cannot build it: $(sed -n 1p "$tmp/own-new-build.err")"
        fi
        # One with its own operator new and delete only: C++'s default new[] and nothrow news
        # must call its new (the nothrow forms NULL for what it throws), and delete[] its delete.
        cat >"$tmp/own_scalar_new.cc" <<'EOF'
#include <cstdio>
#include <new>
#include <string>
static char arena[1 << 24];
static std::size_t used;
static long live;
static bool in_arena(const void *p)
{
    const char *c = static_cast<const char *>(p);
    return c >= arena && c < arena + sizeof arena;
}
void *operator new(std::size_t n)
{
    n = (n + 15) & ~static_cast<std::size_t>(15);
    if (used + n > sizeof arena)
        throw std::bad_alloc();
    used += n;
    live++;
    return arena + used - n;
}
void operator delete(void *p) noexcept { live -= p != nullptr; }
struct Named { std::string name; ~Named() {} };
template <class T> static T *opaque(T *p) { __asm__ volatile("" : "+r"(p)); return p; }
int main()
{
    int *ints = opaque(new int[8]);
    Named *named = opaque(new Named[3]);
    int *one = opaque(new (std::nothrow) int(1));
    int *more = opaque(new (std::nothrow) int[4]);
    char *huge = new (std::nothrow) char[sizeof arena]; // the arena throws: NULL
    std::printf("from the arena: %d %d %d %d, huge %s\n", in_arena(ints), in_arena(named),
                in_arena(one), in_arena(more), huge ? "non-null" : "null");
    delete[] ints;
    delete[] named;
    ::operator delete(one, std::nothrow);
    delete[] more;
    std::printf("live %ld\n", live);
    return 0;
}
EOF
        if g++ -std=c++17 -O1 -o "$tmp/own_scalar_new" "$tmp/own_scalar_new.cc" \
            2>"$tmp/own-scalar-build.err"; then
            check own-scalar-new "$tmp/own_scalar_new"
            check own-scalar-new-checked env CMALLOC_CHECK=1 "$tmp/own_scalar_new"
        else
            fail "own-scalar-new: g++ cannot build it: $(sed -n 1p "$tmp/own-scalar-build.err")"
        fi
        # One with its own aligned operator new and delete (C++17's align_val_t forms, for types
        # aligned past 16 bytes) over an arena of its own: the sized aligned deletes the compiler
        # calls for `delete p`, the aligned new[] and the aligned nothrow forms must reach its
        # operators, as C++'s defaults do (cmalloc reported an invalid pointer and aborted at
        # eed77db). Built twice: with the array forms too, and with the plain ones only.
        cat >"$tmp/own_aligned_new.cc" <<'EOF'
#include <cstdio>
#include <new>
alignas(64) static char arena[1 << 20];
static std::size_t used;
static long live, live_arrays;
static bool in_arena(const void *p)
{
    const char *c = static_cast<const char *>(p);
    return c >= arena && c < arena + sizeof arena;
}
static void *bump(std::size_t n, std::align_val_t al)
{
    std::size_t a = static_cast<std::size_t>(al);
    std::size_t at = (used + a - 1) & ~(a - 1);
    if (n > sizeof arena || at + n > sizeof arena)
        throw std::bad_alloc();
    used = at + n;
    return arena + at;
}
void *operator new(std::size_t n, std::align_val_t al) { return live++, bump(n, al); }
void operator delete(void *p, std::align_val_t) noexcept { live -= p != nullptr; }
#ifndef PLAIN_ONLY
void *operator new[](std::size_t n, std::align_val_t al) { return live_arrays++, bump(n, al); }
void operator delete[](void *p, std::align_val_t) noexcept { live_arrays -= p != nullptr; }
#endif
struct alignas(64) Line { long v[8]; ~Line() {} };
struct alignas(64) Huge { char bytes[2 << 20]; };
template <class T> static T *opaque(T *p) { __asm__ volatile("" : "+r"(p)); return p; }
int main()
{
    Line *one = opaque(new Line{});
    Line *some = opaque(new Line[3]);
    Line *quiet = opaque(new (std::nothrow) Line{});
    Line *quiet_some = opaque(new (std::nothrow) Line[2]);
    Huge *huge = new (std::nothrow) Huge; // the arena throws: NULL
    std::printf("from the arena: %d %d %d %d, huge %s\n", in_arena(one), in_arena(some),
                in_arena(quiet), in_arena(quiet_some), huge ? "non-null" : "null");
    delete one;    // operator delete(void *, size_t, align_val_t)
    delete[] some; // operator delete[](void *, size_t, align_val_t)
    delete quiet;
    ::operator delete[](quiet_some, std::align_val_t(alignof(Line)), std::nothrow);
    std::printf("live %ld, arrays %ld\n", live, live_arrays);
    return 0;
}
EOF
        for form in both plain; do
            define=
            [ "$form" = plain ] && define=-DPLAIN_ONLY
            if g++ -std=c++17 -O1 $define -o "$tmp/own_aligned_new_$form" \
                "$tmp/own_aligned_new.cc" 2>"$tmp/own-aligned-build.err"; then
                check "own-aligned-new-$form" "$tmp/own_aligned_new_$form"
                check "own-aligned-new-$form-checked" env CMALLOC_CHECK=1 \
                    "$tmp/own_aligned_new_$form"
            else
                fail "own-aligned-new: g++ cannot build it:" \
                    "$(sed -n 1p "$tmp/own-aligned-build.err")"
            fi
        done
        if g++ -std=c++17 -O1 -o "$tmp/misuse" "$tmp/misuse.cc" 2>"$tmp/misuse-build.err"; then
            address="0x[0-9a-f]*"
            misuse base-delete \
                "operator delete(): $address freed with size 4, not the 44 bytes it was allocated"
            misuse new-free "free(): $address was allocated by operator new;"
            misuse new-array-delete "operator delete(): $address was allocated by operator new\[\];"
            misuse new-delete-array "operator delete\[\](): $address was allocated by operator new;"
            misuse aligned-new-free "free(): $address was allocated by operator new;"
            echo "-- malloc-delete (CMALLOC_CHECK=1): accepted"
            env CMALLOC_CHECK=1 LD_PRELOAD="$lib" $limit "$tmp/misuse" malloc-delete \
                2>"$tmp/misuse.err"
            rc=$?
            if [ "$rc" -eq 0 ] && ! grep -q "^cmalloc:" "$tmp/misuse.err"; then
                echo "  ok"
            else
                fail "malloc-delete: exit status $rc: $(sed -n 1p "$tmp/misuse.err")"
            fi
        else
            fail "misuse: g++ cannot build it: $(sed -n 1p "$tmp/misuse-build.err")"
        fi
    else
        echo "  SKIP: g++ cannot build the test program:"
        sed -n '1,5p' "$tmp/cxx-build.err"
    fi
else
    skip g++
fi

echo "-- $ran program runs compared, $failures failure(s)"
if [ "$ran" -eq 0 ]; then
    echo "test_programs: FAIL: none of python3, perl, sqlite3, gcc, g++ is installed"
    exit 1
fi
if [ "$failures" -ne 0 ]; then
    echo "test_programs: FAIL:$failed_names"
    exit 1
fi
echo "test_programs: all passed"
