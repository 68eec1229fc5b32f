/* test_check.c - the debug mode (CMALLOC_CHECK=1), with this binary re-executed under it
 * (options are read once, at start).
 *
 *   reports_errors                an overflow past the request (100 B, 300000 B), a double
 *                                 free of a quarantined block, and a write to freed memory
 *                                 abort with the exact report for the block's address
 *   normal_use_works              usable size is the request; realloc, calloc, posix_memalign
 *                                 and 3000 mixed blocks work; cm_heap_check holds
 *   zero_size_and_shrink_in_place malloc(0) has a usable byte; realloc within the usable size
 *                                 keeps the block
 *   shrink_keeps_the_canary       an overflow past the new end of a shrunk block is reported
 *   aligned_blocks_are_checked    posix_memalign, aligned_alloc and memalign at alignments of
 *                                 32 B to 4 MiB: aligned, usable size the request, realloc
 *                                 keeps them; an overflow past one (64 B and 1 MiB aligned)
 *                                 and a double free are reported
 *   sized_frees_are_checked       free_sized told the size requested frees the block (also
 *                                 after calloc, malloc(0) and a realloc that kept it); told
 *                                 another, smaller or larger, it aborts with the report (C++'s
 *                                 sized delete: tests/test_programs.sh)
 *   a_child_may_free_again_the_latest_free_of_a_thread_left_behind
 *                                 in a forked child, a second free of the block another
 *                                 thread freed last is its first there; a third, an earlier
 *                                 block of that thread's, and the forking thread's own are
 *                                 reported; then again, re-executed with every block guarded
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "helpers.h"

void free_sized(void *p, size_t size); /* C23: glibc declares it only from 2.43 */

/* scenario() in a forked child must abort with exactly `format`, its %p the address the
 * child announced. */
static void expect_abort(void (*scenario)(void), const char *format)
{
    child_spec spec = {.body = call_void, .arg = &scenario};
    expect_report(&spec, format);
}

static void overflow_by_one(void)
{
    char *p = malloc(100);
    announce(p);
    p[100] = 'x';
    free(p);
}

static void overflow_large(void)
{
    char *p = malloc(300000);
    announce(p);
    p[300000 + 7] = 'x';
    free(p);
}

static void double_free_small(void)
{
    void *p = malloc(64);
    announce(p);
    free(p);
    void *other = malloc(64); /* the freed block is quarantined, not handed out again */
    free(p);
    free(other);
}

static void write_after_free(void)
{
    char *p = malloc(200);
    announce(p);
    free(p);
    p[50] = 1;
    for (int i = 0; i < 5000; i++) /* push it out of the quarantine */
        free(malloc(200));
}

static void free_sized_smaller(void)
{
    char *p = malloc(100);
    announce(p);
    free_sized(p, 99);
}

static void free_sized_larger(void)
{
    char *p = calloc(3, 40);
    announce(p);
    free_sized(p, 121);
}

static void overflow_aligned(size_t alignment)
{
    char *p = aligned_alloc(alignment, 100);
    announce(p);
    ((volatile char *)p)[100] = 'x';
    free(p);
}
static void overflow_aligned_64(void)
{
    overflow_aligned(64);
}
static void overflow_aligned_1m(void)
{
    overflow_aligned(1 << 20);
}

static void double_free_aligned(void)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, 300) != 0)
        _exit(90);
    announce(p);
    free(p);
    free(p);
}

static void reports_errors(void **state)
{
    (void)state;
    expect_abort(overflow_by_one,
                 "cmalloc: heap buffer overflow past the block at %p (100 bytes requested); "
                 "aborting\n");
    expect_abort(overflow_large,
                 "cmalloc: heap buffer overflow past the block at %p (300000 bytes requested); "
                 "aborting\n");
    expect_abort(double_free_small, "cmalloc: double free %p in free(); aborting\n");
    expect_abort(write_after_free,
                 "cmalloc: write to freed memory at %p (50 bytes into the freed block); "
                 "aborting\n");
}

