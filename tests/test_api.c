/* test_api.c - the malloc API contract, black box.
 *
 * Every entry point of the malloc family is called through its public name only; nothing here
 * looks at cmalloc's internals. The Makefile links this file with build/libcmalloc.a, so the
 * first test checks, through cmalloc_stats_get(), that cmalloc really is the allocator serving
 * these calls (a test that silently ran on glibc's malloc would prove nothing).
 *
 * What is checked (the contract of DESIGN.md, "The public surface" and "Invariants"):
 *   - allocation works before main: in a constructor, from threads racing to initialize;
 *   - malloc(0) and realloc(NULL, 0) return unique, non-NULL pointers;
 *   - every pointer is 16-byte aligned, for every size from 0 to several MiB;
 *   - malloc_usable_size(p) >= the request, and all of it is writable and does not overlap
 *     any other live object;
 *   - calloc zeroes, also memory that was just filled and freed (reuse), small and large;
 *   - realloc keeps the content across size classes and across the mmap threshold, growing
 *     and shrinking, up to 64 MiB (and huge blocks to 512 MiB, sparsely touched);
 *     realloc(p, 0) frees p and returns NULL (glibc behaviour);
 *   - posix_memalign, aligned_alloc, memalign, valloc, pvalloc for alignments 16 B .. 8 MiB;
 *     posix_memalign returns EINVAL for bad alignments and leaves *memptr alone on failure;
 *   - NULL + errno ENOMEM for overflowing calloc / reallocarray and absurd sizes;
 *   - free_sized and free_aligned_sized (C23) take the blocks of malloc, calloc, a shrinking
 *     realloc and aligned_alloc with the sizes asked for, and really free them;
 *   - cfree, malloc_trim (memory really goes back to the OS), mallinfo/mallinfo2 (bytes in use
 *     are accounted), mallopt, malloc_stats, glibc's __libc_* aliases.
 *
 * TEST_FILTER (a cmocka glob such as "*calloc*") runs some tests only.
 *
 * Built with optimization, and possibly without -fno-builtin: then the compiler knows what
 * malloc, calloc and memset mean and may delete a malloc/free pair, a store before free, or a
 * read of calloc'ed memory it "knows" is zero. Pointers therefore pass through opaque() and
 * fills end with clobber() so every call and every byte access really happens either way.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <setjmp.h>
#include <cmocka.h>

#include "cmalloc.h"
#include "helpers.h"

/* glibc >= 2.26 no longer declares cfree; cmalloc exports it (DESIGN.md, public surface). */
void cfree(void *ptr);
/* C23's sized frees: glibc declares (and has) them only from 2.43, cmalloc exports them. */
void free_sized(void *ptr, size_t size);
void free_aligned_sized(void *ptr, size_t alignment, size_t size);
/* glibc's internal aliases, which cmalloc also exports so nothing escapes it. */
void *__libc_malloc(size_t size);
void __libc_free(void *ptr);
void *__libc_calloc(size_t nmemb, size_t size);
void *__libc_realloc(void *ptr, size_t size);
void *__libc_memalign(size_t alignment, size_t size);
int __posix_memalign(void **memptr, size_t alignment, size_t size);

