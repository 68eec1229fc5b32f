/* fuzz_entry_points.c - a libFuzzer target driving every malloc entry point of cmalloc.
 *
 * The input is decoded into a sequence of operations over a table of 256 live blocks: malloc,
 * calloc, realloc, free (by the block's tag: free, free_sized or free_aligned_sized),
 * posix_memalign, aligned_alloc, memalign, valloc, pvalloc, reallocarray, malloc_usable_size,
 * realloc(p, 0), realloc(NULL, n), overflowing calloc/reallocarray, malloc_trim and bursts of
 * small blocks. Sizes are biased to small (most below 1 KiB), some up to 256 KiB (size
 * classes), some up to 8 MiB and a few up to 24 MiB, on both sides of the mmap threshold (1 MiB
 * at start, raised to the size of each mapped block freed, up to 32 MiB); alignments are any
 * power of two up to 4 MiB (and a few invalid ones, which must fail with EINVAL).
 *
 * Every block is filled with a pattern derived from its tag and offset (all of it up to 2 KiB;
 * for bigger blocks the first and last 512 bytes and 8 bytes every 64 KiB), checked before it is
 * freed or reallocated (realloc: the kept prefix), and checked for alignment, usable size and
 * (calloc) zeroes. cm_heap_check() runs every 64 operations and at the end; at the end every
 * block is freed, the heap checked again, and (in the prefixed build, where the harness is
 * cmalloc's only user) bytes in use must be back to zero. Any failure prints what and aborts,
 * so libFuzzer saves the input.
 *
 * Two builds (rules in tests/reliability.mk):
 *   build/fuzz/fuzz_entry_points   clang -fsanitize=fuzzer,undefined, against a prefixed copy
 *                                  of cmalloc (-DCM_PREFIX=cmfuzz_, objects in build/fuzz/obj)
 *                                  with coverage instrumentation, so libFuzzer's own mallocs
 *                                  stay with glibc and only the harness's calls reach cmalloc.
 *                                  `make fuzz FUZZ_SECONDS=60` runs it over tests/fuzz_corpus/
 *                                  (new interesting inputs go to build/fuzz/corpus/, crashes to
 *                                  build/fuzz/; copy a crash into tests/fuzz_corpus/ once fixed).
 *   build/tests/test_fuzz_replay   gcc, FUZZ_REPLAY_MAIN: a main() that replays the files (or
 *                                  every file of the directories) named on its command line,
 *                                  default tests/fuzz_corpus; linked with build/libcmalloc.a, so
 *                                  the plain names are cmalloc's. Part of `make test`.
 * FUZZ_TRACE=1 in the environment prints every operation and runs the heap check after each.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmalloc.h"

bool cm_heap_check(void); /* src/internal.h: hidden in the .so, linkable from the .a */

#ifdef FUZZ_REPLAY_MAIN
#define FZ(name) name
void free_sized(void *p, size_t size); /* C23: glibc declares them only from 2.43 */
void free_aligned_sized(void *p, size_t alignment, size_t size);
#else
#define FZ(name) cmfuzz_##name
void *cmfuzz_malloc(size_t size);
void cmfuzz_free(void *p);
void cmfuzz_free_sized(void *p, size_t size);
void cmfuzz_free_aligned_sized(void *p, size_t alignment, size_t size);
void *cmfuzz_calloc(size_t count, size_t size);
void *cmfuzz_realloc(void *p, size_t size);
void *cmfuzz_reallocarray(void *p, size_t count, size_t size);
int cmfuzz_posix_memalign(void **out, size_t alignment, size_t size);
void *cmfuzz_aligned_alloc(size_t alignment, size_t size);
void *cmfuzz_memalign(size_t alignment, size_t size);
void *cmfuzz_valloc(size_t size);
void *cmfuzz_pvalloc(size_t size);
size_t cmfuzz_malloc_usable_size(void *p);
int cmfuzz_malloc_trim(size_t pad);
#endif

#define KiB ((size_t)1024)
#define MiB (KiB * 1024)

