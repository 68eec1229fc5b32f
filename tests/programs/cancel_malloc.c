/* cancel_malloc.c - pthread_cancel of threads that are busy allocating. Deferred cancellation
 * (the default) acts only at cancellation points, so the victims call stdio (fprintf to
 * /dev/null, fopen/fclose: cancellation points that themselves allocate) and pthread_testcancel
 * between mallocs and frees; cleanup handlers free what the thread holds. 40 rounds of 8
 * victims, cancelled at random moments while a survivor thread keeps allocating; then main
 * allocates in every size class and one more round of threads runs to completion. A victim
 * cancelled inside the allocator (a cancellation point reached while an allocator lock is held)
 * leaves that lock held: the next thread to need it hangs (watchdog: status 124). */
#include "../watchdog.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static atomic_int stop;

static void free_all(void *arg)
{
    void **blocks = arg;
    for (int i = 0; i < 64; i++) {
        free(blocks[i]);
        blocks[i] = NULL;
    }
    free(blocks);
}

static void *victim(void *arg)
{
    unsigned seed = (unsigned)(size_t)arg;
    void **blocks = calloc(64, sizeof *blocks);
    FILE *null = fopen("/dev/null", "w");
    pthread_cleanup_push(free_all, blocks);
    for (;;) {
        int i = (int)(rand_r(&seed) % 64);
        free(blocks[i]);
        size_t size = 8 + (size_t)(rand_r(&seed) % 2000);
        if (rand_r(&seed) % 100 == 0)
            size = 100000 + (size_t)(rand_r(&seed) % 2000000);
        blocks[i] = malloc(size);
        if (rand_r(&seed) % 16 == 0) {
            fprintf(null, "%d %s\n", i, (char *)"cancellation point that allocates");
            fflush(null);
        }
        if (rand_r(&seed) % 64 == 0) {
            FILE *f = fopen("/dev/null", "r");
            if (f)
                fclose(f);
        }
        pthread_testcancel();
    }
    pthread_cleanup_pop(1);
    return NULL;
}

static void *survivor(void *arg)
{
    unsigned seed = (unsigned)(size_t)arg;
    void *blocks[32] = {0};
    while (!atomic_load(&stop)) {
        int i = (int)(rand_r(&seed) % 32);
        free(blocks[i]);
        blocks[i] = malloc(8 + (size_t)(rand_r(&seed) % 70000));
    }
    for (int i = 0; i < 32; i++)
        free(blocks[i]);
    return NULL;
}

static void *finisher(void *arg)
{
    (void)arg;
    for (size_t size = 1; size < (1 << 21); size += size / 8 + 1)
        free(malloc(size));
    return NULL;
}

int main(void)
{
    start_watchdog("cancel_malloc", 25);
    pthread_t keep;
    pthread_create(&keep, NULL, survivor, (void *)7);
    unsigned seed = 1;
    for (int round = 0; round < 40; round++) {
        pthread_t victims[8];
        for (int i = 0; i < 8; i++)
            if (pthread_create(&victims[i], NULL, victim, (void *)(size_t)(round * 8 + i + 1)))
                return 2;
        struct timespec pause = {0, (long)(rand_r(&seed) % 3000) * 1000};
        nanosleep(&pause, NULL);
        for (int i = 0; i < 8; i++)
            pthread_cancel(victims[i]);
        for (int i = 0; i < 8; i++) {
            void *result;
            pthread_join(victims[i], &result);
            if (result != PTHREAD_CANCELED)
                return 3;
        }
    }
    atomic_store(&stop, 1);
    pthread_join(keep, NULL);
    finisher(NULL);
    pthread_t last[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&last[i], NULL, finisher, NULL);
    for (int i = 0; i < 4; i++)
        pthread_join(last[i], NULL);
    return 0;
}