/* Fails the current test with a formatted message. */
#define CHECK(cond, ...)                                \
    do {                                                \
        if (!(cond)) {                                  \
            print_error("check failed: %s\n  ", #cond); \
            print_error(__VA_ARGS__);                   \
            print_error("\n");                          \
            fail();                                     \
        }                                               \
    } while (0)

static int is_aligned(const void *p, size_t alignment)
{
    return ((uintptr_t)p & (alignment - 1)) == 0;
}

/* A byte pattern that depends on the position and a seed, with no short period, so that a
 * block copied to the wrong offset or mixed with another block is noticed. */
static unsigned char pattern_byte(size_t i, unsigned seed)
{
    uint32_t x = (uint32_t)i * 2654435761u + seed * 40503u;
    return (unsigned char)((x >> 24) ^ (x >> 11) ^ (uint32_t)(i >> 16));
}

static void pattern_fill(void *p, size_t n, unsigned seed)
{
    unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        b[i] = pattern_byte(i, seed);
    clobber(p);
}

/* Returns the first index where the pattern is wrong, or n. */
static size_t pattern_check(const void *p, size_t n, unsigned seed)
{
    const unsigned char *b = opaque((void *)p);
    for (size_t i = 0; i < n; i++)
        if (b[i] != pattern_byte(i, seed))
            return i;
    return n;
}

/* Returns the first non-zero index, or n. */
static size_t first_nonzero(const void *p, size_t n)
{
    const unsigned char *b = opaque((void *)p);
    const size_t words = n / sizeof(uint64_t);
    const uint64_t *w = (const uint64_t *)b; /* every block is 16-byte aligned */
    for (size_t i = 0; i < words; i++)
        if (w[i] != 0) {
            for (size_t j = i * sizeof(uint64_t);; j++)
                if (b[j] != 0)
                    return j;
        }
    for (size_t i = words * sizeof(uint64_t); i < n; i++)
        if (b[i] != 0)
            return i;
    return n;
}

static size_t first_not_byte(const void *p, size_t n, unsigned char v)
{
    const unsigned char *b = opaque((void *)p);
    for (size_t i = 0; i < n; i++)
        if (b[i] != v)
            return i;
    return n;
}

/* Checks one fresh block: non-NULL, 16-byte aligned (or more), usable >= size, all writable. */
static void check_block(void *p, size_t size, size_t alignment, const char *what)
{
    CHECK(p != NULL, "%s(size %zu, alignment %zu) returned NULL", what, size, alignment);
    if (alignment < 16)
        alignment = 16;
    CHECK(is_aligned(p, alignment), "%s(size %zu) returned %p, not %zu-byte aligned", what, size, p,
          alignment);
    size_t usable = malloc_usable_size(p);
    CHECK(usable >= size, "%s(size %zu): malloc_usable_size %zu < request", what, size, usable);
    memset(p, 0x5a, usable);
    clobber(p);
}

/* ---------------------------------------------------------------------------------------- */

/* Allocation before main, from the first constructor, from several threads at once (the
 * allocator may not be initialized yet: DESIGN.md, lazy and idempotent initialization). The
 * results are checked by test_before_main. */
enum { EARLY_THREADS = 4 };
static void *early_block;
static int early_ok[EARLY_THREADS + 1];

static int early_work(void)
{
    void *p[6];
    p[0] = malloc(24);
    p[1] = calloc(10, 1000);
    p[2] = realloc(NULL, 70000);
    p[3] = memalign(4096, 100);
    p[4] = aligned_alloc(64, 256);
    p[5] = malloc(3 * 1024 * 1024);
    int ok = 1;
    for (int i = 0; i < 6; i++)
        if (p[i] == NULL || ((uintptr_t)p[i] & 15) != 0)
            ok = 0;
    if (ok && first_nonzero(p[1], 10000) != 10000)
        ok = 0;
    for (int i = 0; i < 6; i++)
        free(p[i]);
    return ok;
}

static void *early_thread(void *arg)
{
    int *ok = arg;
    *ok = early_work();
    return NULL;
}

__attribute__((constructor(101))) static void early_constructor(void)
{
    pthread_t t[EARLY_THREADS];
    int started = 0;
    for (int i = 0; i < EARLY_THREADS; i++)
        if (pthread_create(&t[i], NULL, early_thread, &early_ok[i]) == 0)
            started++;
    early_ok[EARLY_THREADS] = early_work();
    for (int i = 0; i < started; i++)
        pthread_join(t[i], NULL);
    early_block = malloc(5000);
    if (early_block != NULL)
        memset(early_block, 0x3c, 5000);
}

static void test_before_main(void **state)
{
    (void)state;
    for (int i = 0; i <= EARLY_THREADS; i++)
        CHECK(early_ok[i] == 1, "allocation before main (in a constructor, %s %d) failed",
              i < EARLY_THREADS ? "thread" : "the constructor itself", i);
    CHECK(early_block != NULL, "malloc in a constructor returned NULL");
    CHECK(first_not_byte(early_block, 5000, 0x3c) == 5000,
          "a block allocated before main was overwritten");
    CHECK(malloc_usable_size(early_block) >= 5000, "usable size %zu",
          malloc_usable_size(early_block));
    free(early_block);
}

/* The binary really runs on cmalloc: its counters see our allocations. */
static void test_served_by_cmalloc(void **state)
{
    (void)state;
    const size_t big = 8 * MiB;
    cmalloc_stats before = stats_now();
    void *p = opaque(malloc(big));
    assert_non_null(p);
    memset(p, 1, big);
    clobber(p);
    cmalloc_stats during = stats_now();
    CHECK(during.bytes_in_use >= before.bytes_in_use + big,
          "bytes_in_use went from %zu to %zu after malloc(%zu): is this cmalloc's malloc?",
          before.bytes_in_use, during.bytes_in_use, big);
    CHECK(during.bytes_mapped >= during.bytes_in_use, "bytes_mapped %zu < bytes_in_use %zu",
          during.bytes_mapped, during.bytes_in_use);
    free(p);
    cmalloc_stats after = stats_now();
    /* 4 KiB of slack: this free may start cmalloc's release thread, whose creation allocates
     * a few hundred bytes through malloc. */
    CHECK(after.bytes_in_use + big <= during.bytes_in_use + 4096,
          "bytes_in_use went from %zu to %zu after free of %zu bytes", during.bytes_in_use,
          after.bytes_in_use, big);

    /* Small objects are counted as well (object-size granularity: at least the request). */
    enum { N = 1000 };
    static void *small[N];
    before = stats_now();
    for (int i = 0; i < N; i++) {
        small[i] = opaque(malloc(1000));
        assert_non_null(small[i]);
    }
    during = stats_now();
    CHECK(during.bytes_in_use >= before.bytes_in_use + (size_t)N * 1000,
          "bytes_in_use went from %zu to %zu after %d x malloc(1000)", before.bytes_in_use,
          during.bytes_in_use, N);
    for (int i = 0; i < N; i++)
        free(small[i]);
    after = stats_now();
    CHECK(after.bytes_in_use + (size_t)N * 1000 <= during.bytes_in_use,
          "bytes_in_use went from %zu to %zu after freeing %d x 1000 bytes", during.bytes_in_use,
          after.bytes_in_use, N);
}

static void test_malloc_zero_unique(void **state)
{
    (void)state;
    enum { N = 1024 };
    static void *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = opaque(malloc(opaque_size(0)));
        CHECK(p[i] != NULL, "malloc(0) #%d returned NULL", i);
        CHECK(is_aligned(p[i], 16), "malloc(0) returned %p, not 16-byte aligned", p[i]);
        size_t usable = malloc_usable_size(p[i]);
        memset(p[i], i & 0xff, usable);
        clobber(p[i]);
    }
    for (int i = 0; i < N; i++) {
        size_t usable = malloc_usable_size(p[i]);
        CHECK(first_not_byte(p[i], usable, (unsigned char)(i & 0xff)) == usable,
              "malloc(0) block #%d (%p, usable %zu) was overwritten by another", i, p[i], usable);
    }
    /* Unique: sort the addresses and look for a duplicate. */
    static void *sorted[N];
    memcpy(sorted, p, sizeof sorted);
    for (int i = 1; i < N; i++) /* insertion sort: N is small */
        for (int j = i; j > 0 && (uintptr_t)sorted[j - 1] > (uintptr_t)sorted[j]; j--) {
            void *t = sorted[j];
            sorted[j] = sorted[j - 1];
            sorted[j - 1] = t;
        }
    for (int i = 1; i < N; i++)
        CHECK(sorted[i] != sorted[i - 1], "malloc(0) returned %p twice", sorted[i]);
    for (int i = 0; i < N; i++)
        free(p[i]);

    void *r = opaque(realloc(NULL, opaque_size(0)));
    CHECK(r != NULL, "realloc(NULL, 0) returned NULL (glibc returns malloc(0))");
    free(r);
    void *c = opaque(calloc(opaque_size(0), opaque_size(0)));
    CHECK(c != NULL, "calloc(0, 0) returned NULL");
    void *c2 = opaque(calloc(opaque_size(0), opaque_size(SIZE_MAX)));
    CHECK(c2 != NULL, "calloc(0, SIZE_MAX) returned NULL: 0 bytes does not overflow");
    CHECK(c2 != c, "calloc(0, x) returned the same pointer twice");
    free(c);
    free(c2);
    assert_int_equal(malloc_usable_size(NULL), 0);
}

/* Every size from 0 to 4 KiB byte by byte, then powers of two and their neighbours up to 12 MiB,
 * all live at once: aligned, usable >= size, fully writable, no two blocks overlapping. */
static void test_alignment_usable_overlap(void **state)
{
    (void)state;
    enum { MAX = 4096 + 64 * 3 + 8 };
    static void *p[MAX];
    static size_t sz[MAX];
    int n = 0;
    for (size_t s = 0; s <= 4096; s++)
        sz[n++] = s;
    for (size_t s = 8 * KiB; s <= 12 * MiB; s += s / 2) {
        sz[n++] = s - 1;
        sz[n++] = s;
        sz[n++] = s + 1;
    }
    assert_true(n <= MAX);
    for (int i = 0; i < n; i++) {
        p[i] = opaque(malloc(opaque_size(sz[i])));
        check_block(p[i], sz[i], 16, "malloc");
    }
    for (int i = 0; i < n; i++) {
        size_t usable = malloc_usable_size(p[i]);
        memset(p[i], (i * 37 + 1) & 0xff, usable);
        clobber(p[i]);
    }
    for (int i = 0; i < n; i++) {
        size_t usable = malloc_usable_size(p[i]);
        size_t bad = first_not_byte(p[i], usable, (unsigned char)((i * 37 + 1) & 0xff));
        CHECK(bad == usable,
              "malloc(%zu) = %p: byte %zu of %zu usable was overwritten: blocks overlap", sz[i],
              p[i], bad, usable);
    }
    for (int i = 0; i < n; i++)
        free(p[i]);
}

