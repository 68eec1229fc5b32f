/* guard_calls - what the guard's system calls cost on their own (a helper, not a workload): the
 * figures behind src/guard.c's layout and OPEN_RUN and README's "What they cost".
 *
 *   build/bench/guard_calls LAYOUT RUN THREADS
 *
 * A pool laid out as guard.c's (256 slots, | guard | data | guard | data | ... | guard |, 4 KiB
 * pages) is cycled through 200,000 times in address order: each slot's data page is opened
 * (RUN slots at a time, by one call over them and the guards between), written and closed
 * again, as a guarded block's allocation and free would. THREADS 2 adds a thread that only
 * spins, so that every TLB flush must interrupt a second core. LAYOUT:
 *   separate  each data page a mapping of its own, guard pages marked (MADV_GUARD_INSTALL,
 *             Linux 6.13+) so that a run's mprotect leaves them faulting: guard.c's layout
 *   single    the same marks on one mapping: a close splits it, the next opening merges it
 *   markers   one readable and writable mapping; a close puts a guard marker on the data page
 *             (MADV_GUARD_INSTALL, which also frees the page) and an opening removes it
 *             (MADV_GUARD_REMOVE, one slot at a time: over a run it would strip the guards too)
 * Prints the microseconds per block in all and in the openings and closes.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#ifndef MADV_GUARD_INSTALL
#define MADV_GUARD_INSTALL 102
#define MADV_GUARD_REMOVE  103
#endif

#define PAGE   ((size_t)4096)
#define SLOTS  256
#define BLOCKS 200000

static volatile int stop;

static void *spin(void *unused)
{
    (void)unused;
    while (!stop)
        ;
    return NULL;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static char *pool;

static char *data_page(int slot)
{
    return pool + (2 * (size_t)slot + 1) * PAGE;
}

static int set_up(const char *layout)
{
    pool = mmap(NULL, (2 * SLOTS + 1) * PAGE, PROT_NONE,
                MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (pool == MAP_FAILED)
        return -1;
    if (!strcmp(layout, "markers"))
        return mprotect(pool, (2 * SLOTS + 1) * PAGE, PROT_READ | PROT_WRITE);
    for (int slot = 0; slot <= SLOTS; slot++) {
        if (madvise(pool + 2 * (size_t)slot * PAGE, PAGE, MADV_GUARD_INSTALL) != 0)
            return -1;
        if (slot < SLOTS && !strcmp(layout, "separate") &&
            mmap(data_page(slot), PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
                 0) == MAP_FAILED)
            return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *layout = argc == 4 ? argv[1] : "";
    int run = argc == 4 ? atoi(argv[2]) : 0, threads = argc == 4 ? atoi(argv[3]) : 0;
    int markers = !strcmp(layout, "markers");
    if ((!markers && strcmp(layout, "separate") && strcmp(layout, "single")) || run < 1 ||
        (markers && run != 1) || threads < 1 || threads > 2) {
        fprintf(stderr, "usage: guard_calls separate|single|markers RUN THREADS (markers: RUN 1; "
                        "THREADS 1 or 2)\n");
        return 2;
    }
    pthread_t spinner;
    if (threads == 2 && pthread_create(&spinner, NULL, spin, NULL) != 0)
        return 1;
    if (set_up(layout) != 0) {
        perror("guard_calls: setting up the pool (guard markers need Linux 6.13)");
        return 1;
    }
    if (markers) /* every slot starts closed, as in the other layouts */
        for (int slot = 0; slot < SLOTS; slot++)
            madvise(data_page(slot), PAGE, MADV_GUARD_INSTALL);
    double opening = 0, closing = 0, start = now();
    int open_end = 0; /* slots below it (from the last opening on) are open */
    for (int block = 0; block < BLOCKS; block++) {
        int slot = block % SLOTS;
        if (slot == 0)
            open_end = 0;
        if (slot >= open_end) {
            int end = slot + run < SLOTS ? slot + run : SLOTS;
            double t = now();
            if (markers)
                madvise(data_page(slot), PAGE, MADV_GUARD_REMOVE);
            else
                mprotect(data_page(slot), (size_t)(data_page(end - 1) - data_page(slot)) + PAGE,
                         PROT_READ | PROT_WRITE);
            opening += now() - t;
            open_end = end;
        }
        data_page(slot)[100] = 1;
        double t = now();
        if (markers)
            madvise(data_page(slot), PAGE, MADV_GUARD_INSTALL);
        else
            mprotect(data_page(slot), PAGE, PROT_NONE);
        closing += now() - t;
    }
    double total = now() - start;
    stop = 1;
    if (threads == 2)
        pthread_join(spinner, NULL);
    printf("guard_calls %s run %d threads %d: %.2f us per block, opening %.2f, closing %.2f\n",
           layout, run, threads, total / BLOCKS * 1e6, opening / BLOCKS * 1e6,
           closing / BLOCKS * 1e6);
    return 0;
}
