/* test_pool.c - object pools (cmalloc_pool_*): objects are 16-byte aligned, distinct and
 * writable; freed objects are reused; a thread-safe pool survives many threads allocating and
 * freeing each other's objects; destroy returns the slabs; bad arguments fail with EINVAL. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "cmalloc.h"

static void objects_are_aligned_distinct_and_reused(void **state)
{
    (void)state;
    cmalloc_pool *pool = cmalloc_pool_create(40, 0);
    assert_non_null(pool);
    enum { N = 5000 };
    static unsigned char *objects[N];
    for (int i = 0; i < N; i++) {
        objects[i] = cmalloc_pool_alloc(pool);
        assert_non_null(objects[i]);
        assert_int_equal((uintptr_t)objects[i] % 16, 0);
        memset(objects[i], i & 0xff, 40);
    }
    for (int i = 0; i < N; i++) /* no two overlap: every pattern is intact */
        for (int k = 0; k < 40; k++)
            assert_int_equal(objects[i][k], i & 0xff);
    cmalloc_pool_free(pool, objects[17]);
    assert_ptr_equal(cmalloc_pool_alloc(pool), objects[17]);
    cmalloc_pool_free(pool, NULL);
    cmalloc_pool_destroy(pool);
}

static void destroy_returns_the_memory(void **state)
{
    (void)state;
    cmalloc_stats before, during, after;
    cmalloc_stats_get(&before);
    cmalloc_pool *pool = cmalloc_pool_create(1000, 0);
    for (int i = 0; i < 10000; i++)
        assert_non_null(cmalloc_pool_alloc(pool));
    cmalloc_stats_get(&during);
    assert_true(during.bytes_in_use >= before.bytes_in_use + 10000 * 1000);
    cmalloc_pool_destroy(pool);
    cmalloc_stats_get(&after);
    assert_true(after.bytes_in_use + 10000 * 1000 <= during.bytes_in_use);
}

static void bad_arguments(void **state)
{
    (void)state;
    errno = 0;
    assert_null(cmalloc_pool_create(0, 0));
    assert_int_equal(errno, EINVAL);
    errno = 0;
    assert_null(cmalloc_pool_create(64, 0x80));
    assert_int_equal(errno, EINVAL);
    errno = 0;
    assert_null(cmalloc_pool_create((size_t)1 << 40, 0));
    assert_int_equal(errno, EINVAL);
}

enum { THREADS = 4, PER_THREAD = 20000 };
static cmalloc_pool *shared;
static void *handed[THREADS][PER_THREAD];

static void *fill(void *arg)
{
    uintptr_t t = (uintptr_t)arg;
    for (int i = 0; i < PER_THREAD; i++) {
        handed[t][i] = cmalloc_pool_alloc(shared);
        if (handed[t][i] == NULL)
            return (void *)1;
        memcpy(handed[t][i], &handed[t][i], sizeof(void *)); /* each object names itself */
    }
    return NULL;
}

static void *drain_neighbour(void *arg)
{
    uintptr_t t = ((uintptr_t)arg + 1) % THREADS; /* free another thread's objects */
    for (int i = 0; i < PER_THREAD; i++) {
        void *self;
        memcpy(&self, handed[t][i], sizeof self);
        if (self != handed[t][i])
            return (void *)1;
        cmalloc_pool_free(shared, handed[t][i]);
    }
    return NULL;
}

static void run_threads(void *(*body)(void *))
{
    pthread_t threads[THREADS];
    for (uintptr_t t = 0; t < THREADS; t++)
        assert_int_equal(pthread_create(&threads[t], NULL, body, (void *)t), 0);
    for (int t = 0; t < THREADS; t++) {
        void *failed;
        pthread_join(threads[t], &failed);
        assert_null(failed);
    }
}

static void thread_safe_pool_across_threads(void **state)
{
    (void)state;
    shared = cmalloc_pool_create(24, CMALLOC_POOL_THREAD_SAFE);
    assert_non_null(shared);
    for (int round = 0; round < 3; round++) {
        run_threads(fill);
        run_threads(drain_neighbour);
    }
    cmalloc_pool_destroy(shared);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(objects_are_aligned_distinct_and_reused),
        cmocka_unit_test(destroy_returns_the_memory),
        cmocka_unit_test(bad_arguments),
        cmocka_unit_test(thread_safe_pool_across_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