static void calloc_reuse_round(size_t size, int count)
{
    void **p = malloc((size_t)count * sizeof *p);
    assert_non_null(p);
    /* Round 0: fresh calloc memory is zero. Round 1: every usable byte of the blocks was
     * dirtied and freed, and calloc of the same size (or one byte less, same class) must zero
     * the reused memory too. */
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < count; i++) {
            size_t request = round == 1 && (i & 1) && size > 1 ? size - 1 : size;
            p[i] =
                opaque(i & 2 ? calloc(opaque_size(request), 1) : calloc(1, opaque_size(request)));
            CHECK(p[i] != NULL, "calloc(%zu) returned NULL", request);
            CHECK(is_aligned(p[i], 16), "calloc(%zu) = %p not 16-byte aligned", request, p[i]);
            CHECK(malloc_usable_size(p[i]) >= request, "calloc(%zu): usable %zu", request,
                  malloc_usable_size(p[i]));
            size_t bad = first_nonzero(p[i], request);
            CHECK(bad == request, "calloc(%zu) #%d = %p%s: byte %zu is 0x%02x, not 0", request, i,
                  p[i], round ? " (reused memory)" : "", bad, ((unsigned char *)p[i])[bad]);
        }
        for (int i = 0; i < count; i++) {
            memset(p[i], 0xa5, malloc_usable_size(p[i]));
            clobber(p[i]);
        }
        for (int i = 0; i < count; i++)
            free(p[i]);
    }
    free(p);
}

static void test_calloc_zeroes(void **state)
{
    (void)state;
    static const size_t sizes[] = {
        1,
        8,
        15,
        16,
        17,
        24,
        32,
        48,
        64,
        100,
        128,
        129,
        200,
        256,
        500,
        512,
        1000,
        1024,
        2000,
        4096,
        5000,
        8192,
        10000,
        32 * 1024,
        65536,
        100000,
        200000,
        256 * 1024,
        256 * 1024 + 16,
        300000,
        1024 * 1024 - 16,
        1024 * 1024,
        1024 * 1024 + 1,
        2 * 1024 * 1024,
        5 * 1024 * 1024 + 7,
        32 * 1024 * 1024,
    };
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t s = sizes[k];
        int count = (int)(8 * MiB / s);
        if (count > 64)
            count = 64;
        if (count < 2)
            count = 2;
        calloc_reuse_round(s, count);
    }
    /* nmemb * size products. */
    void *p = opaque(calloc(opaque_size(1000), opaque_size(3)));
    assert_non_null(p);
    assert_true(malloc_usable_size(p) >= 3000);
    assert_int_equal(first_nonzero(p, 3000), 3000);
    free(p);
    p = opaque(calloc(opaque_size(3 * MiB), opaque_size(3)));
    assert_non_null(p);
    assert_true(malloc_usable_size(p) >= 9 * MiB);
    assert_int_equal(first_nonzero(p, 9 * MiB), 9 * MiB);
    free(p);
}

static void expect_enomem(void *p, const char *call)
{
    int e = errno;
    CHECK(p == NULL, "%s returned %p, expected NULL", call, p);
    CHECK(e == ENOMEM, "%s set errno %d (%s), expected ENOMEM", call, e, strerror(e));
}

