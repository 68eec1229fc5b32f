/* test_no_keys.c - cmalloc when the program has taken every pthread key before the allocator
 * starts (a constructor of priority 100 runs before cmalloc's, which is 101, in this statically
 * linked binary): no thread cache may write a key it does not own, and the caches of exited
 * threads, which no key destructor returns now, must still come back (the orphan sweep).
 *
 *   keys_of_others_untouched   200 threads allocate and check that every key the program
 *                              created still reads NULL in them; after they are joined, at most
 *                              two thread caches are alive and the heap is consistent
 * Runtime: well under a second.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "cmalloc.h"

bool cm_heap_check(void); /* src/internal.h: hidden in the .so, linkable from the .a */

static pthread_key_t keys[PTHREAD_KEYS_MAX];
static size_t key_count;

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wprio-ctor-dtor"
__attribute__((constructor(100))) static void take_every_key(void)
{
    while (key_count < PTHREAD_KEYS_MAX && pthread_key_create(&keys[key_count], NULL) == 0)
        key_count++;
}
#pragma GCC diagnostic pop

static void *allocate_and_look(void *arg)
{
    (void)arg;
    void *blocks[100];
    for (int i = 0; i < 100; i++)
        memset(blocks[i] = malloc(16 + (size_t)i * 40), 1, 16 + (size_t)i * 40);
    for (int i = 0; i < 100; i++)
        free(blocks[i]);
    for (size_t i = 0; i < key_count; i++)
        if (pthread_getspecific(keys[i]) != NULL)
            return (void *)(i + 1);
    return NULL;
}

static void keys_of_others_untouched(void **state)
{
    (void)state;
    pthread_key_t spare;
    if (pthread_key_create(&spare, NULL) == 0)
        fail_msg("a key was left after taking %zu: the test cannot run as meant", key_count);
    for (int i = 0; i < 200; i++) {
        pthread_t thread;
        void *result;
        assert_int_equal(pthread_create(&thread, NULL, allocate_and_look, NULL), 0);
        pthread_join(thread, &result);
        if (result != NULL)
            fail_msg("key %zu of the program was written in a thread", (size_t)result - 1);
    }
    cmalloc_stats stats;
    cmalloc_stats_get(&stats);
    printf("%zu keys taken by the program; after 200 threads: %zu thread caches alive\n", key_count,
           stats.thread_caches);
    if (stats.thread_caches > 2)
        fail_msg("%zu thread caches alive: exited threads' caches leaked", stats.thread_caches);
    assert_true(cm_heap_check());
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(keys_of_others_untouched),
    };
    return cmocka_run_group_tests_name("no_keys", tests, NULL, NULL);
}
