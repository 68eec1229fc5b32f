/* test_errors.c - what cmalloc does with a buggy program's frees, black box.
 *
 * Linked with build/libcmalloc.a by the Makefile, so cmalloc serves every call here.
 *
 * Death tests: each bad call runs in a forked child whose stderr goes into a pipe. The child
 * first writes the address it is about to misuse ("address 0x..."), then makes the bad call;
 * the parent checks that the child was killed by SIGABRT (not SIGSEGV, not a clean exit) and
 * that stderr holds cmalloc's report for exactly that address:
 *
 *   test_free_stack_address         free(&local)                 free(): invalid pointer
 *   test_free_foreign_mapping       free() of a page from mmap   free(): invalid pointer
 *   test_free_middle_of_small       free(p + 48), p = malloc(100) free(): invalid pointer
 *   test_free_inside_large          free(p + 16), p = malloc(1 MiB)   (a page-heap span)
 *   test_free_inside_huge           free(p + 16), p = malloc(32 MiB)  (its own mmap)
 *   test_double_free_small          free(p); free(p)             double free ... in free()
 *   test_double_free_large          free(p); free(p), 1 MiB      double free ... in free()
 *   test_double_free_huge           free(p); free(p), 32 MiB     double free ... in free()
 *   test_double_free_large_merged   1 MiB blocks a, b neighbours: free(a); free(b); free(b)
 *                                   (b merged into a's free span)  double free ... in free()
 *   test_double_free_not_at_head    free(a); free(b); free(a)    double free ... in free()
 *   test_double_free_deep           a freed, then 1000 more of its class (a deep in the list)
 *   test_double_free_flushed        a freed, then 20000 more (a flushed to the central cache)
 *   test_double_free_other_thread   a freed by a thread that keeps running (a in its cache)
 *                                   all four: double free ... in free() (the free mark)
 *   test_free_past_span_end         p = malloc(48): free of p's page + 8160, the slot past
 *                                   the 170 objects of a one-page 48-byte span: invalid pointer
 *   test_realloc_invalid            realloc(&local, 64)          realloc(): invalid pointer
 *   test_realloc_middle_of_small    realloc(p + 48, 64), p = malloc(100)   the same
 *   test_realloc_freed_small        free(p); realloc(p, 40), p = malloc(48): double free ... in
 *                                   realloc() (a size p's block holds, which would keep it)
 *   test_usable_size_invalid        malloc_usable_size(p + 16)   malloc_usable_size(): ...
 *   test_free_sized_too_large       free_sized(p, 4096), p = malloc(100): free_sized(): p freed
 *                                   with size 4096, past its block's 112 bytes
 *   test_free_sized_large_block     free_sized(p, 2 MiB), p = malloc(1 MiB): the same
 *   test_free_aligned_sized_odd     free_aligned_sized(p, 48, 100): alignment 48, not a power
 *                                   of two
 *   test_free_aligned_sized_lacking free_aligned_sized(p, 64, 48), p = malloc(48) not 64-aligned:
 *                                   alignment 64, which it does not have
 *   test_free_sized_twice           free_sized(p, 48) twice      double free ... in free_sized()
 *   test_free_sized_invalid         free_sized(p + 48, 10)       free_sized(): invalid pointer
 * and, in a copy of this binary re-executed with CMALLOC_CHECK=1 (`--run NAME`):
 *   test_check_double_free_not_at_head  free(a); free(b); free(a)  double free ...
 *   test_check_overrun_canary       p = malloc(40); p[40] = 'x'; free(p)
 *                                   heap buffer overflow past the block at ...
 *
 * Keep-going mode: test_keep_going re-executes this binary (/proc/self/exe --keep-going) with
 * CMALLOC_ABORT_ON_ERROR=0 in its environment (helpers.h, run_child: options are read once,
 * when the allocator starts). The
 * child makes every bad call above, checks each is reported and survived (realloc returns NULL
 * with ENOMEM, malloc_usable_size returns 0), that a reported double free does not hand the
 * same block out twice, that allocation still works, and that cm_heap_check() holds; it exits
 * 0 when all is well and the parent also checks the reports on its stderr.
 *
 * Runtime: well under a second.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "cmalloc.h"
#include "helpers.h"

bool cm_heap_check(void); /* src/internal.h: hidden in the .so, linkable from the .a */

/* ---- the death-test harness (helpers.h: run_child, announce, expect_report) ----------------- */