#define EXPECT_ENOMEM(expr)       \
    do {                          \
        errno = 0;                \
        void *r_ = opaque(expr);  \
        expect_enomem(r_, #expr); \
    } while (0)

static void test_enomem_huge_and_overflow(void **state)
{
    (void)state;
    const size_t huge = opaque_size(SIZE_MAX);
    const size_t half = opaque_size(SIZE_MAX / 2 + 1);
    const size_t over_ptrdiff = opaque_size((size_t)PTRDIFF_MAX + 1);
    const size_t ptrdiff = opaque_size((size_t)PTRDIFF_MAX);
    const size_t absurd = opaque_size((size_t)1 << 50); /* 1 PiB: more than the address space */
    const size_t two = opaque_size(2);

    EXPECT_ENOMEM(malloc(huge));
    EXPECT_ENOMEM(malloc(huge - 4095));
    EXPECT_ENOMEM(malloc(huge - 16 * MiB));
    EXPECT_ENOMEM(malloc(over_ptrdiff));
    EXPECT_ENOMEM(malloc(ptrdiff));
    EXPECT_ENOMEM(malloc(absurd));

    EXPECT_ENOMEM(calloc(huge, two));
    EXPECT_ENOMEM(calloc(two, huge));
    EXPECT_ENOMEM(calloc(half, two));
    EXPECT_ENOMEM(calloc(opaque_size((size_t)1 << 32), opaque_size((size_t)1 << 32)));
    EXPECT_ENOMEM(calloc(opaque_size(SIZE_MAX / 16 + 1), opaque_size(16)));
    EXPECT_ENOMEM(calloc(opaque_size(1), absurd));

    EXPECT_ENOMEM(reallocarray(NULL, huge, two));
    EXPECT_ENOMEM(reallocarray(NULL, opaque_size((size_t)1 << 33), opaque_size((size_t)1 << 31)));

    EXPECT_ENOMEM(aligned_alloc(64, huge));
    EXPECT_ENOMEM(aligned_alloc(4096, huge - 4095));
    EXPECT_ENOMEM(memalign(4096, huge - 10));
    EXPECT_ENOMEM(memalign(opaque_size(MiB), huge - MiB / 2));
    EXPECT_ENOMEM(memalign(64, absurd));
    EXPECT_ENOMEM(valloc(huge));
    EXPECT_ENOMEM(valloc(huge - 100));
    EXPECT_ENOMEM(pvalloc(huge));
    EXPECT_ENOMEM(pvalloc(huge - 4000)); /* rounding up to a page overflows */

    /* realloc and reallocarray that fail leave the old block alone. */
    const size_t keep = 1000;
    void *p = opaque(malloc(keep));
    assert_non_null(p);
    pattern_fill(p, keep, 7);
    EXPECT_ENOMEM(realloc(opaque(p), huge));
    EXPECT_ENOMEM(realloc(opaque(p), over_ptrdiff));
    EXPECT_ENOMEM(realloc(opaque(p), absurd));
    EXPECT_ENOMEM(reallocarray(opaque(p), huge, two));
    EXPECT_ENOMEM(reallocarray(opaque(p), half, two));
    EXPECT_ENOMEM(reallocarray(opaque(p), two, half));
    CHECK(pattern_check(p, keep, 7) == keep, "a failed realloc changed the old block");
    free(p);

    /* posix_memalign reports ENOMEM by its return value and leaves *memptr alone. */
    void *sentinel = (void *)(uintptr_t)0x1234560;
    void *q = sentinel;
    int rc = posix_memalign(&q, 64, huge);
    CHECK(rc == ENOMEM, "posix_memalign(64, SIZE_MAX) returned %d, expected ENOMEM", rc);
    CHECK(q == sentinel, "posix_memalign changed *memptr to %p on failure", q);
    rc = posix_memalign(&q, opaque_size(MiB), huge - MiB / 2);
    CHECK(rc == ENOMEM, "posix_memalign(1 MiB, SIZE_MAX - 512 KiB) returned %d", rc);
    CHECK(q == sentinel, "posix_memalign changed *memptr to %p on failure", q);
    rc = posix_memalign(&q, 4096, absurd);
    CHECK(rc == ENOMEM, "posix_memalign(4096, 1 PiB) returned %d, expected ENOMEM", rc);
    CHECK(q == sentinel, "posix_memalign changed *memptr to %p on failure", q);
    rc = posix_memalign(&q, opaque_size((size_t)1 << 62), 16);
    CHECK(rc == ENOMEM, "posix_memalign(2^62, 16) returned %d, expected ENOMEM", rc);
    CHECK(q == sentinel, "posix_memalign changed *memptr to %p on failure", q);

    /* The allocator still works after all that. */
    p = opaque(malloc(100));
    check_block(p, 100, 16, "malloc after ENOMEM");
    free(p);
}

static void test_reallocarray(void **state)
{
    (void)state;
    unsigned *a = opaque(reallocarray(NULL, 10, sizeof(unsigned)));
    assert_non_null(a);
    assert_true(malloc_usable_size(a) >= 10 * sizeof(unsigned));
    for (unsigned i = 0; i < 10; i++)
        a[i] = i * 3 + 1;
    a = opaque(reallocarray(a, 100000, sizeof(unsigned)));
    assert_non_null(a);
    assert_true(malloc_usable_size(a) >= 100000 * sizeof(unsigned));
    for (unsigned i = 0; i < 10; i++)
        CHECK(a[i] == i * 3 + 1, "reallocarray lost element %u", i);
    for (unsigned i = 10; i < 100000; i++)
        a[i] = i * 3 + 1;
    a = opaque(reallocarray(a, 5, sizeof(unsigned)));
    assert_non_null(a);
    for (unsigned i = 0; i < 5; i++)
        CHECK(a[i] == i * 3 + 1, "reallocarray (shrinking) lost element %u", i);
    free(a);
}

/* Grows one block through every class boundary and the mmap threshold to 64 MiB and back,
 * checking at each step that the common prefix survived. A small block is allocated between
 * steps so that growing in place is not always possible. */
static void test_realloc_keeps_content(void **state)
{
    (void)state;
    static const size_t steps[] = {
        1,
        8,
        15,
        16,
        17,
        31,
        33,
        64,
        100,
        128,
        129,
        255,
        500,
        1024,
        1025,
        4000,
        4096,
        8192,
        10000,
        65536,
        100000,
        256 * 1024,
        256 * 1024 + 1,
        300000,
        1024 * 1024 - 1,
        1024 * 1024,
        1024 * 1024 + 1,
        3 * 1024 * 1024,
        16 * 1024 * 1024,
        64 * 1024 * 1024,
    };
    const int nsteps = (int)(sizeof steps / sizeof steps[0]);
    void *blockers[2 * sizeof steps / sizeof steps[0]];
    int nblockers = 0;
    size_t old = steps[0];
    unsigned seed = 11;
    unsigned char *p = opaque(malloc(old));
    assert_non_null(p);
    pattern_fill(p, old, seed);
    for (int dir = 0; dir < 2; dir++)
        for (int k = 1; k < nsteps; k++) {
            size_t size = dir == 0 ? steps[k] : steps[nsteps - 1 - k];
            blockers[nblockers++] = opaque(malloc(48));
            unsigned char *q = opaque(realloc(p, size));
            CHECK(q != NULL, "realloc(%zu -> %zu) returned NULL", old, size);
            CHECK(is_aligned(q, 16), "realloc(%zu -> %zu) = %p not 16-byte aligned", old, size, q);
            CHECK(malloc_usable_size(q) >= size, "realloc(%zu -> %zu): usable %zu", old, size,
                  malloc_usable_size(q));
            size_t common = old < size ? old : size;
            size_t bad = pattern_check(q, common, seed);
            CHECK(bad == common, "realloc(%zu -> %zu): byte %zu of the content changed", old, size,
                  bad);
            seed++;
            pattern_fill(q, size, seed);
            p = q;
            old = size;
        }
    /* Same size: content kept. */
    unsigned char *q = opaque(realloc(p, old));
    assert_non_null(q);
    CHECK(pattern_check(q, old, seed) == old, "realloc to the same size changed the content");
    free(q);
    for (int i = 0; i < nblockers; i++)
        free(blockers[i]);
}

/* A random walk of reallocs over sizes from 0 to 4 MiB, log-uniform, seeded. */
static void test_realloc_random_walk(void **state)
{
    (void)state;
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    enum { LIVE = 16 };
    unsigned char *p[LIVE] = {0};
    size_t size[LIVE] = {0};
    unsigned seed[LIVE] = {0};
    for (int step = 0; step < 3000; step++) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        int i = (int)(rng % LIVE);
        unsigned bits = (unsigned)((rng >> 8) % 23); /* up to 4 MiB */
        size_t n = (size_t)((rng >> 16) & (((uint64_t)1 << bits) - 1));
        uintptr_t old = (uintptr_t)p[i];
        unsigned char *q = opaque(realloc(opaque(p[i]), opaque_size(n)));
        if (n == 0 && q == NULL) { /* realloc(p, 0) freed p (glibc behaviour) */
            p[i] = NULL;
            size[i] = 0;
            continue;
        }
        CHECK(q != NULL, "realloc(%#lx, %zu) returned NULL", (unsigned long)old, n);
        CHECK(is_aligned(q, 16), "realloc(%zu) = %p not 16-byte aligned", n, q);
        size_t common = size[i] < n ? size[i] : n;
        size_t bad = pattern_check(q, common, seed[i]);
        CHECK(bad == common, "step %d: realloc(%zu -> %zu) changed byte %zu", step, size[i], n,
              bad);
        seed[i] = (unsigned)step;
        pattern_fill(q, n, seed[i]);
        p[i] = q;
        size[i] = n;
    }
    for (int i = 0; i < LIVE; i++) {
        size_t bad = pattern_check(p[i], size[i], seed[i]);
        CHECK(bad == size[i], "block %d of %zu bytes: byte %zu changed", i, size[i], bad);
        free(p[i]);
    }
}

/* Huge blocks grow and shrink by realloc without losing their ends (DESIGN.md: mremap, so
 * growing a huge buffer never copies); only a few pages are touched, so this is cheap. */