static void normal_use_works(void **state)
{
    (void)state;
    char *p = malloc(37);
    assert_int_equal(malloc_usable_size(p), 37); /* exactly the request: the rest is canary */
    memset(p, 'a', 37);
    p = realloc(p, 5000);
    assert_non_null(p);
    for (int i = 0; i < 37; i++)
        assert_int_equal(p[i], 'a');
    free(p);
    int *zeros = calloc(1000, sizeof *zeros);
    for (int i = 0; i < 1000; i++)
        assert_int_equal(zeros[i], 0);
    free(zeros);
    void *aligned = NULL;
    assert_int_equal(posix_memalign(&aligned, 4096, 100), 0);
    assert_int_equal((uintptr_t)aligned % 4096, 0);
    free(aligned);
    void *objects[3000];
    for (int i = 0; i < 3000; i++)
        objects[i] = malloc((size_t)(i * 37) % 20000);
    for (int i = 0; i < 3000; i++)
        free(objects[i]);
    assert_true(cm_heap_check());
}

static void aligned_blocks_are_checked(void **state)
{
    (void)state;
    for (size_t a = 32; a <= ((size_t)4 << 20); a *= 2) {
        void *p = NULL;
        assert_int_equal(posix_memalign(&p, a, 100), 0);
        assert_int_equal((uintptr_t)p % a, 0);
        assert_int_equal(malloc_usable_size(p), 100); /* the request: the rest is canary */
        memset(p, 'c', 100);
        assert_ptr_equal(realloc(p, 60), p);
        assert_int_equal(malloc_usable_size(p), 60);
        free(p);
        char *q = aligned_alloc(a, 3 * a);
        assert_int_equal((uintptr_t)q % a, 0);
        memset(q, 'd', 3 * a);
        free(q);
        q = memalign(a, 0);
        assert_true(malloc_usable_size(q) > 0);
        free(q);
    }
    assert_true(cm_heap_check());
    expect_abort(overflow_aligned_64, "cmalloc: heap buffer overflow past the block at %p (100 "
                                      "bytes requested); aborting\n");
    expect_abort(overflow_aligned_1m, "cmalloc: heap buffer overflow past the block at %p (100 "
                                      "bytes requested); aborting\n");
    expect_abort(double_free_aligned, "cmalloc: double free %p in free(); aborting\n");
}

static void sized_frees_are_checked(void **state)
{
    (void)state;
    free_sized(malloc(100), 100);
    free_sized(calloc(3, 40), 120);
    free_sized(malloc(0), 0);
    char *p = malloc(300);
    assert_ptr_equal(realloc(p, 200), p); /* kept: the request is the new size */
    free_sized(p, 200);
    assert_true(cm_heap_check());
    expect_abort(free_sized_smaller, "cmalloc: free_sized(): %p freed with size 99, not the 100 "
                                     "bytes it was allocated with; aborting\n");
    expect_abort(free_sized_larger, "cmalloc: free_sized(): %p freed with size 121, past its "
                                    "block's 120 bytes; aborting\n");
}

/* What programs assert of any malloc, kept in the debug mode: malloc(0) has a positive usable
 * size, and realloc to a size within the usable size keeps the block (with its canary moved
 * to the new end, so an overflow past the new size is still reported). */
static void zero_size_and_shrink_in_place(void **state)
{
    (void)state;
    char *zero = malloc(0);
    assert_non_null(zero);
    assert_true(malloc_usable_size(zero) > 0);
    zero[0] = 'z'; /* the usable byte is writable: free finds the canary intact */
    free(zero);
    char *p = malloc(100);
    memset(p, 'b', 100);
    assert_ptr_equal(realloc(p, 100), p);
    assert_ptr_equal(realloc(p, 60), p);
    assert_int_equal(malloc_usable_size(p), 60);
    for (int i = 0; i < 60; i++)
        assert_int_equal(p[i], 'b');
    assert_ptr_equal(realloc(p, 0 + 1), p);
    free(p);
}

static void overflow_after_shrink(void)
{
    char *p = malloc(100);
    p = realloc(p, 40);
    announce(p);
    p[40] = 'x';
    free(p);
}

static void shrink_keeps_the_canary(void **state)
{
    (void)state;
    expect_abort(overflow_after_shrink,
                 "cmalloc: heap buffer overflow past the block at %p (40 bytes requested); "
                 "aborting\n");
}