/* The bad call body(), in a forked child. */
static void expect_death_at(void (*body)(void), const char *format)
{
    child_spec spec = {.body = call_void, .arg = &body};
    expect_report(&spec, format);
}

/* ---- the bad calls (each runs in a child) ----------------------------------------------- */

static void free_stack_address(void)
{
    char local[64];
    memset(local, 1, sizeof local);
    void *p = opaque(local + 16);
    announce(p);
    free(p);
}

static void free_foreign_mapping(void)
{
    char *page = mmap(NULL, 64 * KiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED)
        _exit(91);
    void *p = opaque(page + 4096);
    announce(p);
    free(p);
}

static void free_middle_of_small(void)
{
    char *object = malloc(100);
    memset(object, 2, 100);
    void *p = opaque(object + 48);
    announce(p);
    free(p);
}

static void free_inside(size_t size)
{
    char *block = malloc(size);
    if (block == NULL)
        _exit(92);
    memset(block, 3, 4096);
    void *p = opaque(block + 16);
    announce(p);
    free(p);
}

static void free_inside_large(void)
{
    free_inside(1 * MiB);
}
static void free_inside_huge(void)
{
    free_inside(32 * MiB);
}

static void double_free_small(void)
{
    void *p = opaque(malloc(48));
    memset(p, 4, 48);
    announce(p);
    free(p);
    free(opaque(p));
}

static void double_free_large(void)
{
    void *p = opaque(malloc(1 * MiB));
    memset(p, 5, 4096);
    announce(p);
    free(p);
    free(opaque(p));
}

/* Frees a, then count other blocks of its class, then a again. */
static void double_free_after(size_t count)
{
    void *a = opaque(malloc(48));
    void **others = calloc(count, sizeof *others);
    for (size_t i = 0; i < count; i++)
        others[i] = opaque(malloc(48));
    announce(a);
    free(a);
    for (size_t i = 0; i < count; i++)
        free(others[i]);
    free(opaque(a));
}

static void double_free_deep(void)
{
    double_free_after(1000);
}
static void double_free_flushed(void)
{
    double_free_after(20000);
}

static volatile int other_thread_freed;

static void *free_and_stay(void *p)
{
    free(p);
    __atomic_store_n(&other_thread_freed, 1, __ATOMIC_RELEASE);
    pause(); /* keeps its cache, with p on it, alive until the process dies */
    return NULL;
}

static void double_free_other_thread(void)
{
    void *a = opaque(malloc(48));
    announce(a);
    pthread_t thread;
    if (pthread_create(&thread, NULL, free_and_stay, a) != 0)
        _exit(93);
    while (!__atomic_load_n(&other_thread_freed, __ATOMIC_ACQUIRE))
        usleep(1000);
    free(opaque(a));
}

static void free_past_span_end(void)
{
    char *object = malloc(48);
    char *page = (char *)((uintptr_t)object & ~(uintptr_t)8191); /* a one-page span */
    void *p = opaque(page + 8160); /* 170 * 48: past the last whole object */
    announce(p);
    free(p);
    /* Accepted, the slot would be handed out, running 16 bytes past the span. */
    for (int i = 0; i < 400; i++)
        memset(malloc(48), 7, 48);
}

static void realloc_invalid(void)
{
    char local[64];
    memset(local, 6, sizeof local);
    void *p = opaque(local);
    announce(p);
    void *q = realloc(p, 64);
    opaque(q);
}

static void realloc_middle_of_small(void)
{
    char *block = malloc(100);
    void *p = opaque(block + 48);
    announce(p);
    void *q = realloc(p, 64);
    opaque(q);
}

static void realloc_freed_small(void)
{
    char *p = opaque(malloc(48));
    announce(p);
    free(p);
    void *q = realloc(opaque(p), 40);
    opaque(q);
}

static void usable_size_invalid(void)
{
    char *block = malloc(1 * MiB);
    void *p = opaque(block + 16);
    announce(p);
    size_t n = malloc_usable_size(p);
    opaque((void *)n);
}

/* C23's sized frees: glibc declares (and has) them only from 2.43, cmalloc exports them. */
void free_sized(void *ptr, size_t size);
void free_aligned_sized(void *ptr, size_t alignment, size_t size);

static void free_sized_too_large(void)
{
    void *p = opaque(malloc(100));
    announce(p);
    free_sized(p, 4096);
}

static void free_sized_large_block(void)
{
    void *p = opaque(malloc(1 * MiB));
    announce(p);
    free_sized(p, 2 * MiB);
}

