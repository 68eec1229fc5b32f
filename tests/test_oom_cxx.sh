#!/bin/sh
# test_oom_cxx.sh - C++ out of memory under cmalloc: operator new throws std::bad_alloc, the
# nothrow forms return NULL, a new_handler is called and its retry succeeds, and the program
# allocates normally once memory is free again (including a 100 MiB block after 1 MiB blocks
# that had filled the limit were freed: the page heap must give their address space back).
#
# Builds a small C++ program with g++ (into build/tests/oom_cxx) and runs it with
# LD_PRELOAD=build/libcmalloc.so under `ulimit -v` (the address-space limit makes mmap fail).
# The program prints one "FAIL ..." line per failed check and "oom_cxx: ok" at the end.
# Needs g++ (Debian package g++); skipped with a message when it is missing.
# Runtime: about 1 s (most of it compiling).
set -eu

top=$(pwd)
lib="$top/build/libcmalloc.so"
out="$top/build/tests"
if ! command -v g++ >/dev/null 2>&1; then
    echo "test_oom_cxx.sh: SKIP (g++ not installed; Debian package g++)"
    exit 0
fi
[ -f "$lib" ] || { echo "test_oom_cxx.sh: $lib missing (run make first)" >&2; exit 1; }
mkdir -p "$out"
src="$out/oom_cxx.cc"

cat > "$src" <<'EOF'
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <new>
#include <vector>

static int failures;
static void check(bool ok, const char *what)
{
    if (!ok) {
        std::printf("FAIL %s\n", what);
        failures++;
    }
}

// Keeps the compiler from eliding a new/delete pair.
template <class T> static T *opaque(T *p)
{
    __asm__ volatile("" : "+r"(p));
    return p;
}

static char *reserve; // freed by the new_handler to let the retry succeed
static int handler_calls;
static void release_reserve()
{
    handler_calls++;
    if (reserve) {
        delete[] reserve;
        reserve = nullptr;
    } else {
        std::set_new_handler(nullptr); // nothing left to give: let new throw
    }
}

