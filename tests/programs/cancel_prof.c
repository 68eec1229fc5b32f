/* cancel_prof.c - deferred cancellation with the profiler on (cmalloc failed it until 8af513e).
 * malloc and free are not cancellation points, so a deferred pthread_cancel must act only at
 * the program's own pthread_testcancel. Re-executes itself with CMALLOC_PROF=1 and
 * CMALLOC_PROF_RATE=4096 (options are read at start); 8 threads loop malloc/free with a flag
 * set around each call, and are cancelled at random moments; their cleanup handler reports a
 * cancellation that acted while the flag was set. (CMALLOC_PROF=0 CMALLOC_GUARD_RATE=50 in the
 * environment shows the same through guard.c, which takes allocation and free stacks with the
 * same unwinder, so free is a cancellation point too.) Under cmalloc with libunwind installed the
 * sampler's unw_backtrace validates addresses with read() on a pipe, a cancellation point, so
 * the thread unwinds out of the middle of malloc (prof.c capture_stack). Exit 0 when no
 * cancellation acted inside the allocator; 1 and a count otherwise. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_int inside_count;
static __thread volatile int inside_allocator;

static void on_cancel(void *arg)
{
    (void)arg;
    if (inside_allocator)
        atomic_fetch_add(&inside_count, 1);
}

static void *victim(void *arg)
{
    unsigned seed = (unsigned)(size_t)arg;
    void *blocks[32] = {0};
    pthread_cleanup_push(on_cancel, NULL);
    for (;;) {
        int i = (int)(rand_r(&seed) % 32);
        size_t size = 8 + (size_t)(rand_r(&seed) % 3000);
        inside_allocator = 1;
        free(blocks[i]);
        blocks[i] = malloc(size);
        inside_allocator = 0;
        pthread_testcancel();
    }
    pthread_cleanup_pop(0);
    return NULL;
}

extern char **environ;

int main(int argc, char **argv)
{
    (void)argc;
    if (getenv("CMALLOC_PROF") == NULL) {
        setenv("CMALLOC_PROF", "1", 1);
        setenv("CMALLOC_PROF_RATE", "4096", 1);
        execve("/proc/self/exe", argv, environ);
        perror("execve");
        return 2;
    }
    unsigned seed = 1;
    for (int round = 0; round < 200; round++) {
        pthread_t threads[8];
        for (int i = 0; i < 8; i++)
            pthread_create(&threads[i], NULL, victim, (void *)(size_t)(round * 8 + i + 1));
        struct timespec pause = {0, (long)(rand_r(&seed) % 2000) * 1000};
        nanosleep(&pause, NULL);
        for (int i = 0; i < 8; i++)
            pthread_cancel(threads[i]);
        for (int i = 0; i < 8; i++)
            pthread_join(threads[i], NULL);
    }
    int inside = atomic_load(&inside_count);
    if (inside)
        printf("%d of 1600 cancellations acted inside malloc or free\n", inside);
    return inside ? 1 : 0;
}
