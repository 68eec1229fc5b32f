/* threads_join.c - the plainest multithreaded program: 200 threads each malloc and free a few
 * hundred blocks of 16 B - 2 KiB, then main joins them all. Exit 0. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *work(void *arg)
{
    unsigned seed = (unsigned)(size_t)arg;
    void *blocks[300];
    for (int i = 0; i < 300; i++) {
        size_t size = 16 + (size_t)(rand_r(&seed) % 2033);
        blocks[i] = malloc(size);
        if (blocks[i] == NULL)
            return (void *)1;
        memset(blocks[i], i, size);
    }
    for (int i = 0; i < 300; i++)
        free(blocks[i]);
    return NULL;
}

int main(void)
{
    enum { THREADS = 200 };
    pthread_t threads[THREADS];
    for (int i = 0; i < THREADS; i++)
        if (pthread_create(&threads[i], NULL, work, (void *)(size_t)(i + 1)) != 0)
            return 2;
    int failed = 0;
    for (int i = 0; i < THREADS; i++) {
        void *result;
        pthread_join(threads[i], &result);
        failed += result != NULL;
    }
    return failed ? 1 : 0;
}