enum { SLOTS = 256, CHECK_EVERY = 64, MAX_OPS = 100000 };
static const size_t live_limit = 192 * MiB; /* skip allocations beyond this many live bytes */

typedef struct block {
    unsigned char *p;
    size_t size;      /* requested */
    size_t alignment; /* requested (1 = none) */
    uint32_t tag;     /* pattern seed */
} block;

static block table[SLOTS];
static size_t live_bytes;
static uint32_t next_tag = 1;
static unsigned long op_number;

/* ---- the input ------------------------------------------------------------------------------- */

typedef struct reader {
    const uint8_t *data;
    size_t size, at;
} reader;

static uint8_t take8(reader *r)
{
    return r->at < r->size ? r->data[r->at++] : 0;
}
static uint32_t take16(reader *r)
{
    return (uint32_t)take8(r) | (uint32_t)take8(r) << 8;
}
static uint32_t take32(reader *r)
{
    return take16(r) | take16(r) << 16;
}

/* A size biased to small: 75% below 1 KiB, 18% up to 256 KiB (the size classes), 4% up to
 * 8 MiB, 1% up to 24 MiB (page-heap spans or mappings, as the mmap threshold stands). Some
 * exact edges. */
static size_t take_size(reader *r)
{
    uint8_t kind = take8(r);
    uint32_t x = take32(r);
    if (kind < 192)
        return x % 1025;
    if (kind < 238)
        return x % (256 * KiB + 1);
    if (kind < 248)
        return 256 * KiB + x % (8 * MiB - 256 * KiB + 1);
    if (kind < 251)
        return 8 * MiB + x % (16 * MiB + 1);
    static const size_t edges[] = {
        0,       1,           15,      16,         17, 1024, 1025, 256 * KiB, 256 * KiB + 1,
        8 * MiB, 8 * MiB + 1, 8 * KiB, 8 * KiB - 1};
    return edges[x % (sizeof edges / sizeof edges[0])];
}

/* A power of two from 1 to 4 MiB; rarely an invalid one (0, 3, 24, 2^k + 8). */
static size_t take_alignment(reader *r, bool *valid)
{
    uint8_t x = take8(r);
    *valid = true;
    if (x >= 248) {
        static const size_t bad[] = {0, 3, 24, 4104};
        *valid = false;
        return bad[x % 4];
    }
    return (size_t)1 << (x % 23);
}

/* ---- patterns -------------------------------------------------------------------------------- */

static void fail(const char *what, const block *b, size_t detail)
{
    fprintf(stderr,
            "fuzz_entry_points: op %lu: %s (block %p, size %zu, alignment %zu, tag %u, "
            "detail %zu)\n",
            op_number, what, b ? (void *)b->p : NULL, b ? b->size : 0, b ? b->alignment : 0,
            b ? b->tag : 0, detail);
    abort();
}

static inline unsigned char pattern(uint32_t tag, size_t offset)
{
    return (unsigned char)(tag * 31u + (uint32_t)offset * 7u + (uint32_t)(offset >> 8));
}

/* Calls f(offset, length) over the sampled regions of the first `size` bytes. */
#define SAMPLE_FULL   (2 * KiB)
#define SAMPLE_EDGE   (512)
#define SAMPLE_STRIDE (64 * KiB)

static void fill_range(const block *b, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++)
        b->p[i] = pattern(b->tag, i);
}

static bool check_range(const block *b, size_t from, size_t to, size_t *bad)
{
    for (size_t i = from; i < to; i++)
        if (b->p[i] != pattern(b->tag, i)) {
            *bad = i;
            return false;
        }
    return true;
}

static void fill_block(const block *b)
{
    size_t n = b->size;
    if (n <= SAMPLE_FULL) {
        fill_range(b, 0, n);
        return;
    }
    fill_range(b, 0, SAMPLE_EDGE);
    fill_range(b, n - SAMPLE_EDGE, n);
    for (size_t o = SAMPLE_STRIDE; o + 8 <= n - SAMPLE_EDGE; o += SAMPLE_STRIDE)
        fill_range(b, o, o + 8);
}