/* glibc's child frees again a block another thread's free had just returned from when the
 * fork came (its TLS table not yet cleared: tests/programs/fork_dlopen_tls.c). The debug
 * mode's and the guard's frees note each thread's latest block; in the child a second free of
 * the latest of a thread the fork left behind is its first there, and anything else freed
 * again is a double free as ever: the same block a third time, an earlier block of that
 * thread, and a block the forking thread freed. Run in this mode and, re-executed with
 * "guard", with every block guarded. */
enum { LATEST_SIZE = 100 };
static void *worker_earlier, *worker_latest, *own_freed;
static _Atomic int worker_freed, children_done;

static bool checked_or_guarded(const void *p)
{
    size_t size;
    return cm_option.check ? cm_check_usable_size(p, &size) : cm_guard_owns(p);
}

static void *free_two_and_stay(void *arg)
{
    (void)arg;
    worker_earlier = malloc(LATEST_SIZE);
    worker_latest = malloc(LATEST_SIZE);
    bool kind = checked_or_guarded(worker_earlier) && checked_or_guarded(worker_latest);
    free(worker_earlier);
    free(worker_latest);
    atomic_store(&worker_freed, kind ? 1 : -1);
    while (!atomic_load(&children_done))
        cm_os_yield();
    return NULL;
}

static void free_latest_again(void *third)
{
    free(worker_latest);
    if (third != NULL) {
        announce(worker_latest);
        free(worker_latest);
    }
}

static void free_earlier_again(void)
{
    announce(worker_earlier);
    free(worker_earlier);
}

static void free_own_again(void)
{
    announce(own_freed);
    free(own_freed);
}

static void a_child_may_free_again_the_latest_free_of_a_thread_left_behind(void **state)
{
    (void)state;
    own_freed = malloc(LATEST_SIZE);
    assert_true(checked_or_guarded(own_freed));
    free(own_freed);
    pthread_t thread;
    assert_int_equal(pthread_create(&thread, NULL, free_two_and_stay, NULL), 0);
    while (atomic_load(&worker_freed) == 0)
        cm_os_yield();
    assert_int_equal(atomic_load(&worker_freed), 1); /* the worker's blocks took the mode's path */
    static child_result result;
    child_spec spec = {.body = free_latest_again};
    run_child(&spec, &result);
    char how[96];
    if (!WIFEXITED(result.status) || WEXITSTATUS(result.status) != 0)
        fail_msg("a child's free of the worker's latest freed block: %s\n%s",
                 describe_status(result.status, how, sizeof how), result.output);
    child_spec third = {.body = free_latest_again, .arg = &third};
    expect_report(&third, "cmalloc: double free %p in free(); aborting\n");
    expect_abort(free_earlier_again, "cmalloc: double free %p in free(); aborting\n");
    expect_abort(free_own_again, "cmalloc: double free %p in free(); aborting\n");
    atomic_store(&children_done, 1);
    pthread_join(thread, NULL);
}

int main(int argc, char **argv)
{
    (void)argc;
    if (argc > 1 && strcmp(argv[1], "guard") == 0) {
        const struct CMUnitTest guarded[] = {
            cmocka_unit_test(a_child_may_free_again_the_latest_free_of_a_thread_left_behind),
        };
        return cmocka_run_group_tests_name("guarded", guarded, NULL, NULL);
    }
    const char *mode = getenv("CMALLOC_CHECK");
    if (mode == NULL || strcmp(mode, "1") != 0) {
        exec_self(argv, (const char *[]){"CMALLOC_CHECK=1", NULL});
        perror("test_check: re-exec");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(reports_errors),
        cmocka_unit_test(normal_use_works),
        cmocka_unit_test(zero_size_and_shrink_in_place),
        cmocka_unit_test(shrink_keeps_the_canary),
        cmocka_unit_test(aligned_blocks_are_checked),
        cmocka_unit_test(sized_frees_are_checked),
        cmocka_unit_test(a_child_may_free_again_the_latest_free_of_a_thread_left_behind),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    if (failed != 0)
        return failed;
    /* The guard's path: the same scenario with every block guarded, the debug mode off. */
    exec_self((char *[]){argv[0], "guard", NULL},
              (const char *[]){"CMALLOC_CHECK=0", "CMALLOC_GUARD_RATE=1", NULL});
    perror("test_check: re-exec for the guard");
    return 1;
}