static void test_realloc_huge_sparse(void **state)
{
    (void)state;
    const size_t chunk = 64 * KiB;
    size_t size = 16 * MiB;
    unsigned char *p = opaque(malloc(size));
    assert_non_null(p);
    pattern_fill(p, chunk, 21);
    pattern_fill(p + size - chunk, chunk, 22);
    static const size_t grow[] = {256 * 1024 * 1024, 512 * 1024 * 1024};
    for (int k = 0; k < 2; k++) {
        unsigned char *q = opaque(realloc(p, grow[k]));
        CHECK(q != NULL, "realloc(%zu MiB -> %zu MiB) returned NULL", size >> 20, grow[k] >> 20);
        CHECK(is_aligned(q, 16), "realloc to %zu MiB: %p", grow[k] >> 20, q);
        CHECK(malloc_usable_size(q) >= grow[k], "usable %zu < %zu", malloc_usable_size(q), grow[k]);
        CHECK(pattern_check(q, chunk, 21) == chunk, "realloc to %zu MiB lost the first bytes",
              grow[k] >> 20);
        CHECK(pattern_check(q + 16 * MiB - chunk, chunk, 22) == chunk,
              "realloc to %zu MiB lost the bytes at the end of the first 16 MiB", grow[k] >> 20);
        pattern_fill(q + grow[k] - chunk, chunk, 23 + (unsigned)k); /* the new end is usable */
        CHECK(pattern_check(q + grow[k] - chunk, chunk, 23 + (unsigned)k) == chunk,
              "the end of a %zu MiB block does not keep what was written", grow[k] >> 20);
        p = q;
        size = grow[k];
    }
    unsigned char *q = opaque(realloc(p, 100 * MiB)); /* shrink, still huge */
    CHECK(q != NULL, "realloc(512 MiB -> 100 MiB) returned NULL");
    CHECK(pattern_check(q, chunk, 21) == chunk, "shrinking a huge block lost its first bytes");
    q = opaque(realloc(q, 4096)); /* down to a small class */
    CHECK(q != NULL, "realloc(100 MiB -> 4 KiB) returned NULL");
    CHECK(pattern_check(q, 4096, 21) == 4096, "shrinking to 4 KiB lost the first bytes");
    free(q);

    /* Very large alignments work too (only the block itself is touched). */
    void *a = NULL;
    int rc = posix_memalign(&a, opaque_size(256 * MiB), 100);
    CHECK(rc == 0, "posix_memalign(256 MiB, 100) returned %d", rc);
    check_block(a, 100, 256 * MiB, "posix_memalign");
    free(a);
    a = opaque(aligned_alloc(opaque_size(64 * MiB), 64 * MiB));
    CHECK(a != NULL && is_aligned(a, 64 * MiB), "aligned_alloc(64 MiB, 64 MiB) = %p", a);
    free(a);
}

/* realloc(p, 0) frees p and returns NULL, as glibc does; realloc(NULL, n) is malloc(n). */
/* A buffer grown by an eighth at a time (as CPython grows bytearrays and lists), from 16 KiB
 * to 2 MiB with a small allocation between steps, moves about once per doubling: from 32 KiB
 * up a moved block gets whole pages with as many free ones after it where the heap has them,
 * and grows in place there. Below 32 KiB each step moves into the next size class (6 steps);
 * from 32 KiB to 2 MiB the size doubles 6 times: at most 12 moves in the 42 steps. How many
 * of those 6 happen depends on what else the heap holds (7 to 11 have been seen); in size
 * classes up to 256 KiB it moved 24 times. */
static void test_realloc_grows_in_place(void **state)
{
    (void)state;
    void *small[64];
    size_t size = 16 << 10, moves = 0, steps = 0;
    unsigned char *p = opaque(malloc(size));
    assert_non_null(p);
    pattern_fill(p, size, 5);
    for (; size < (2u << 20) && steps < 64; steps++) {
        size_t grown = size + size / 8;
        small[steps] = opaque(malloc(48));
        unsigned char *q = opaque(realloc(p, grown));
        assert_non_null(q);
        moves += q != p;
        CHECK(pattern_check(q, size, 5) == size, "realloc(%zu -> %zu) lost the content", size,
              grown);
        pattern_fill(q, grown, 5);
        p = q;
        size = grown;
    }
    /* The debug mode (CMALLOC_CHECK=1) moves every block that grows, by design: stale pointers
     * then hit its quarantine. */
    const char *check = getenv("CMALLOC_CHECK");
    if (check != NULL && atoi(check) != 0)
        CHECK(moves == steps, "debug mode: %zu of %zu growing reallocs moved", moves, steps);
    else
        CHECK(moves <= 12, "a buffer grown by an eighth at a time moved %zu times in %zu steps",
              moves, steps);
    free(p);
    for (size_t i = 0; i < steps; i++)
        free(small[i]);
}

static void test_realloc_zero_frees(void **state)
{
    (void)state;
    void *p = opaque(realloc(NULL, opaque_size(100)));
    check_block(p, 100, 16, "realloc(NULL, n)");
    errno = 0;
    void *r = opaque(realloc(p, opaque_size(0)));
    CHECK(r == NULL, "realloc(p, 0) returned %p, expected NULL (glibc frees p)", r);

    /* It really freed: a large block's bytes leave bytes_in_use ... */
    const size_t big = 4 * MiB;
    p = opaque(malloc(big));
    assert_non_null(p);
    memset(p, 3, big);
    clobber(p);
    cmalloc_stats before = stats_now();
    r = opaque(realloc(p, opaque_size(0)));
    CHECK(r == NULL, "realloc(p, 0) returned %p, expected NULL", r);
    cmalloc_stats after = stats_now();
    CHECK(after.bytes_in_use + big <= before.bytes_in_use,
          "realloc(p of %zu bytes, 0): bytes_in_use %zu -> %zu, the block was not freed", big,
          before.bytes_in_use, after.bytes_in_use);

    /* ... and small blocks do not pile up. */
    before = stats_now();
    for (int i = 0; i < 100000; i++) {
        p = opaque(malloc(1000));
        assert_non_null(p);
        r = opaque(realloc(p, opaque_size(0)));
        if (r != NULL)
            fail_msg("realloc(p, 0) returned %p, expected NULL", r);
    }
    after = stats_now();
    CHECK(after.bytes_in_use < before.bytes_in_use + 4 * MiB,
          "100000 x realloc(malloc(1000), 0): bytes_in_use grew from %zu to %zu (leak)",
          before.bytes_in_use, after.bytes_in_use);
}

static void test_free_and_cfree(void **state)
{
    (void)state;
    free(NULL);
    cfree(NULL);
    void *p = opaque(malloc(100));
    check_block(p, 100, 16, "malloc");
    cfree(p);
    /* cfree really frees: a big block leaves bytes_in_use. */
    const size_t big = 2 * MiB;
    p = opaque(malloc(big));
    assert_non_null(p);
    memset(p, 1, big);
    clobber(p);
    cmalloc_stats before = stats_now();
    cfree(p);
    cmalloc_stats after = stats_now();
    CHECK(after.bytes_in_use + big <= before.bytes_in_use,
          "cfree of %zu bytes: bytes_in_use %zu -> %zu", big, before.bytes_in_use,
          after.bytes_in_use);
}

/* Sizes tried with each alignment a: tiny, around a, and a few multiples. */
static size_t aligned_size(int k, size_t a)
{
    switch (k) {
    case 0: return 1;
    case 1: return 16;
    case 2: return a - 1;
    case 3: return a;
    case 4: return a + 1;
    case 5: return 3 * a;
    default: return 100000;
    }
}
#define ALIGNED_SIZES 7

/* free_sized and free_aligned_sized in one shape, for check_sized_free_releases. */
static void free_sized_wrapper(void *p, size_t alignment, size_t size)
{
    free_sized(p, size);
    (void)alignment;
}
static void free_aligned_sized_wrapper(void *p, size_t alignment, size_t size)
{
    free_aligned_sized(p, alignment, size);
}
/* A big block released with the size and alignment it was asked for leaves bytes_in_use. */
static void check_sized_free_releases(void (*release)(void *, size_t, size_t), size_t alignment,
                                      const char *what)
{
    const size_t big = 2 * MiB;
    void *p = opaque(aligned_alloc(alignment, big));
    assert_non_null(p);
    memset(p, 1, big);
    clobber(p);
    cmalloc_stats before = stats_now();
    release(p, alignment, big);
    cmalloc_stats after = stats_now();
    CHECK(after.bytes_in_use + big <= before.bytes_in_use,
          "%s of %zu bytes: bytes_in_use %zu -> %zu", what, big, before.bytes_in_use,
          after.bytes_in_use);
}

