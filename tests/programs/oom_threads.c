/* oom_threads.c - out of address space with many threads, under LD_PRELOAD. 12 threads are
 * started, then RLIMIT_AS is lowered to 64 MiB above what the process has mapped; the threads
 * allocate mixed sizes (16 B - 2 MiB) until each has seen 50 failures, checking every failure
 * is NULL with errno ENOMEM and their live blocks keep their contents; meanwhile main starts
 * short-lived threads (pthread_create may fail with EAGAIN; those that start allocate their
 * first blocks - a new thread cache - under the limit). The limit is lifted and every thread
 * allocates again, then the process exits with 4 threads still allocating. Exit 0; "FAIL ..."
 * and exit 1 on a wrong result; a hang ends with status 124 (watchdog), a crash with a signal.
 */
#define _GNU_SOURCE
#include "../watchdog.h"
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

enum { THREADS = 12, SLOTS = 200 };
static atomic_int phase; /* 0: wait, 1: limited, 2: lifted */
static atomic_int limited_done, failures, after_ok;

static void fail(const char *what)
{
    if (atomic_fetch_add(&failures, 1) < 10)
        printf("FAIL %s\n", what);
}

static size_t vm_size(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    size_t pages = 0;
    if (f) {
        if (fscanf(f, "%zu", &pages) != 1)
            pages = 0;
        fclose(f);
    }
    return pages * 4096;
}

static void *hog(void *arg)
{
    unsigned seed = (unsigned)(size_t)arg;
    unsigned char *held[SLOTS] = {0};
    size_t sizes[SLOTS] = {0};
    while (atomic_load(&phase) == 0)
        sched_yield();
    int failed = 0;
    while (failed < 50) {
        int i = (int)(rand_r(&seed) % SLOTS);
        if (held[i]) {
            if (held[i][0] != (unsigned char)i || held[i][sizes[i] - 1] != (unsigned char)i)
                fail("a live block changed");
            if (rand_r(&seed) % 3 == 0) {
                free(held[i]);
                held[i] = NULL;
            }
            continue;
        }
        size_t size = 16 + (size_t)(rand_r(&seed) % 4000);
        if (rand_r(&seed) % 8 == 0)
            size = 32768 + (size_t)(rand_r(&seed) % (2 << 20));
        errno = 0;
        unsigned char *p = rand_r(&seed) % 4 ? malloc(size) : calloc(1, size);
        if (p == NULL) {
            if (errno != ENOMEM)
                fail("NULL without ENOMEM");
            failed++;
            continue;
        }
        p[0] = p[size - 1] = (unsigned char)i;
        held[i] = p;
        sizes[i] = size;
    }
    atomic_fetch_add(&limited_done, 1);
    while (atomic_load(&phase) == 1)
        sched_yield();
    for (int i = 0; i < SLOTS; i++)
        free(held[i]);
    void *p = malloc(3 << 20), *q = malloc(100);
    if (p == NULL || q == NULL)
        fail("malloc after the limit was lifted");
    else
        atomic_fetch_add(&after_ok, 1);
    free(p);
    free(q);
    return NULL;
}

static void *brief(void *arg)
{
    (void)arg;
    for (int i = 0; i < 100; i++) {
        errno = 0;
        void *p = malloc(64 + (size_t)i * 100);
        if (p == NULL && errno != ENOMEM)
            fail("NULL without ENOMEM (new thread)");
        free(p);
    }
    return NULL;
}

static void *forever(void *arg)
{
    unsigned seed = (unsigned)(size_t)arg;
    for (;;)
        free(malloc(16 + (size_t)(rand_r(&seed) % 100000)));
    return NULL;
}

int main(void)
{
    start_watchdog("oom_threads", 25);
    pthread_t threads[THREADS];
    for (int i = 0; i < THREADS; i++)
        if (pthread_create(&threads[i], NULL, hog, (void *)(size_t)(i + 1)) != 0)
            return 2;
    struct rlimit old, limit;
    getrlimit(RLIMIT_AS, &old);
    limit = old;
    limit.rlim_cur = vm_size() + (64 << 20);
    if (setrlimit(RLIMIT_AS, &limit) != 0)
        return 2;
    atomic_store(&phase, 1);
    int started = 0, refused = 0;
    while (atomic_load(&limited_done) < THREADS) {
        pthread_t t;
        int rc = pthread_create(&t, NULL, brief, NULL);
        if (rc == 0) {
            pthread_join(t, NULL);
            started++;
        } else if (rc == EAGAIN || rc == ENOMEM) {
            refused++;
            sched_yield();
        } else
            fail("pthread_create");
    }
    setrlimit(RLIMIT_AS, &old);
    atomic_store(&phase, 2);
    for (int i = 0; i < THREADS; i++)
        pthread_join(threads[i], NULL);
    if (atomic_load(&after_ok) != THREADS)
        fail("not every thread could allocate after the limit was lifted");
    brief(NULL);
    for (int i = 0; i < 4; i++) {
        pthread_t t;
        pthread_create(&t, NULL, forever, (void *)(size_t)(i + 1));
        pthread_detach(t);
    }
    fprintf(stderr, "%d short threads started, %d refused under the limit\n", started, refused);
    return atomic_load(&failures) ? 1 : 0;
}