/* Checks the pattern over the first `prefix` bytes, as filled for a block of b->size. */
static void check_block(const block *b, size_t prefix, const char *when)
{
    size_t n = b->size, bad = 0;
    bool ok = true;
    if (n <= SAMPLE_FULL) {
        ok = check_range(b, 0, prefix, &bad);
    } else {
        ok = check_range(b, 0, prefix < SAMPLE_EDGE ? prefix : SAMPLE_EDGE, &bad);
        for (size_t o = SAMPLE_STRIDE; ok && o + 8 <= n - SAMPLE_EDGE && o + 8 <= prefix;
             o += SAMPLE_STRIDE)
            ok = check_range(b, o, o + 8, &bad);
        if (ok && prefix > n - SAMPLE_EDGE)
            ok = check_range(b, n - SAMPLE_EDGE, prefix, &bad);
    }
    if (!ok) {
        char what[96];
        snprintf(what, sizeof what, "pattern damaged %s", when);
        fail(what, b, bad);
    }
}

/* A new block in slot: alignment, usable size, pattern. */
static void adopt(block *b, void *p, size_t size, size_t alignment, bool zeroed)
{
    b->p = p;
    b->size = size;
    b->alignment = alignment;
    b->tag = next_tag++;
    if (((uintptr_t)p & 15) != 0)
        fail("block not 16-byte aligned", b, (uintptr_t)p & 15);
    if (alignment > 1 && ((uintptr_t)p & (alignment - 1)) != 0)
        fail("block not aligned as asked", b, (uintptr_t)p & (alignment - 1));
    size_t usable = FZ(malloc_usable_size)(p);
    if (usable < size)
        fail("malloc_usable_size below the request", b, usable);
    if (zeroed) {
        size_t n = size <= SAMPLE_FULL ? size : SAMPLE_EDGE;
        for (size_t i = 0; i < n; i++)
            if (b->p[i] != 0)
                fail("calloc block not zeroed", b, i);
        for (size_t i = size > SAMPLE_FULL ? size - SAMPLE_EDGE : size; i < size; i++)
            if (b->p[i] != 0)
                fail("calloc block not zeroed (tail)", b, i);
    }
    /* All of the usable size must be writable. */
    if (usable > size && usable - size <= SAMPLE_FULL)
        memset(b->p + size, 0xee, usable - size);
    else if (usable > size)
        b->p[usable - 1] = 0xee;
    fill_block(b);
    live_bytes += size;
}

/* Frees b's block, by its tag with free, free_sized or free_aligned_sized: each sized free is
 * told the size asked for, the aligned one the alignment when it was a power of two (memalign
 * rounds others up), else 1. */
static void release(block *b)
{
    check_block(b, b->size, "before free");
    size_t alignment = (b->alignment & (b->alignment - 1)) == 0 ? b->alignment : 1;
    if (b->tag % 3 == 0)
        FZ(free)(b->p);
    else if (b->tag % 3 == 1)
        FZ(free_sized)(b->p, b->size);
    else
        FZ(free_aligned_sized)(b->p, alignment, b->size);
    live_bytes -= b->size;
    memset(b, 0, sizeof *b);
}

/* Hides a size from the compiler, which would warn about the overflowing requests we mean. */
static size_t opaque_size(size_t x)
{
    __asm__ volatile("" : "+r"(x));
    return x;
}

static bool room_for(size_t size)
{
    return live_bytes + size <= live_limit;
}

static void expect_null(void *p, int expected_errno, int got_errno, const char *what)
{
    if (p != NULL) {
        FZ(free)(p);
        fail(what, NULL, (uintptr_t)p);
    }
    if (got_errno != expected_errno)
        fail(what, NULL, (size_t)got_errno);
}

static void heap_check(const char *when)
{
    if (!cm_heap_check())
        fail(when, NULL, 0);
}

