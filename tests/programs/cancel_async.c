/* cancel_async.c - PTHREAD_CANCEL_ASYNCHRONOUS cancellation of threads inside malloc/free.
 * POSIX allows only async-cancel-safe functions in that mode and malloc is not one, so this is
 * a probe of how it fails (glibc's malloc can also be left locked), not a guarantee: it is not
 * in the run list. Rounds of 4 victims cancelled at random moments; then main and fresh threads
 * allocate in every size class. Prints how many rounds ran; a hang ends with status 124.
 * Seen (glibc 2.36, 2 cores): without cmalloc 6 of 6 runs of 3 rounds hang (glibc's arena lock
 * left held); under cmalloc 6 of 6 hang the same way: an exiting victim waits in thread_exit's
 * flush for a central cache lock a cancelled victim held (thread_cache.c release_all ->
 * central_cache.c). Not a cmalloc bug: the program breaks POSIX. */
#include "../watchdog.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static void *victim(void *arg)
{
    unsigned seed = (unsigned)(size_t)arg;
    void *blocks[64] = {0};
    pthread_setcanceltype(PTHREAD_CANCEL_ASYNCHRONOUS, NULL);
    for (;;) {
        int i = (int)(rand_r(&seed) % 64);
        free(blocks[i]);
        size_t size = 8 + (size_t)(rand_r(&seed) % 2000);
        if (rand_r(&seed) % 50 == 0)
            size = 100000 + (size_t)(rand_r(&seed) % 1000000);
        blocks[i] = malloc(size);
    }
    return NULL;
}

static void *finisher(void *arg)
{
    (void)arg;
    for (size_t size = 1; size < (1 << 21); size += size / 8 + 1)
        free(malloc(size));
    return NULL;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 50;
    start_watchdog("cancel_async", 20);
    unsigned seed = 1;
    for (int round = 0; round < rounds; round++) {
        pthread_t victims[4];
        for (int i = 0; i < 4; i++)
            pthread_create(&victims[i], NULL, victim, (void *)(size_t)(round * 4 + i + 1));
        struct timespec pause = {0, (long)(rand_r(&seed) % 2000) * 1000};
        nanosleep(&pause, NULL);
        for (int i = 0; i < 4; i++)
            pthread_cancel(victims[i]);
        for (int i = 0; i < 4; i++)
            pthread_join(victims[i], NULL);
        finisher(NULL);
        pthread_t t;
        pthread_create(&t, NULL, finisher, NULL);
        pthread_join(t, NULL);
    }
    printf("%d rounds\n", rounds);
    return 0;
}
