/* pool_churn.h - one thread's share of the "never strands" churn on a THREAD_SAFE pool, for
 * test_pool.c (cmocka) and stress_pool_tsan.c (ThreadSanitizer): header only, no cmocka.
 *
 * pool_churn(pool, t, batch, cycles): `cycles` times, allocate 1..batch objects (a count that
 * depends on t and the cycle, so threads are out of step), write each its own address, check
 * and free them all. Each thread holds at most `batch` objects, so a FIXED pool of threads *
 * batch objects must never run out. Returns the number of failures (a NULL allocation ends
 * the run; an object that does not hold its address counts one).
 */
#ifndef TESTS_POOL_CHURN_H
#define TESTS_POOL_CHURN_H

#include <stdint.h>
#include <string.h>

#include "cmalloc.h"

#define POOL_CHURN_BATCH_MAX 256

static int pool_churn(cmalloc_pool *pool, unsigned t, int batch, int cycles)
{
    void *mine[POOL_CHURN_BATCH_MAX];
    int failures = 0;
    for (int cycle = 0; cycle < cycles; cycle++) {
        int n = 1 + (int)((t * 31u + (unsigned)cycle * 17u) % (unsigned)batch);
        for (int i = 0; i < n; i++) {
            if ((mine[i] = cmalloc_pool_alloc(pool)) == NULL)
                return failures + 1;
            memcpy(mine[i], &mine[i], sizeof(void *)); /* the object holds its own address */
        }
        for (int i = 0; i < n; i++) {
            void *self;
            memcpy(&self, mine[i], sizeof self);
            failures += self != mine[i];
            cmalloc_pool_free(pool, mine[i]);
        }
    }
    return failures;
}

#endif /* TESTS_POOL_CHURN_H */
