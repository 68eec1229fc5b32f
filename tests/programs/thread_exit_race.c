/* thread_exit_race.c - thread lifetimes as programs have them: 8 waves of 64 threads that
 * allocate, hand blocks to each other and exit (joined), 64 detached threads that exit on their
 * own, and finally 16 detached threads still allocating and freeing when main returns (exit
 * runs while they are inside malloc). Exit status 0 from main's return; a crash or a hang at
 * exit (a lock held by a thread that exit stops, a cache freed under a running thread) fails.
 * A watchdog ends a hang with status 124. */
#include "../watchdog.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { WAVE = 64, WAVES = 8, SLOTS = 256 };
static _Atomic(void *) shared[SLOTS];
static atomic_int detached_done;

static void *work(void *arg)
{
    unsigned seed = (unsigned)(size_t)arg;
    for (int i = 0; i < 400; i++) {
        size_t size = 8 + (size_t)(rand_r(&seed) % 3000);
        if (rand_r(&seed) % 50 == 0)
            size = 40000 + (size_t)(rand_r(&seed) % 300000);
        char *p = malloc(size);
        if (p == NULL)
            return (void *)1;
        memset(p, 7, size < 64 ? size : 64);
        /* swap with a slot: the block is freed later by another thread */
        void *old = atomic_exchange(&shared[rand_r(&seed) % SLOTS], p);
        free(old);
    }
    return NULL;
}

static void *detached(void *arg)
{
    work(arg);
    atomic_fetch_add(&detached_done, 1);
    return NULL;
}

static void *forever(void *arg)
{
    unsigned seed = (unsigned)(size_t)arg;
    for (;;) {
        void *p = malloc(16 + (size_t)(rand_r(&seed) % 5000));
        free(atomic_exchange(&shared[rand_r(&seed) % SLOTS], p));
    }
    return NULL;
}

int main(void)
{
    start_watchdog("thread_exit_race", 25);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    for (int wave = 0; wave < WAVES; wave++) {
        pthread_t threads[WAVE];
        for (int i = 0; i < WAVE; i++) {
            if (pthread_create(&threads[i], NULL, work, (void *)(size_t)(wave * WAVE + i + 1))) {
                fprintf(stderr, "pthread_create failed\n");
                return 2;
            }
        }
        for (int i = 0; i < WAVE; i++) {
            void *result;
            pthread_join(threads[i], &result);
            if (result != NULL) {
                fprintf(stderr, "a thread's malloc failed\n");
                return 3;
            }
        }
        pthread_t t;
        for (int i = 0; i < WAVE / WAVES; i++)
            if (pthread_create(&t, &attr, detached, (void *)(size_t)(9000 + wave * 8 + i)))
                return 2;
    }
    while (atomic_load(&detached_done) < WAVE)
        sched_yield();
    for (int i = 0; i < 16; i++) {
        pthread_t t;
        if (pthread_create(&t, &attr, forever, (void *)(size_t)(500 + i)))
            return 2;
    }
    struct timespec pause = {0, 20 * 1000 * 1000};
    nanosleep(&pause, NULL);
    return 0; /* exit with 16 threads inside malloc/free */
}