static void free_aligned_sized_odd(void)
{
    void *p = opaque(malloc(100));
    announce(p);
    free_aligned_sized(p, 48, 100);
}

/* A 48-byte block that is not 64-byte aligned: of two neighbours in a span of 48-byte objects,
 * one is not. */
static void *block_off_64(void)
{
    void *p = opaque(malloc(48));
    return ((uintptr_t)p & 63) != 0 ? p : opaque(malloc(48));
}

static void free_aligned_sized_lacking(void)
{
    void *p = block_off_64();
    announce(p);
    free_aligned_sized(p, 64, 48);
}

static void free_sized_twice(void)
{
    void *p = opaque(malloc(48));
    announce(p);
    free_sized(p, 48);
    free_sized(opaque(p), 48);
}

static void free_sized_invalid(void)
{
    char *block = malloc(100);
    void *p = opaque(block + 48);
    announce(p);
    free_sized(p, 10);
}

static void double_free_not_at_head(void)
{
    void *a = opaque(malloc(48)), *b = opaque(malloc(48));
    announce(a);
    free(a);
    free(b);
    free(opaque(a)); /* a is on the thread cache's list, but not at its head */
    /* Undetected, the list now holds a twice: two mallocs hand out the same block. */
    void *x = malloc(48), *y = malloc(48), *z = malloc(48);
    opaque(x), opaque(y), opaque(z);
}

static void double_free_huge(void)
{
    void *p = opaque(malloc(32 * MiB));
    announce(p);
    free(p);
    free(opaque(p));
}

static void double_free_large_merged(void)
{
    /* Two neighbouring page-heap blocks: freeing a then b merges b into a's free span, and b's
     * first page stops mapping to any span. Which 1 MiB blocks end up neighbours depends on
     * the heap's history: allocate a few and pick a pair. */
    enum { BLOCKS = 8 };
    char *blocks[BLOCKS], *a = NULL, *b = NULL;
    for (int i = 0; i < BLOCKS; i++)
        blocks[i] = opaque(malloc(1 * MiB));
    for (int i = 0; i < BLOCKS && b == NULL; i++)
        for (int j = 0; j < BLOCKS; j++)
            if (blocks[j] == blocks[i] + 1 * MiB) {
                a = blocks[i];
                b = blocks[j];
                break;
            }
    if (b == NULL) { /* cannot show it; say so */
        static const char text[] = "double_free_large_merged: no adjacent blocks\n";
        if (write(2, text, sizeof text - 1) < 0)
            _exit(93);
        _exit(94);
    }
    announce(b);
    free(a);
    free(b);
    free(opaque(b));
}

static void overrun_canary(void)
{
    char *p = opaque(malloc(40));
    announce(p);
    p[40] = 'x'; /* one past the request, inside the 48-byte class: only a canary sees it */
    free(p);
}

/* ---- cmocka tests -------------------------------------------------------------------------- */

static void test_free_stack_address(void **state)
{
    (void)state;
    expect_death_at(free_stack_address, "cmalloc: free(): invalid pointer %p");
}

static void test_free_foreign_mapping(void **state)
{
    (void)state;
    expect_death_at(free_foreign_mapping, "cmalloc: free(): invalid pointer %p");
}

static void test_free_middle_of_small(void **state)
{
    (void)state;
    expect_death_at(free_middle_of_small, "cmalloc: free(): invalid pointer %p");
}

static void test_free_inside_large(void **state)
{
    (void)state;
    expect_death_at(free_inside_large, "cmalloc: free(): invalid pointer %p");
}

static void test_free_inside_huge(void **state)
{
    (void)state;
    expect_death_at(free_inside_huge, "cmalloc: free(): invalid pointer %p");
}

static void test_double_free_small(void **state)
{
    (void)state;
    expect_death_at(double_free_small, "cmalloc: double free %p in free()");
}

static void test_double_free_large(void **state)
{
    (void)state;
    expect_death_at(double_free_large, "cmalloc: double free %p in free()");
}

static void test_double_free_huge(void **state)
{
    (void)state;
    expect_death_at(double_free_huge, "cmalloc: double free %p in free()");
}

static void test_double_free_large_merged(void **state)
{
    (void)state;
    expect_death_at(double_free_large_merged, "cmalloc: double free %p in free()");
}

static void test_double_free_not_at_head(void **state)
{
    (void)state;
    expect_death_at(double_free_not_at_head, "cmalloc: double free %p in free()");
}