int main()
{
    const size_t MiB = size_t(1) << 20;
    check(dlsym(RTLD_DEFAULT, "cmalloc_stats_get") != nullptr, "cmalloc is not loaded");

    // Objects made before memory runs out, checked at the end.
    std::vector<char *> keep;
    for (int i = 0; i < 64; i++) {
        char *p = new char[1000 + i * 100];
        std::memset(p, i, 1000);
        keep.push_back(p);
    }

    // 1. A request larger than the limit: new and new[] throw, nothrow returns NULL.
    const size_t too_big = 1024 * MiB;
    bool threw = false;
    try { opaque(new char[too_big])[0] = 1; } catch (const std::bad_alloc &) { threw = true; }
    check(threw, "new char[1 GiB] did not throw std::bad_alloc");
    threw = false;
    try { opaque(static_cast<char *>(::operator new(too_big)))[0] = 1; } catch (const std::bad_alloc &) { threw = true; }
    check(threw, "operator new(1 GiB) did not throw std::bad_alloc");
    threw = false;
    try { opaque(static_cast<char *>(::operator new(too_big, std::align_val_t(64))))[0] = 1; }
    catch (const std::bad_alloc &) { threw = true; }
    check(threw, "operator new(1 GiB, align 64) did not throw std::bad_alloc");
    threw = false;
    try { opaque(static_cast<char *>(::operator new[](too_big, std::align_val_t(4096))))[0] = 1; }
    catch (const std::bad_alloc &) { threw = true; }
    check(threw, "operator new[](1 GiB, align 4096) did not throw std::bad_alloc");
    check(opaque(new (std::nothrow) char[too_big]) == nullptr, "nothrow new[] of 1 GiB is not NULL");
    check(opaque(::operator new(too_big, std::nothrow)) == nullptr, "nothrow operator new is not NULL");
    check(opaque(::operator new(too_big, std::align_val_t(256), std::nothrow)) == nullptr,
          "nothrow aligned operator new is not NULL");

    // 1b. An alignment that is not a power of two (0 included) is no request libstdc++ serves:
    // the throwing forms throw std::bad_alloc at once (a new_handler is not asked), the
    // nothrow forms return NULL; none hands out memory.
    for (size_t bad : {size_t(0), size_t(3), size_t(24), size_t(4097)}) {
        char what[96];
        threw = false;
        try { opaque(static_cast<char *>(::operator new(64, std::align_val_t(bad))))[0] = 1; }
        catch (const std::bad_alloc &) { threw = true; }
        std::snprintf(what, sizeof what, "operator new(64, align_val_t(%zu)) did not throw", bad);
        check(threw, what);
        threw = false;
        try { opaque(static_cast<char *>(::operator new[](64, std::align_val_t(bad))))[0] = 1; }
        catch (const std::bad_alloc &) { threw = true; }
        std::snprintf(what, sizeof what, "operator new[](64, align_val_t(%zu)) did not throw", bad);
        check(threw, what);
        std::snprintf(what, sizeof what, "nothrow operator new(64, align_val_t(%zu)) is not NULL", bad);
        check(opaque(::operator new(64, std::align_val_t(bad), std::nothrow)) == nullptr, what);
        check(opaque(::operator new[](64, std::align_val_t(bad), std::nothrow)) == nullptr, what);
    }

    // 2. A new_handler that frees a reserve: new calls it and the retry succeeds.
    reserve = new char[64 * MiB];
    std::memset(reserve, 1, 4096);
    std::set_new_handler(release_reserve);
    char *wanted = nullptr;
    try {
        // Too big while the reserve is held (the limit is 400 MiB; both blocks are
        // above the mmap threshold, so deleting the reserve gives its address space back), fits once it is freed.
        wanted = new char[360 * MiB];
        std::memset(wanted, 2, 4096);
        std::memset(wanted + 360 * MiB - 4096, 2, 4096);
    } catch (const std::bad_alloc &) {
    }
    std::set_new_handler(nullptr);
    check(handler_calls >= 1, "the new_handler was never called");
    check(wanted != nullptr, "new did not succeed after the new_handler freed memory");
    delete[] wanted;

    // 3. Exhaust the limit with 1 MiB blocks: the last new throws; nothing crashes.
    std::vector<char *> blocks;
    blocks.reserve(4096);
    threw = false;
    try {
        for (int i = 0; i < 4000; i++) {
            char *p = new char[MiB];
            std::memset(p, 0x5a, 4096);
            blocks.push_back(p);
        }
    } catch (const std::bad_alloc &) {
        threw = true;
    }
    check(threw, "allocating 1 MiB blocks never threw under the limit");
    check(opaque(new (std::nothrow) char[MiB]) == nullptr, "nothrow new[] at the limit is not NULL");
    for (char *p : blocks)
        delete[] p;
    blocks.clear();
    // The 1 MiB blocks were page-heap spans; a block above the mmap threshold needs a fresh
    // mmap, which fits only if the page heap gives the address space of its free spans back.
    char *big = new (std::nothrow) char[100 * MiB];
    check(big != nullptr, "new char[100 MiB] after freeing 1 MiB blocks that filled the limit");
    if (big)
        std::memset(big, 4, 4096);
    delete[] big;

    // 4. Memory is back: allocation works, and earlier objects are intact.
    for (int i = 0; i < 64; i++) {
        bool intact = true;
        for (int j = 0; j < 1000; j++)
            intact &= keep[i][j] == static_cast<char>(i);
        check(intact, "an object made before the limit was damaged");
        delete[] keep[i];
    }
    for (int i = 0; i < 300; i++) { // the page heap's free spans are reused
        char *p = new char[MiB];
        std::memset(p, 3, 4096);
        blocks.push_back(p);
    }
    for (char *p : blocks)
        delete[] p;
    blocks.clear();
    std::vector<int> v(1000000, 7);
    check(v[999999] == 7, "a vector after the limit");

    std::printf(failures ? "oom_cxx: %d failures\n" : "oom_cxx: ok\n", failures);
    return failures ? 1 : 0;
}
EOF

g++ -std=c++17 -O1 -fno-builtin -o "$out/oom_cxx" "$src" -ldl
# 400 MiB of address space: the program itself (libstdc++, cmalloc, stacks) needs ~30 MiB.
set +e
result=$( (ulimit -v 409600 && LD_PRELOAD="$lib" "$out/oom_cxx") 2>&1 )
status=$?
set -e
echo "$result"
if [ $status -ne 0 ] || ! echo "$result" | grep -q '^oom_cxx: ok$'; then
    echo "test_oom_cxx.sh: FAILED (exit status $status)" >&2
    exit 1
fi
echo "test_oom_cxx.sh: passed"
