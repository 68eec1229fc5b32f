/* test_check.c - the debug mode (CMALLOC_CHECK=1): overflows past the request, double frees and
 * writes to freed memory are reported with a clear message and abort; normal use still works.
 * The binary re-executes itself with CMALLOC_CHECK=1 because options are read once at start. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "helpers.h"

static void expect_abort(void (*scenario)(void), const char *message)
{
    expect_death(call_void, &scenario, message);
}

static void overflow_by_one(void)
{
    char *p = malloc(100);
    p[100] = 'x';
    free(p);
}

static void overflow_large(void)
{
    char *p = malloc(300000);
    p[300000 + 7] = 'x';
    free(p);
}

static void double_free_small(void)
{
    void *p = malloc(64);
    free(p);
    void *other = malloc(64); /* the freed block is quarantined, not handed out again */
    free(p);
    free(other);
}

static void write_after_free(void)
{
    char *p = malloc(200);
    free(p);
    p[50] = 1;
    for (int i = 0; i < 5000; i++) /* push it out of the quarantine */
        free(malloc(200));
}

static void reports_errors(void **state)
{
    (void)state;
    expect_abort(overflow_by_one, "cmalloc: heap buffer overflow past the block at 0x");
    expect_abort(overflow_large, "cmalloc: heap buffer overflow past the block at 0x");
    expect_abort(double_free_small, "cmalloc: double free 0x");
    expect_abort(write_after_free, "cmalloc: write to freed memory at 0x");
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
    p[40] = 'x';
    free(p);
}

static void shrink_keeps_the_canary(void **state)
{
    (void)state;
    expect_abort(overflow_after_shrink, "heap buffer overflow past the block at");
}

int main(int argc, char **argv)
{
    (void)argc;
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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