static void test_double_free_deep(void **state)
{
    (void)state;
    expect_death_at(double_free_deep, "cmalloc: double free %p in free()");
}

static void test_double_free_flushed(void **state)
{
    (void)state;
    expect_death_at(double_free_flushed, "cmalloc: double free %p in free()");
}

static void test_double_free_other_thread(void **state)
{
    (void)state;
    expect_death_at(double_free_other_thread, "cmalloc: double free %p in free()");
}

static void test_free_past_span_end(void **state)
{
    (void)state;
    expect_death_at(free_past_span_end, "cmalloc: free(): invalid pointer %p");
}

static void test_realloc_invalid(void **state)
{
    (void)state;
    expect_death_at(realloc_invalid, "cmalloc: realloc(): invalid pointer %p");
}

static void test_realloc_middle_of_small(void **state)
{
    (void)state;
    expect_death_at(realloc_middle_of_small, "cmalloc: realloc(): invalid pointer %p");
}

static void test_realloc_freed_small(void **state)
{
    (void)state;
    expect_death_at(realloc_freed_small, "cmalloc: double free %p in realloc()");
}

static void test_usable_size_invalid(void **state)
{
    (void)state;
    expect_death_at(usable_size_invalid, "cmalloc: malloc_usable_size(): invalid pointer %p");
}

static void test_free_sized_too_large(void **state)
{
    (void)state;
    expect_death_at(free_sized_too_large,
                    "cmalloc: free_sized(): %p freed with size 4096, past its block's 112 bytes");
}

static void test_free_sized_large_block(void **state)
{
    (void)state;
    expect_death_at(free_sized_large_block,
                    "cmalloc: free_sized(): %p freed with size 2097152, past its block's "
                    "1048576 bytes");
}

static void test_free_aligned_sized_odd(void **state)
{
    (void)state;
    expect_death_at(free_aligned_sized_odd, "cmalloc: free_aligned_sized(): %p freed with "
                                            "alignment 48, not a power of two");
}

static void test_free_aligned_sized_lacking(void **state)
{
    (void)state;
    expect_death_at(free_aligned_sized_lacking,
                    "cmalloc: free_aligned_sized(): %p freed with alignment 64, which it does not "
                    "have");
}

static void test_free_sized_twice(void **state)
{
    (void)state;
    expect_death_at(free_sized_twice, "cmalloc: double free %p in free_sized()");
}

static void test_free_sized_invalid(void **state)
{
    (void)state;
    expect_death_at(free_sized_invalid, "cmalloc: free_sized(): invalid pointer %p");
}

/* ---- keep-going mode (runs in the re-executed child) ---------------------------------------
 * Writes "ok <what>" or "FAIL <what>" lines to stdout; exits 0 only when all is well. */

static int keep_going_failures;

static void check(bool ok, const char *what)
{
    if (ok)
        return;
    printf("FAIL %s\n", what);
    fflush(stdout);
    keep_going_failures++;
}

static void fill(void *p, size_t n, unsigned char tag)
{
    memset(p, tag, n);
}

static bool filled(const void *p, size_t n, unsigned char tag)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != tag)
            return false;
    return true;
}