static void test_free_sized(void **state)
{
    (void)state;
    free_sized(NULL, 0);
    free_sized(NULL, 100);
    free_aligned_sized(NULL, 64, 100);
    /* Every kind of block free_sized takes, with the size it was asked for: the sizes of a
     * shrinking realloc's block are the new ones, also when it stays in place. */
    for (size_t n = 0; n <= 4 * MiB; n = n < 64 ? n + 1 : n + n / 3) {
        void *p = opaque(malloc(n));
        check_block(p, n, 16, "malloc");
        free_sized(p, n);
        p = opaque(calloc(1, n));
        check_block(p, n, 16, "calloc");
        free_sized(p, n);
        p = opaque(malloc(n + n / 4 + 1));
        p = opaque(realloc(p, n));
        if (n > 0)
            check_block(p, n, 16, "realloc");
        free_sized(p, n);
    }
    /* aligned_alloc's blocks with free_aligned_sized, alignments 1 B to 8 MiB. */
    for (size_t a = 1; a <= 8 * MiB; a *= 2) {
        const size_t sizes[3] = {a, 2 * a, 5 * a + 16};
        for (int k = 0; k < 3; k++) {
            void *p = opaque(aligned_alloc(opaque_size(a), opaque_size(sizes[k])));
            check_block(p, sizes[k], a, "aligned_alloc");
            free_aligned_sized(p, a, sizes[k]);
        }
    }
    check_sized_free_releases(free_sized_wrapper, 16, "free_sized");
    check_sized_free_releases(free_aligned_sized_wrapper, 4096, "free_aligned_sized");
}

static void test_posix_memalign(void **state)
{
    (void)state;
    void *p[ALIGNED_SIZES];
    for (size_t a = sizeof(void *); a <= 8 * MiB; a *= 2) {
        for (int k = 0; k < ALIGNED_SIZES; k++) {
            size_t s = aligned_size(k, a);
            p[k] = NULL;
            int rc = posix_memalign(&p[k], opaque_size(a), opaque_size(s));
            CHECK(rc == 0, "posix_memalign(alignment %zu, size %zu) returned %d", a, s, rc);
            check_block(p[k], s, a, "posix_memalign");
            pattern_fill(p[k], s, (unsigned)k);
        }
        for (int k = 0; k < ALIGNED_SIZES; k++) {
            size_t s = aligned_size(k, a);
            size_t bad = pattern_check(p[k], s, (unsigned)k);
            CHECK(bad == s, "posix_memalign(%zu, %zu) block overwritten at byte %zu", a, s, bad);
            free(p[k]);
        }
    }
    /* Size 0 is allowed: NULL or a unique pointer that free accepts. */
    void *z = NULL;
    assert_int_equal(posix_memalign(&z, 64, opaque_size(0)), 0);
    free(z);
}

static void test_posix_memalign_einval(void **state)
{
    (void)state;
    static const size_t bad[] = {
        0,
        1,
        2,
        3,
        4,
        5,
        6,
        7,
        12,
        24,
        48,
        100,
        1000,
        4095,
        4097,
        3 * 1024 * 1024,
        (1u << 20) + 16,
        SIZE_MAX,
        SIZE_MAX / 2,
        ((size_t)1 << 63) + 8,
    };
    void *sentinel = (void *)(uintptr_t)0xabcdef0;
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        void *p = sentinel;
        errno = 0;
        int rc = posix_memalign(&p, opaque_size(bad[k]), 64);
        CHECK(rc == EINVAL, "posix_memalign(alignment %zu) returned %d, expected EINVAL", bad[k],
              rc);
        CHECK(p == sentinel, "posix_memalign(alignment %zu) changed *memptr to %p", bad[k], p);
    }
}

static void test_aligned_alloc(void **state)
{
    (void)state;
    void *p[3];
    for (size_t a = 1; a <= 8 * MiB; a *= 2) {
        /* C11: size a multiple of the alignment. */
        const size_t sizes[3] = {a, 2 * a, a < 16 ? 16 : 5 * a};
        for (int k = 0; k < 3; k++) {
            p[k] = opaque(aligned_alloc(opaque_size(a), opaque_size(sizes[k])));
            check_block(p[k], sizes[k], a, "aligned_alloc");
            pattern_fill(p[k], sizes[k], (unsigned)(k + 100));
        }
        for (int k = 0; k < 3; k++) {
            size_t bad_at = pattern_check(p[k], sizes[k], (unsigned)(k + 100));
            CHECK(bad_at == sizes[k], "aligned_alloc(%zu, %zu) overwritten at byte %zu", a,
                  sizes[k], bad_at);
            free(p[k]);
        }
    }
}

static void test_memalign(void **state)
{
    (void)state;
    void *p[ALIGNED_SIZES];
    for (size_t a = 16; a <= 8 * MiB; a *= 2) {
        for (int k = 0; k < ALIGNED_SIZES; k++) {
            size_t s = aligned_size(k, a);
            p[k] = opaque(memalign(opaque_size(a), opaque_size(s)));
            check_block(p[k], s, a, "memalign");
            pattern_fill(p[k], s, (unsigned)(k + 50));
        }
        for (int k = 0; k < ALIGNED_SIZES; k++) {
            size_t s = aligned_size(k, a);
            size_t bad = pattern_check(p[k], s, (unsigned)(k + 50));
            CHECK(bad == s, "memalign(%zu, %zu) block overwritten at byte %zu", a, s, bad);
            free(p[k]);
        }
    }
    void *q = opaque(memalign(8, 24));
    check_block(q, 24, 16, "memalign(8)");
    free(q);
}

static void test_valloc_pvalloc(void **state)
{
    (void)state;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t sizes[] = {1, 100, page - 1, page, page + 1, 100000, 3 * MiB + 5, 9 * MiB};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t s = sizes[k];
        void *v = opaque(valloc(opaque_size(s)));
        check_block(v, s, page, "valloc");
        size_t rounded = (s + page - 1) & ~(page - 1);
        void *pv = opaque(pvalloc(opaque_size(s)));
        check_block(pv, rounded, page, "pvalloc (size rounded up to a page)");
        pattern_fill(v, s, 1);
        pattern_fill(pv, rounded, 2);
        CHECK(pattern_check(v, s, 1) == s, "valloc(%zu) block overwritten", s);
        free(v);
        CHECK(pattern_check(pv, rounded, 2) == rounded, "pvalloc(%zu) block overwritten", s);
        free(pv);
    }
    void *v0 = opaque(valloc(opaque_size(0)));
    void *p0 = opaque(pvalloc(opaque_size(0)));
    CHECK(v0 == NULL || is_aligned(v0, page), "valloc(0) = %p", v0);
    CHECK(p0 == NULL || is_aligned(p0, page), "pvalloc(0) = %p", p0);
    free(v0);
    free(p0);
}