/* ---- one run ------------------------------------------------------------------------------- */

static bool tracing; /* FUZZ_TRACE=1: one line per operation on stderr */

static void run(const uint8_t *data, size_t size)
{
    reader r = {data, size, 0};
    op_number = 0;
    while (r.at < r.size && op_number < MAX_OPS) {
        op_number++;
        uint8_t op = take8(&r);
        block *b = &table[take8(&r)];
        if (tracing)
            fprintf(stderr, "op %lu: kind %d slot %d (holds %p, %zu bytes) at input byte %zu\n",
                    op_number, op % 18, (int)(b - table), (void *)b->p, b->size, r.at);
        /* Most operations replace the slot's block: free it first. */
        switch (op % 18) {
        case 0: { /* malloc */
            size_t n = take_size(&r);
            if (b->p)
                release(b);
            if (!room_for(n))
                break;
            void *p = FZ(malloc)(n);
            if (p == NULL)
                fail("malloc returned NULL", NULL, n);
            adopt(b, p, n, 1, false);
            break;
        }
        case 1: { /* calloc */
            size_t count = take8(&r) + 1, n = take_size(&r) / count;
            if (b->p)
                release(b);
            if (!room_for(count * n))
                break;
            void *p = FZ(calloc)(count, n);
            if (p == NULL)
                fail("calloc returned NULL", NULL, count * n);
            adopt(b, p, count * n, 1, true);
            break;
        }
        case 2:
        case 3: { /* realloc: the kept prefix must survive */
            size_t n = take_size(&r);
            if (b->p == NULL || !room_for(n))
                break;
            check_block(b, b->size, "before realloc");
            if (n == 0)
                break; /* realloc(p, 0) is its own operation */
            void *p = FZ(realloc)(b->p, n);
            if (p == NULL)
                fail("realloc returned NULL", b, n);
            block moved = *b;
            moved.p = p;
            size_t kept = n < b->size ? n : b->size;
            /* The prefix keeps the old pattern as sampled for the old size. */
            check_block(&moved, kept, "after realloc (kept prefix)");
            live_bytes -= b->size;
            adopt(b, p, n, 1, false);
            break;
        }
        case 4: { /* free */
            if (b->p)
                release(b);
            break;
        }
        case 5: { /* posix_memalign */
            bool valid;
            size_t alignment = take_alignment(&r, &valid), n = take_size(&r);
            if (b->p)
                release(b);
            if (!room_for(n + alignment))
                break;
            void *p = (void *)0x1;
            int e = FZ(posix_memalign)(&p, alignment, n);
            if (!valid || alignment < sizeof(void *)) {
                if (e != EINVAL || p != (void *)0x1)
                    fail("posix_memalign with a bad alignment did not fail with EINVAL", NULL,
                         alignment);
                break;
            }
            if (e != 0)
                fail("posix_memalign failed", NULL, (size_t)e);
            adopt(b, p, n, alignment, false);
            break;
        }
        case 6: { /* aligned_alloc */
            bool valid;
            size_t alignment = take_alignment(&r, &valid), n = take_size(&r);
            if (b->p)
                release(b);
            if (!room_for(n + alignment))
                break;
            errno = 0;
            void *p = FZ(aligned_alloc)(alignment, n);
            if (!valid && alignment != 0) { /* glibc: EINVAL for a non-power of two */
                expect_null(p, EINVAL, errno, "aligned_alloc with a bad alignment");
                break;
            }
            if (!valid) {
                if (p)
                    FZ(free)(p);
                break;
            }
            if (p == NULL)
                fail("aligned_alloc returned NULL", NULL, n);
            adopt(b, p, n, alignment, false);
            break;
        }
        case 7: { /* memalign: any alignment, rounded up to a power of two */
            bool valid;
            size_t alignment = take_alignment(&r, &valid), n = take_size(&r);
            if (b->p)
                release(b);
            if (!room_for(n + 2 * alignment))
                break;
            void *p = FZ(memalign)(alignment, n);
            if (p == NULL)
                fail("memalign returned NULL", NULL, n);
            size_t rounded = 1;
            while (rounded < alignment)
                rounded <<= 1;
            adopt(b, p, n, rounded, false);
            break;
        }
        case 8: { /* valloc */
            size_t n = take_size(&r);
            if (b->p)
                release(b);
            if (!room_for(n + 4096))
                break;
            void *p = FZ(valloc)(n);
            if (p == NULL)
                fail("valloc returned NULL", NULL, n);
            adopt(b, p, n, 4096, false);
            break;
        }
        case 9: { /* pvalloc: usable size at least the request rounded up to pages */
            size_t n = take_size(&r);
            if (b->p)
                release(b);
            if (!room_for(n + 4096))
                break;
            void *p = FZ(pvalloc)(n);
            if (p == NULL)
                fail("pvalloc returned NULL", NULL, n);
            size_t rounded = n ? (n + 4095) & ~(size_t)4095 : 4096;
            adopt(b, p, rounded, 4096, false);
            break;
        }
        case 10: { /* reallocarray */
            size_t count = take8(&r) + 1, n = take_size(&r) / count;
            if (b->p == NULL || !room_for(count * n) || count * n == 0)
                break;
            check_block(b, b->size, "before reallocarray");
            void *p = FZ(reallocarray)(b->p, count, n);
            if (p == NULL)
                fail("reallocarray returned NULL", b, count * n);
            block moved = *b;
            moved.p = p;
            check_block(&moved, count * n < b->size ? count * n : b->size,
                        "after reallocarray (kept prefix)");
            live_bytes -= b->size;
            adopt(b, p, count * n, 1, false);
            break;
        }
        case 11: { /* malloc_usable_size, and a write to its last byte */
            if (b->p == NULL)
                break;
            size_t usable = FZ(malloc_usable_size)(b->p);
            if (usable < b->size)
                fail("malloc_usable_size below the request", b, usable);
            b->p[usable - (usable > 0)] = b->p[usable - (usable > 0)];
            check_block(b, b->size, "after malloc_usable_size");
            break;
        }
        case 12: { /* realloc(p, 0): frees, returns NULL (glibc) */
            if (b->p == NULL)
                break;
            check_block(b, b->size, "before realloc(p, 0)");
            void *p = FZ(realloc)(b->p, 0);
            if (p != NULL)
                fail("realloc(p, 0) did not return NULL", b, (uintptr_t)p);
            live_bytes -= b->size;
            memset(b, 0, sizeof *b);
            break;
        }
        case 13: { /* realloc(NULL, n) is malloc */
            size_t n = take_size(&r);
            if (b->p)
                release(b);
            if (!room_for(n))
                break;
            void *p = FZ(realloc)(NULL, n);
            if (p == NULL)
                fail("realloc(NULL, n) returned NULL", NULL, n);
            adopt(b, p, n, 1, false);
            break;
        }
        case 14: { /* overflowing sizes: NULL with ENOMEM, the old block untouched */
            size_t count = opaque_size(((size_t)1 << 32) + take8(&r));
            size_t n = opaque_size(((size_t)1 << 32) + take8(&r));
            errno = 0;
            void *p = FZ(calloc)(count, n);
            expect_null(p, ENOMEM, errno, "calloc overflow");
            errno = 0;
            p = FZ(malloc)(opaque_size(SIZE_MAX - take8(&r)));
            expect_null(p, ENOMEM, errno, "malloc(SIZE_MAX - k)");
            if (b->p) {
                errno = 0;
                p = FZ(reallocarray)(b->p, count, n);
                expect_null(p, ENOMEM, errno, "reallocarray overflow");
                errno = 0;
                p = FZ(realloc)(b->p, opaque_size(PTRDIFF_MAX));
                expect_null(p, ENOMEM, errno, "realloc(p, PTRDIFF_MAX)");
                check_block(b, b->size, "after failed reallocs");
            }
            break;
        }
        case 15: { /* a burst of small blocks into consecutive slots */
            size_t count = take8(&r) % 32 + 1, n = take8(&r) * 4u;
            unsigned first = (unsigned)(b - table);
            for (size_t i = 0; i < count; i++) {
                block *s = &table[(first + i) % SLOTS];
                if (s->p)
                    release(s);
                void *p = FZ(malloc)(n);
                if (p == NULL)
                    fail("malloc returned NULL (burst)", NULL, n);
                adopt(s, p, n, 1, false);
            }
            break;
        }
        case 16: { /* free a run of slots, newest first */
            size_t count = take8(&r) % 64 + 1;
            unsigned first = (unsigned)(b - table);
            for (size_t i = count; i-- > 0;) {
                block *s = &table[(first + i) % SLOTS];
                if (s->p)
                    release(s);
            }
            break;
        }
        case 17: { /* malloc_trim: give memory back, blocks stay intact */
            if (take8(&r) % 16 != 0)
                break;
            FZ(malloc_trim)(0);
            for (int i = 0; i < SLOTS; i++)
                if (table[i].p)
                    check_block(&table[i], table[i].size, "after malloc_trim");
            break;
        }
        }
        if (tracing && b->p)
            fprintf(stderr, "    slot %d now %p, %zu bytes\n", (int)(b - table), (void *)b->p,
                    b->size);
        if (op_number % CHECK_EVERY == 0 || tracing)
            heap_check("cm_heap_check() failed during the run");
    }
    heap_check("cm_heap_check() failed at the end of the run");
    for (int i = 0; i < SLOTS; i++)
        if (table[i].p)
            release(&table[i]);
    heap_check("cm_heap_check() failed after freeing everything");
#ifndef FUZZ_REPLAY_MAIN
    /* The harness is the prefixed allocator's only user: nothing may be left in use. (Not in
     * the debug mode: CMALLOC_CHECK=1 counts blocks waiting in its quarantine as in use.) */
    const char *check_mode = getenv("CMALLOC_CHECK");
    if (check_mode == NULL || strcmp(check_mode, "1") != 0) {
        cmalloc_stats stats;
        cmalloc_stats_get(&stats);
        if (stats.bytes_in_use != 0)
            fail("bytes in use not zero after freeing everything", NULL, stats.bytes_in_use);
    }
#endif
    if (live_bytes != 0)
        fail("harness bookkeeping: live bytes not zero", NULL, live_bytes);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tracing = getenv("FUZZ_TRACE") != NULL;
    run(data, size);
    return 0;
}