static int keep_going_main(void)
{
    /* Live objects of every kind, to be found intact after the bad calls. */
    enum { KEEP = 64 };
    static const size_t sizes[] = {16, 100, 4096, 300 * KiB, 1 * MiB, 20 * MiB};
    enum { KINDS = sizeof sizes / sizeof sizes[0] };
    void *keep[KEEP];
    for (int i = 0; i < KEEP; i++) {
        keep[i] = malloc(sizes[i % KINDS]);
        check(keep[i] != NULL, "setup malloc");
        fill(keep[i], sizes[i % KINDS] < 8192 ? sizes[i % KINDS] : 8192, (unsigned char)(i + 1));
    }
    char local[64];
    memset(local, 7, sizeof local);

    /* free of a stack address, a foreign mapping, the middle of objects */
    free(opaque(local + 16));
    char *page = mmap(NULL, 64 * KiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    check(page != MAP_FAILED, "mmap a foreign page");
    page[0] = 1;
    free(opaque(page + 4096));
    check(page[0] == 1, "foreign page untouched after free()");
    char *small = malloc(100), *large = malloc(1 * MiB), *huge = malloc(32 * MiB);
    check(small && large && huge, "malloc small, large, huge");
    fill(small, 100, 0xa1);
    fill(large, 1 * MiB, 0xa2);
    fill(huge, 4096, 0xa3);
    free(opaque(small + 48));
    free(opaque(large + 16));
    free(opaque(huge + 16));
    /* The blocks whose interior was "freed" are leaked, never reused: still intact. */
    check(filled(small, 100, 0xa1), "small object intact after free(p + 48)");
    check(filled(large, 1 * MiB, 0xa2), "1 MiB block intact after free(p + 16)");
    check(filled(huge, 4096, 0xa3), "32 MiB block intact after free(p + 16)");
    check(malloc_usable_size(small) >= 100 && malloc_usable_size(large) >= 1 * MiB,
          "usable size of the blocks still right");

    /* realloc and malloc_usable_size of invalid pointers */
    errno = 0;
    void *r = realloc(opaque(local), 64);
    check(r == NULL && errno == ENOMEM, "realloc(invalid) returns NULL with ENOMEM");
    check(malloc_usable_size(opaque(large + 16)) == 0, "malloc_usable_size(invalid) == 0");
    check(filled(local + 16, 48, 7), "stack buffer untouched");

    /* double free of a small object: reported, and the block is not handed out twice */
    char *twice = malloc(48);
    free(twice);
    free(opaque(twice));
    char *x = malloc(48), *y = malloc(48);
    check(x != NULL && y != NULL && x != y, "after a small double free, two mallocs differ");
    fill(x, 48, 0xb1);
    fill(y, 48, 0xb2);
    check(filled(x, 48, 0xb1), "and do not overlap");
    free(x);
    free(y);

    /* realloc of a freed small object: reported, NULL with ENOMEM, and not handed out twice */
    char *gone = malloc(48);
    free(gone);
    errno = 0;
    r = realloc(opaque(gone), 40);
    check(r == NULL && errno == ENOMEM, "realloc(freed) returns NULL with ENOMEM");
    x = malloc(48), y = malloc(48);
    check(x != NULL && y != NULL && x != y, "after a realloc of a freed block, two mallocs differ");
    free(x);
    free(y);

    /* double free of a 1 MiB block */
    char *big_twice = malloc(1 * MiB);
    free(big_twice);
    free(opaque(big_twice));
    char *bx = malloc(1 * MiB), *by = malloc(1 * MiB);
    check(bx != NULL && by != NULL && bx != by, "after a 1 MiB double free, two mallocs differ");
    fill(bx, 1 * MiB, 0xc1);
    fill(by, 1 * MiB, 0xc2);
    check(filled(bx, 1 * MiB, 0xc1), "and do not overlap");
    free(bx);
    free(by);

    /* sized frees that do not fit their block: reported, and the block kept (not reused) */
    char *sized = malloc(100);
    fill(sized, 100, 0xe1);
    free_sized(opaque(sized), 4096);
    free_aligned_sized(opaque(sized), 48, 100);
    x = malloc(100);
    check(x != NULL && x != sized, "a block refused by free_sized is not handed out");
    check(filled(sized, 100, 0xe1), "a block refused by free_sized is intact");
    free(x);
    free_sized(sized, 100);

    /* the program's own objects are intact and the heap is consistent */
    bool intact = true;
    for (int i = 0; i < KEEP; i++)
        intact &= filled(keep[i], sizes[i % KINDS] < 8192 ? sizes[i % KINDS] : 8192,
                         (unsigned char)(i + 1));
    check(intact, "earlier objects intact");
    check(cm_heap_check(), "cm_heap_check() after the bad calls");

    /* and allocation still works, everywhere */
    for (int round = 0; round < 1000; round++) {
        size_t n = (size_t)(round * 37 % 5000) + 1;
        char *p = malloc(n);
        if (p == NULL) {
            check(false, "malloc after the bad calls");
            break;
        }
        fill(p, n, 0xd0);
        free(p);
    }
    for (int i = 0; i < KEEP; i++)
        free(keep[i]);
    munmap(page, 64 * KiB);
    check(cm_heap_check(), "cm_heap_check() at the end");
    printf("keep-going: %d failures\n", keep_going_failures);
    return keep_going_failures == 0 ? 0 : 1;
}

static void test_keep_going(void **state)
{
    (void)state;
    static child_result result;
    child_spec spec = {.self_args = (char *[]){"test_errors", "--keep-going", NULL},
                       .env = {"CMALLOC_ABORT_ON_ERROR=0"},
                       .with_stdout = true,
                       .alarm_seconds = 30};
    run_child(&spec, &result);
    const char *output = result.output;
    char how[96];
    if (!(WIFEXITED(result.status) && WEXITSTATUS(result.status) == 0))
        fail_msg("keep-going child %s; its output:\n%s",
                 describe_status(result.status, how, sizeof how), output);
    static const char *const reports[] = {
        "cmalloc: free(): invalid pointer 0x",
        "cmalloc: realloc(): invalid pointer 0x",
        "cmalloc: malloc_usable_size(): invalid pointer 0x",
        "cmalloc: double free 0x",
        "cmalloc: free_sized(): 0x",
        "cmalloc: free_aligned_sized(): 0x",
        "; leaking it and going on",
    };
    for (size_t i = 0; i < sizeof reports / sizeof reports[0]; i++)
        if (strstr(output, reports[i]) == NULL)
            fail_msg("keep-going child's output lacks \"%s\":\n%s", reports[i], output);
    /* Count the reports: 5 invalid frees + realloc + usable size + 2 double frees + realloc of
     * a freed block + 2 sized frees (the child's own lines on stdout never say "cmalloc: "). */
    int count = 0;
    for (const char *s = output; (s = strstr(s, "cmalloc: ")) != NULL; s++)
        count++;
    if (count != 12)
        fail_msg("expected 12 reports from the keep-going child, got %d:\n%s", count, output);
}

/* ---- check mode: death tests in a copy re-executed with CMALLOC_CHECK=1 ------------------ */

typedef struct reexec_check {
    const char *name; /* the child runs `test_errors --run NAME` */
    void (*body)(void);
    const char *format;
} reexec_check;

static const reexec_check check_mode[] = {
    {"check_double_free_not_at_head", double_free_not_at_head, "cmalloc: double free %p"},
    {"check_overrun_canary", overrun_canary, "cmalloc: heap buffer overflow past the block at %p"},
};
enum { CHECK_MODE = sizeof check_mode / sizeof check_mode[0] };

static void expect_death_with_check(const reexec_check *c)
{
    child_spec spec = {.self_args = (char *[]){"test_errors", "--run", (char *)c->name, NULL},
                       .env = {"CMALLOC_CHECK=1"}};
    expect_report(&spec, c->format);
}

static void test_check_double_free_not_at_head(void **state)
{
    (void)state;
    expect_death_with_check(&check_mode[0]);
}

static void test_check_overrun_canary(void **state)
{
    (void)state;
    expect_death_with_check(&check_mode[1]);
}

/* --run NAME: the body of a check-mode test, in the re-executed copy. */
static int run_main(const char *name)
{
    for (int i = 0; i < CHECK_MODE; i++)
        if (strcmp(check_mode[i].name, name) == 0) {
            check_mode[i].body();
            return 0;
        }
    return 2;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--keep-going") == 0)
        return keep_going_main();
    if (argc > 2 && strcmp(argv[1], "--run") == 0)
        return run_main(argv[2]);
    start_watchdog("test_errors", 120);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_free_stack_address),
        cmocka_unit_test(test_free_foreign_mapping),
        cmocka_unit_test(test_free_middle_of_small),
        cmocka_unit_test(test_free_inside_large),
        cmocka_unit_test(test_free_inside_huge),
        cmocka_unit_test(test_double_free_small),
        cmocka_unit_test(test_double_free_large),
        cmocka_unit_test(test_double_free_huge),
        cmocka_unit_test(test_double_free_large_merged),
        cmocka_unit_test(test_double_free_not_at_head),
        cmocka_unit_test(test_double_free_deep),
        cmocka_unit_test(test_double_free_flushed),
        cmocka_unit_test(test_double_free_other_thread),
        cmocka_unit_test(test_free_past_span_end),
        cmocka_unit_test(test_realloc_invalid),
        cmocka_unit_test(test_realloc_middle_of_small),
        cmocka_unit_test(test_realloc_freed_small),
        cmocka_unit_test(test_usable_size_invalid),
        cmocka_unit_test(test_free_sized_too_large),
        cmocka_unit_test(test_free_sized_large_block),
        cmocka_unit_test(test_free_aligned_sized_odd),
        cmocka_unit_test(test_free_aligned_sized_lacking),
        cmocka_unit_test(test_free_sized_twice),
        cmocka_unit_test(test_free_sized_invalid),
        cmocka_unit_test(test_keep_going),
        cmocka_unit_test(test_check_double_free_not_at_head),
        cmocka_unit_test(test_check_overrun_canary),
    };
    return cmocka_run_group_tests_name("errors", tests, NULL, NULL);
}
