/* signal_malloc.c - a probe, not a guarantee (not in the run list): a signal handler that
 * calls malloc and free (not async-signal-safe, but common in the wild) while the interrupted
 * code is itself inside malloc/free. Mode "1" = single thread, timer signal every 50 us;
 * "2" = 3 threads, the signal delivered to whichever runs. Runs 2 s; the blocks are filled
 * and checked, so corruption shows as "corrupt" (exit 1), a crash as a signal, a hang as
 * status 124 (watchdog). Prints the number of handler calls.
 * Seen (glibc 2.36, 2 cores, TEST_WATCHDOG_SECONDS=5): without cmalloc 3 of 3 runs hang in each
 * mode (the handler waits for the arena lock the interrupted malloc holds); under cmalloc 3 of
 * 6 hang in each mode, the same way (the handler's malloc waits in cm_page_heap_alloc for
 * heap_lock, held by the interrupted refill), and no run saw a corrupted block. */
#include "../watchdog.h"
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

static atomic_long calls;
static atomic_int stop;

static void on_timer(int signal_number)
{
    (void)signal_number;
    static __thread unsigned seed = 12345;
    size_t size = 8 + rand_r(&seed) % 3000;
    unsigned char *p = malloc(size);
    if (p == NULL)
        return;
    memset(p, 0xA5, size);
    unsigned char *q = malloc(size / 2 + 1);
    free(p);
    free(q);
    atomic_fetch_add(&calls, 1);
}

static void *loop(void *arg)
{
    unsigned seed = (unsigned)(size_t)arg;
    unsigned char *blocks[64] = {0};
    size_t sizes[64] = {0};
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (unsigned n = 0; !atomic_load(&stop); n++) {
        if (n % 1024 == 0 && arg == (void *)1) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            if (now.tv_sec - start.tv_sec >= 2)
                atomic_store(&stop, 1);
        }
        int i = (int)(rand_r(&seed) % 64);
        if (blocks[i]) {
            for (size_t k = 0; k < sizes[i]; k++)
                if (blocks[i][k] != (unsigned char)i) {
                    fprintf(stderr, "corrupt\n");
                    _exit(1);
                }
            free(blocks[i]);
        }
        sizes[i] = 8 + (size_t)(rand_r(&seed) % 4000);
        if (rand_r(&seed) % 200 == 0)
            sizes[i] = 300000;
        blocks[i] = malloc(sizes[i]);
        memset(blocks[i], i, sizes[i]);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 && argv[1][0] == '2' ? 3 : 0;
    sigset_t alarm_only;
    sigemptyset(&alarm_only);
    sigaddset(&alarm_only, SIGALRM);
    pthread_sigmask(SIG_BLOCK, &alarm_only, NULL); /* the watchdog thread never takes it */
    start_watchdog("signal_malloc", 10);
    pthread_sigmask(SIG_UNBLOCK, &alarm_only, NULL);
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_timer;
    action.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &action, NULL);
    pthread_t t[3];
    for (int i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, loop, (void *)(size_t)(i + 2));
    struct itimerval timer = {{0, 50}, {0, 50}};
    setitimer(ITIMER_REAL, &timer, NULL);
    loop((void *)1); /* until the deadline */
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    printf("%ld handler calls\n", atomic_load(&calls));
    return 0;
}