#ifdef FUZZ_REPLAY_MAIN
/* ---- the regression runner: replays files and directories ----------------------------------- */
#include <dirent.h>
#include <sys/stat.h>

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "fuzz replay: cannot open %s\n", path);
        return 1;
    }
    static uint8_t data[1 << 20];
    size_t n = fread(data, 1, sizeof data, f);
    fclose(f);
    LLVMFuzzerTestOneInput(data, n);
    return 0;
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int replay_path(const char *path, int *count)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "fuzz replay: %s: not found\n", path);
        return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
        (*count)++;
        return replay_file(path);
    }
    DIR *dir = opendir(path);
    if (dir == NULL)
        return 1;
    char *names[4096];
    int n = 0, status = 0;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL && n < 4096)
        if (e->d_name[0] != '.')
            names[n++] = strdup(e->d_name);
    closedir(dir);
    qsort(names, (size_t)n, sizeof names[0], compare_names);
    for (int i = 0; i < n; i++) {
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", path, names[i]);
        status |= replay_path(full, count);
        free(names[i]);
    }
    return status;
}

int main(int argc, char **argv)
{
    int status = 0, count = 0;
    if (argc < 2)
        status = replay_path("tests/fuzz_corpus", &count);
    for (int i = 1; i < argc; i++)
        status |= replay_path(argv[i], &count);
    printf("fuzz replay: %d inputs replayed, %s\n", count, status ? "ERRORS" : "all passed");
    return status || count == 0;
}
#endif