/* Alignments near the top of the address space: the arithmetic on alignment + size must not
 * overflow into a small, wrongly aligned block. Either a correctly aligned, writable block
 * or NULL with ENOMEM (glibc: ENOMEM, or EINVAL above SIZE_MAX / 2 + 1 for memalign). */
static void test_extreme_alignments(void **state)
{
    (void)state;
    static const unsigned shifts[] = {30, 36, 40, 44, 46, 47, 48, 56, 62, 63};
    for (size_t k = 0; k < sizeof shifts / sizeof shifts[0]; k++) {
        size_t a = opaque_size((size_t)1 << shifts[k]);
        static const size_t sizes[] = {1, 4096, (size_t)1 << 20};
        for (size_t j = 0; j < 3; j++) {
            size_t n = opaque_size(sizes[j]);
            errno = 0;
            void *p = opaque(memalign(a, n));
            int e = errno;
            if (p == NULL) {
                CHECK(e == ENOMEM || e == EINVAL, "memalign(2^%u, %zu): NULL with errno %d",
                      shifts[k], n, e);
            } else {
                check_block(p, n, a, "memalign (huge alignment)");
                free(p);
            }
            void *q = (void *)(uintptr_t)0x4560;
            int rc = posix_memalign(&q, a, n);
            if (rc != 0) {
                CHECK(rc == ENOMEM,
                      "posix_memalign(2^%u, %zu) returned %d, expected 0 or "
                      "ENOMEM",
                      shifts[k], n, rc);
                CHECK(q == (void *)(uintptr_t)0x4560, "failed posix_memalign changed *memptr");
            } else {
                check_block(q, n, a, "posix_memalign (huge alignment)");
                free(q);
            }
        }
    }
}

/* Blocks from the aligned entry points can be realloc'ed and keep their content. */
static void test_realloc_aligned_blocks(void **state)
{
    (void)state;
    void *p = NULL;
    assert_int_equal(posix_memalign(&p, 4096, 1000), 0);
    pattern_fill(p, 1000, 3);
    p = opaque(realloc(p, 200000));
    assert_non_null(p);
    CHECK(pattern_check(p, 1000, 3) == 1000, "realloc of a posix_memalign block lost content");
    pattern_fill(p, 200000, 4);
    p = opaque(realloc(p, 5 * MiB));
    assert_non_null(p);
    CHECK(pattern_check(p, 200000, 4) == 200000, "realloc lost content");
    free(p);

    p = opaque(memalign(2 * MiB, 3 * MiB));
    assert_non_null(p);
    assert_true(is_aligned(p, 2 * MiB));
    pattern_fill(p, 3 * MiB, 5);
    p = opaque(realloc(p, 100));
    assert_non_null(p);
    CHECK(pattern_check(p, 100, 5) == 100, "shrinking realloc of a memalign block lost content");
    free(p);

    p = opaque(aligned_alloc(256, 256));
    assert_non_null(p);
    pattern_fill(p, 256, 6);
    p = opaque(realloc(p, 70000));
    assert_non_null(p);
    CHECK(pattern_check(p, 256, 6) == 256, "realloc of an aligned_alloc block lost content");
    free(p);
}

/* A seeded mix of every allocating entry point with random frees: nothing overlaps, nothing
 * is lost, and free accepts every kind of block. */
static void test_mixed_entry_points(void **state)
{
    (void)state;
    enum { LIVE = 4096 };
    static void *p[LIVE];
    static size_t size[LIVE];
    uint64_t rng = 88172645463325252ull;
    memset(p, 0, sizeof p);
    for (int step = 0; step < 60000; step++) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        int i = (int)(rng % LIVE);
        if (p[i] != NULL) {
            size_t bad = first_not_byte(p[i], size[i], (unsigned char)i);
            CHECK(bad == size[i], "block %d of %zu bytes at %p: byte %zu was overwritten", i,
                  size[i], p[i], bad);
            free(p[i]);
            p[i] = NULL;
            continue;
        }
        size_t n = (size_t)(rng >> 40) % ((rng >> 20) % 16 == 0 ? 300000 : 1100);
        size_t a = (size_t)16 << ((rng >> 32) % 9); /* 16 .. 4096 */
        void *q = NULL;
        switch ((rng >> 24) % 8) {
        case 0: q = calloc(1, n); break;
        case 1: q = memalign(a, n); break;
        case 2:
            if (posix_memalign(&q, a, n) != 0)
                q = NULL;
            break;
        case 3: q = aligned_alloc(a, (n + a - 1) & ~(a - 1)); break;
        case 4: q = realloc(NULL, n); break;
        default: q = malloc(n); break;
        }
        q = opaque(q);
        CHECK(q != NULL, "allocation of %zu bytes failed at step %d", n, step);
        CHECK(is_aligned(q, 16), "block %p not 16-byte aligned", q);
        memset(q, i & 0xff, n);
        clobber(q);
        p[i] = q;
        size[i] = n;
    }
    for (int i = 0; i < LIVE; i++)
        if (p[i] != NULL) {
            size_t bad = first_not_byte(p[i], size[i], (unsigned char)i);
            CHECK(bad == size[i], "block %d: byte %zu was overwritten", i, bad);
            free(p[i]);
        }
}

/* glibc's internal names are cmalloc's too (DESIGN.md: "so nothing escapes"): blocks from them
 * are counted by cmalloc and free() accepts them, and the other way round. */
static void test_libc_aliases(void **state)
{
    (void)state;
    const size_t big = 3 * MiB;
    cmalloc_stats before = stats_now();
    void *p = opaque(__libc_malloc(big));
    assert_non_null(p);
    memset(p, 1, big);
    clobber(p);
    cmalloc_stats during = stats_now();
    CHECK(during.bytes_in_use >= before.bytes_in_use + big,
          "__libc_malloc(%zu) not served by cmalloc: bytes_in_use %zu -> %zu", big,
          before.bytes_in_use, during.bytes_in_use);
    free(p);

    p = opaque(__libc_calloc(10, 100));
    assert_non_null(p);
    assert_int_equal(first_nonzero(p, 1000), 1000);
    pattern_fill(p, 1000, 9);
    p = opaque(__libc_realloc(p, 100000));
    assert_non_null(p);
    CHECK(pattern_check(p, 1000, 9) == 1000, "__libc_realloc lost content");
    __libc_free(p);

    p = opaque(__libc_memalign(4096, 5000));
    check_block(p, 5000, 4096, "__libc_memalign");
    free(p);
    p = NULL;
    assert_int_equal(__posix_memalign(&p, 1024, 3000), 0);
    check_block(p, 3000, 1024, "__posix_memalign");
    __libc_free(p);
    assert_int_equal(__posix_memalign(&p, 3, 16), EINVAL);

    p = opaque(malloc(777));
    assert_non_null(p);
    __libc_free(p);
}

/* After freeing tens of MiB, malloc_trim(0) gives the memory back to the OS (DESIGN.md: free
 * spans are released at once on malloc_trim(0)). Measured as resident set size. */
