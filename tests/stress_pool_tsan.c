/* stress_pool_tsan.c - THREAD_SAFE pools under ThreadSanitizer (make sanitize-tsan-pool, part of
 * make sanitize): the lock-free free path, the partial-chunk stack and the allocator leaving a
 * chunk while others free into it, in the allocator's TSan build (-DCM_PREFIX=cmtsan_, so
 * TSan keeps its own malloc; the pool API keeps its names).
 *
 *   churn              4 threads allocate and free batches at once on a FIXED pool exactly as
 *                      large as they can hold together (no allocation may fail), then on a
 *                      GROW pool
 *   producer/consumer  one thread allocates, another frees every object (through a queue
 *                      under a mutex: only the pool's own synchronization is on trial)
 * Exit status 0 when every check held; TSan reports make the run fail (exitcode=66).
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cmalloc.h"
#include "pool_churn.h"

bool cm_pool_valid(const cmalloc_pool *pool); /* src/internal.h: hidden, linkable */

enum { THREADS = 4, BATCH = 100, CYCLES = 300, MESSAGES = 100000, QUEUE = 256 };

static cmalloc_pool *pool;
static _Atomic int failures;

static void *churn(void *arg)
{
    failures += pool_churn(pool, (unsigned)(uintptr_t)arg, BATCH, CYCLES);
    return NULL;
}

static void *queue[QUEUE];
static int head, tail;
static pthread_mutex_t queue_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t queue_moved = PTHREAD_COND_INITIALIZER;

static void *producer(void *arg)
{
    (void)arg;
    for (int i = 0; i < MESSAGES; i++) {
        int *message = cmalloc_pool_alloc(pool);
        if (message == NULL) { /* FIXED, QUEUE + 2 objects: never full */
            failures++;
            return NULL;
        }
        *message = i;
        pthread_mutex_lock(&queue_lock);
        while (head - tail == QUEUE)
            pthread_cond_wait(&queue_moved, &queue_lock);
        queue[head++ % QUEUE] = message;
        pthread_cond_broadcast(&queue_moved);
        pthread_mutex_unlock(&queue_lock);
    }
    return NULL;
}

static void *consumer(void *arg)
{
    (void)arg;
    for (int i = 0; i < MESSAGES; i++) {
        pthread_mutex_lock(&queue_lock);
        while (head == tail)
            pthread_cond_wait(&queue_moved, &queue_lock);
        int *message = queue[tail++ % QUEUE];
        pthread_cond_broadcast(&queue_moved);
        pthread_mutex_unlock(&queue_lock);
        failures += *message != i;
        cmalloc_pool_free(pool, message);
    }
    return NULL;
}

static void run(const char *what, void *(*bodies[])(void *), int count)
{
    pthread_t threads[THREADS];
    for (int t = 0; t < count; t++)
        pthread_create(&threads[t], NULL, bodies[t], (void *)(uintptr_t)t);
    for (int t = 0; t < count; t++)
        pthread_join(threads[t], NULL);
    bool ok = failures == 0 && cmalloc_pool_in_use(pool) == 0 && cm_pool_valid(pool);
    printf("stress_pool_tsan: %-28s %s\n", what, ok ? "ok" : "FAILED");
    if (!ok)
        failures++;
    cmalloc_pool_destroy(pool);
}

int main(void)
{
    void *(*churners[])(void *) = {churn, churn, churn, churn};
    void *(*pipeline[])(void *) = {producer, consumer};
    pool =
        cmalloc_pool_create(1000, THREADS * BATCH, CMALLOC_POOL_FIXED | CMALLOC_POOL_THREAD_SAFE);
    run("churn, FIXED", churners, THREADS);
    pool = cmalloc_pool_create(1000, 0, CMALLOC_POOL_GROW | CMALLOC_POOL_THREAD_SAFE);
    run("churn, GROW", churners, THREADS);
    /* live at most: QUEUE queued, one the consumer is freeing, one the producer is filling */
    pool = cmalloc_pool_create(48, QUEUE + 2, CMALLOC_POOL_FIXED | CMALLOC_POOL_THREAD_SAFE);
    run("producer/consumer, FIXED", pipeline, 2);
    pool = cmalloc_pool_create(48, 0, CMALLOC_POOL_GROW | CMALLOC_POOL_THREAD_SAFE);
    run("producer/consumer, GROW", pipeline, 2);
    return failures ? 1 : 0;
}