static void test_malloc_trim_releases(void **state)
{
    (void)state;
    enum { SMALL = 2048, LARGE = 16 };
    static void *small[SMALL];
    static void *large[LARGE];
    const size_t small_size = 32 * KiB, large_size = 2 * MiB;
    const size_t total = SMALL * small_size + LARGE * large_size; /* 96 MiB */
    size_t rss_start = resident_bytes();
    for (int i = 0; i < SMALL; i++) {
        small[i] = opaque(malloc(small_size));
        assert_non_null(small[i]);
        memset(small[i], 1, small_size);
        clobber(small[i]);
    }
    for (int i = 0; i < LARGE; i++) {
        large[i] = opaque(malloc(large_size));
        assert_non_null(large[i]);
        memset(large[i], 2, large_size);
        clobber(large[i]);
    }
    size_t rss_full = resident_bytes();
    CHECK(rss_full >= rss_start + total / 2, "RSS %zu -> %zu after touching %zu bytes", rss_start,
          rss_full, total);
    for (int i = 0; i < SMALL; i++)
        free(small[i]);
    for (int i = 0; i < LARGE; i++)
        free(large[i]);
    int rc = malloc_trim(0);
    CHECK(rc == 0 || rc == 1, "malloc_trim returned %d", rc);
    size_t rss_trimmed = resident_bytes();
    CHECK(rss_trimmed + total / 2 <= rss_full,
          "RSS %zu MiB with %zu MiB live, still %zu MiB after free and malloc_trim(0)",
          rss_full >> 20, total >> 20, rss_trimmed >> 20);
    /* The memory is usable again. */
    void *p = opaque(malloc(small_size));
    check_block(p, small_size, 16, "malloc after malloc_trim");
    free(p);
    rc = malloc_trim(opaque_size(1 * MiB));
    CHECK(rc == 0 || rc == 1, "malloc_trim(1 MiB) returned %d", rc);
}

static void test_mallinfo2(void **state)
{
    (void)state;
    enum { N = 512 };
    static void *p[N];
    const size_t size = 64 * KiB, total = N * size; /* 32 MiB */
    struct mallinfo2 before = mallinfo2();
    for (int i = 0; i < N; i++) {
        p[i] = opaque(malloc(size));
        assert_non_null(p[i]);
        memset(p[i], 1, size);
    }
    struct mallinfo2 during = mallinfo2();
    size_t used_before = before.uordblks + before.hblkhd;
    size_t used_during = during.uordblks + during.hblkhd;
    CHECK(used_during >= used_before + total,
          "mallinfo2 uordblks + hblkhd went from %zu to %zu with %zu more bytes allocated",
          used_before, used_during, total);
    CHECK(during.uordblks <= during.arena + during.hblkhd,
          "mallinfo2: uordblks %zu > arena %zu + hblkhd %zu", during.uordblks, during.arena,
          during.hblkhd);
    for (int i = 0; i < N; i++)
        free(p[i]);
    struct mallinfo2 after = mallinfo2();
    size_t used_after = after.uordblks + after.hblkhd;
    /* 4 KiB of slack, as in test_served_by_cmalloc: these frees may start the release
     * thread, whose creation allocates a few hundred bytes in glibc. */
    CHECK(used_after + total <= used_during + 4096,
          "mallinfo2 uordblks + hblkhd went from %zu to %zu after freeing %zu bytes", used_during,
          used_after, total);

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    struct mallinfo old = mallinfo(); /* the int version still answers */
#pragma GCC diagnostic pop
    CHECK(old.uordblks >= 0 && old.hblkhd >= 0, "mallinfo: uordblks %d hblkhd %d", old.uordblks,
          old.hblkhd);
}

static void test_malloc_stats_and_print(void **state)
{
    (void)state;
    /* malloc_stats writes to stderr: send it to /dev/null for the call. */
    fflush(stderr);
    int saved = dup(2);
    assert_true(saved >= 0);
    int devnull = open("/dev/null", O_WRONLY);
    assert_true(devnull >= 0);
    dup2(devnull, 2);
    malloc_stats();
    dup2(saved, 2);
    close(saved);
    close(devnull);

    /* cmalloc_stats_print writes a non-empty report to the descriptor it is given. */
    int fd = memfd_create("cmalloc-stats", 0);
    assert_true(fd >= 0);
    void *p = opaque(malloc(100));
    cmalloc_stats_print(fd);
    free(p);
    off_t len = lseek(fd, 0, SEEK_END);
    CHECK(len > 0, "cmalloc_stats_print wrote %lld bytes", (long long)len);
    close(fd);
}

/* mallopt answers 1 (done) or 0 (not supported) and never breaks the allocator. Run last. */
static void test_mallopt(void **state)
{
    (void)state;
    static const int params[][2] = {
        {M_MMAP_THRESHOLD, 1024 * 1024},
        {M_TRIM_THRESHOLD, 4 * 1024 * 1024},
        {M_TOP_PAD, 0},
        {M_ARENA_MAX, 8},
        {M_MMAP_MAX, 65536},
        {M_MXFAST, 64},
        {M_ARENA_TEST, 8},
        {12345, 1},
    };
    for (size_t k = 0; k < sizeof params / sizeof params[0]; k++) {
        int rc = mallopt(params[k][0], params[k][1]);
        CHECK(rc == 0 || rc == 1, "mallopt(%d, %d) returned %d", params[k][0], params[k][1], rc);
    }
    static const size_t sizes[] = {10, 1000, 128 * 1024, 200 * 1024, MiB - 1, MiB + 1, 3 * MiB};
    void *p[sizeof sizes / sizeof sizes[0]];
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        p[k] = opaque(malloc(sizes[k]));
        check_block(p[k], sizes[k], 16, "malloc after mallopt");
    }
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
        free(p[k]);
}

int main(void)
{
    const char *filter = getenv("TEST_FILTER"); /* a cmocka glob, e.g. "*realloc*" */
    if (filter != NULL)
        cmocka_set_test_filter(filter);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_served_by_cmalloc),
        cmocka_unit_test(test_before_main),
        cmocka_unit_test(test_malloc_zero_unique),
        cmocka_unit_test(test_alignment_usable_overlap),
        cmocka_unit_test(test_calloc_zeroes),
        cmocka_unit_test(test_enomem_huge_and_overflow),
        cmocka_unit_test(test_reallocarray),
        cmocka_unit_test(test_realloc_keeps_content),
        cmocka_unit_test(test_realloc_random_walk),
        cmocka_unit_test(test_realloc_huge_sparse),
        cmocka_unit_test(test_realloc_grows_in_place),
        cmocka_unit_test(test_realloc_zero_frees),
        cmocka_unit_test(test_free_and_cfree),
        cmocka_unit_test(test_free_sized),
        cmocka_unit_test(test_posix_memalign),
        cmocka_unit_test(test_posix_memalign_einval),
        cmocka_unit_test(test_aligned_alloc),
        cmocka_unit_test(test_memalign),
        cmocka_unit_test(test_valloc_pvalloc),
        cmocka_unit_test(test_extreme_alignments),
        cmocka_unit_test(test_realloc_aligned_blocks),
        cmocka_unit_test(test_mixed_entry_points),
        cmocka_unit_test(test_libc_aliases),
        cmocka_unit_test(test_malloc_trim_releases),
        cmocka_unit_test(test_mallinfo2),
        cmocka_unit_test(test_malloc_stats_and_print),
        cmocka_unit_test(test_mallopt),
    };
    return cmocka_run_group_tests_name("api", tests, NULL, NULL);
}
