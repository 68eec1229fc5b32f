/* test_fork_stress.c - fork() thousands of times while other threads hammer the allocator.
 *
 * Linked with build/libcmalloc.a by the Makefile, so cmalloc serves every call here.
 *
 *   test_fork_under_load   2 threads allocate, reallocate and free random sizes (16 B to 3 MiB,
 *                          a few of 9 to 10 MiB, mmap'd at first: the threshold starts at 1 MiB
 *                          and freeing a mapping raises it) and pass blocks to each other
 *                          through a shared array of slots, so frees cross threads. Meanwhile
 *                          the main thread forks up to 2000 times (stopping after 10 s; the
 *                          count is printed). Every child: frees a block the parent made
 *                          before the fork and checks its contents, mallocs and frees a mix of
 *                          sizes (small, page-heap, mmap'd), then _exits; every fourth child
 *                          execs /bin/true instead. A child that deadlocks is killed by its
 *                          own alarm (5 s) and reported; a child that crashes is reported with
 *                          its signal; the parent's alarm turns a deadlock of the parent
 *                          (in fork's handlers) into a failure rather than a hang. The median
 *                          time from fork() to the child running (after the allocator's child
 *                          handler) is printed and must stay under 50 ms (glibc: ~8 ms here;
 *                          a handler that flushed the other threads' caches took 80-200 ms).
 *   test_fork_during_fast_path  2 threads malloc and free one small block in a tight loop, so a
 *                          fork often catches one in the middle of a fast-path pop or push;
 *                          up to 2000 forks in 6 s, no child may crash. (A child handler that
 *                          walked the other threads' caches trusting their lengths crashed in
 *                          about 1 fork in 200-1500.)
 *
 * The hammer threads stay busy right up to each fork, so children inherit thread caches caught
 * mid-update by threads that do not exist in the child: this is the case fork's child handler
 * must survive. test_threads.c forks a few hundred times; this is the heavy version.
 * TEST_SEED repeats a run; TEST_FORKS and TEST_FORK_SECONDS change the budget of both.
 * Runtime: up to ~17 s on two cores.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "cmalloc.h"
#include "helpers.h"
#include "rng.h"

enum { HAMMERS = 2, SLOTS = 1024, MAX_FORKS = 100000 };

/* Shared with the children (MAP_SHARED, not from malloc): when fork() was called in the parent
 * and when the child got control back from it, i.e. after the allocator's child handler ran. */
typedef struct fork_times {
    double called[MAX_FORKS];
    double child_started[MAX_FORKS];
} fork_times;
static fork_times *times;

static unsigned test_seed;
static atomic_int stop_hammers;
static _Atomic(uintptr_t) slots[SLOTS]; /* blocks any thread may take and free */
static atomic_long hammer_errors, hammer_ops;

static double now_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* A block starts with its size and a tag derived from it, and its last byte repeats the tag:
 * whoever frees it checks both. */
typedef struct header {
    size_t size;
    uint64_t tag;
} header;

static uint64_t tag_of(size_t size)
{
    return size * 0x9E3779B97F4A7C15ULL ^ 0xF0F0;
}

static void *make_block(size_t size)
{
    if (size < sizeof(header) + 1)
        size = sizeof(header) + 1;
    header *h = malloc(size);
    if (h == NULL)
        return NULL;
    h->size = size;
    h->tag = tag_of(size);
    ((unsigned char *)h)[size - 1] = (unsigned char)h->tag;
    return h;
}

static bool block_ok(const void *p)
{
    const header *h = p;
    return h->tag == tag_of(h->size) &&
           ((const unsigned char *)h)[h->size - 1] == (unsigned char)h->tag;
}

static size_t random_size(uint64_t *rng)
{
    uint64_t r = rng_next(rng);
    switch (r % 64) {
    case 0: return 9 * MiB + (r >> 20) % MiB; /* mmap'd */
    case 1:
    case 2:
    case 3: return 257 * KiB + (r >> 20) % (3 * MiB); /* page heap */
    default: return 16 + (r >> 20) % (r & 64 ? 4096 : 256);
    }
}

static void *hammer(void *arg)
{
    uint64_t rng = test_seed * 0x9E3779B97F4A7C15ULL + (uintptr_t)arg * 7919 + 1;
    void *own[64] = {0};
    long ops = 0;
    while (!atomic_load_explicit(&stop_hammers, memory_order_relaxed)) {
        uint64_t r = rng_next(&rng);
        unsigned i = (unsigned)(r >> 8) % 64;
        if (own[i] != NULL) {
            if (!block_ok(own[i]))
                atomic_fetch_add(&hammer_errors, 1);
            if (r & 1) {
                free(own[i]);
                own[i] = NULL;
            } else { /* hand it to whoever takes this slot next; free what was there */
                uintptr_t old = atomic_exchange(&slots[(r >> 20) % SLOTS], (uintptr_t)own[i]);
                own[i] = NULL;
                if (old) {
                    if (!block_ok((void *)old))
                        atomic_fetch_add(&hammer_errors, 1);
                    free((void *)old);
                }
            }
        } else if ((r & 15) == 3) { /* realloc a fresh block to a new size */
            void *p = make_block(64 + (r >> 24) % 2000);
            size_t size = random_size(&rng) + sizeof(header) + 1;
            header *q = p ? realloc(p, size) : NULL;
            if (q) {
                q->size = size;
                q->tag = tag_of(size);
                ((unsigned char *)q)[size - 1] = (unsigned char)q->tag;
            }
            own[i] = q;
        } else {
            own[i] = make_block(random_size(&rng));
        }
        ops++;
    }
    for (int i = 0; i < 64; i++)
        free(own[i]);
    atomic_fetch_add(&hammer_ops, ops);
    return NULL;
}

/* ---- the child ----------------------------------------------------------------------------- */

/* Exit codes: 0 ok, 10 + n: check n failed. Never returns. */
static void child(void *inherited, int number)
{
    times->child_started[number] = now_seconds();
    alarm(5); /* a deadlock ends as SIGALRM */
    if (inherited && !block_ok(inherited))
        _exit(10);
    free(inherited);
    static const size_t sizes[] = {24, 100, 1000, 5000, 40 * KiB, 300 * KiB, 2 * MiB, 12 * MiB};
    void *blocks[8];
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < 8; i++)
            if ((blocks[i] = make_block(sizes[i])) == NULL)
                _exit(11);
        for (int i = 0; i < 8; i++) {
            if (!block_ok(blocks[i]))
                _exit(12);
            free(blocks[i]);
        }
    }
    /* A block another (now absent) thread left in the shared slots: ours to check and free. */
    uintptr_t left = atomic_exchange(&slots[(unsigned)number % SLOTS], 0);
    if (left) {
        if (!block_ok((void *)left))
            _exit(13);
        free((void *)left);
    }
    if (number % 4 == 0) {
        char *args[] = {"/bin/true", NULL};
        char *env[] = {NULL};
        execve("/bin/true", args, env);
        _exit(14);
    }
    _exit(0);
}

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median_child_start_ms(int forks)
{
    static double latency[MAX_FORKS];
    int n = 0;
    for (int i = 0; i < forks; i++)
        if (times->child_started[i] > 0)
            latency[n++] = (times->child_started[i] - times->called[i]) * 1e3;
    if (n == 0)
        return 0;
    qsort(latency, (size_t)n, sizeof latency[0], compare_doubles);
    return latency[n / 2];
}

static void parent_timeout(int signal_number)
{
    (void)signal_number;
    static const char text[] = "test_fork_stress: the parent is stuck (a deadlock in fork?)\n";
    if (write(2, text, sizeof text - 1) < 0)
        _exit(3);
    abort();
}

static void test_fork_under_load(void **state)
{
    (void)state;
    const char *s = getenv("TEST_FORKS");
    int max_forks = s ? atoi(s) : 2000;
    if (max_forks > MAX_FORKS)
        max_forks = MAX_FORKS;
    s = getenv("TEST_FORK_SECONDS");
    double seconds = s ? atof(s) : 10.0;

    struct sigaction on_alarm = {.sa_handler = parent_timeout}, old;
    sigaction(SIGALRM, &on_alarm, &old);
    alarm((unsigned)seconds + 60);

    pthread_t threads[HAMMERS];
    for (int i = 0; i < HAMMERS; i++)
        assert_int_equal(pthread_create(&threads[i], NULL, hammer, (void *)(uintptr_t)i), 0);
    usleep(20000);

    double start = now_seconds();
    int forks = 0, execs = 0, deadlocks = 0, crashes = 0, failures = 0;
    char first_problem[256] = "";
    while (forks < max_forks && now_seconds() - start < seconds) {
        void *inherited = make_block(100 + (size_t)forks % 3000);
        assert_non_null(inherited);
        times->called[forks] = now_seconds();
        pid_t pid = fork();
        if (pid < 0)
            fail_msg("fork #%d: %s", forks, strerror(errno));
        if (pid == 0) {
            struct sigaction dfl = {.sa_handler = SIG_DFL};
            sigaction(SIGALRM, &dfl, NULL);
            child(inherited, forks);
        }
        free(inherited);
        int status;
        while (waitpid(pid, &status, 0) < 0)
            assert_int_equal(errno, EINTR);
        execs += forks % 4 == 0;
        bool bad = true;
        if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
            deadlocks++;
        else if (WIFSIGNALED(status))
            crashes++;
        else if (WEXITSTATUS(status) != 0)
            failures++;
        else
            bad = false;
        if (bad && first_problem[0] == '\0')
            snprintf(first_problem, sizeof first_problem, "fork #%d: child %s %d", forks,
                     WIFSIGNALED(status) ? "killed by signal" : "exited with status",
                     WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
        forks++;
    }
    double elapsed = now_seconds() - start;
    atomic_store(&stop_hammers, 1);
    for (int i = 0; i < HAMMERS; i++)
        pthread_join(threads[i], NULL);
    for (int i = 0; i < SLOTS; i++) {
        uintptr_t p = atomic_exchange(&slots[i], 0);
        if (p && !block_ok((void *)p))
            atomic_fetch_add(&hammer_errors, 1);
        free((void *)p);
    }
    alarm(0);
    sigaction(SIGALRM, &old, NULL);
    double median_ms = median_child_start_ms(forks);
    printf("fork stress: %d forks (%d exec /bin/true) in %.1f s while %d threads made %ld "
           "allocator calls; %d deadlocked, %d crashed, %d failed a check; a child gets control "
           "back from fork() %.1f ms (median) after the call\n",
           forks, execs, elapsed, HAMMERS, atomic_load(&hammer_ops), deadlocks, crashes, failures,
           median_ms);
    if (median_ms >= 50.0)
        fail_msg("a child got control back from fork() %.1f ms (median) after the call; want "
                 "under 50 ms",
                 median_ms);
    if (deadlocks || crashes || failures)
        fail_msg("%d of %d children deadlocked, %d crashed, %d failed a check (seed %u); "
                 "first: %s",
                 deadlocks, forks, crashes, failures, test_seed, first_problem);
    assert_int_equal(atomic_load(&hammer_errors), 0);
    assert_true(forks >= 20);
}

/* A fork while another thread is inside a malloc or free fast path (see the header). */
static void *tight_loop(void *arg)
{
    size_t size = (size_t)(uintptr_t)arg;
    while (!atomic_load_explicit(&stop_hammers, memory_order_relaxed)) {
        void *p = malloc(size);
        *(volatile char *)p = 1;
        free(p);
    }
    return NULL;
}

static void test_fork_during_fast_path(void **state)
{
    (void)state;
    const char *s = getenv("TEST_FORKS");
    int max_forks = s ? atoi(s) : 2000;
    s = getenv("TEST_FORK_SECONDS");
    double seconds = s ? atof(s) * 0.6 : 6.0;
    atomic_store(&stop_hammers, 0);
    pthread_t threads[2];
    assert_int_equal(pthread_create(&threads[0], NULL, tight_loop, (void *)(uintptr_t)16), 0);
    assert_int_equal(pthread_create(&threads[1], NULL, tight_loop, (void *)(uintptr_t)48), 0);
    usleep(10000);
    int forks = 0, crashed = 0, other = 0, first_signal = 0;
    double start = now_seconds();
    for (; forks < max_forks && now_seconds() - start < seconds; forks++) {
        pid_t pid = fork();
        if (pid < 0)
            break;
        if (pid == 0) {
            struct sigaction dfl = {.sa_handler = SIG_DFL};
            sigaction(SIGALRM, &dfl, NULL);
            alarm(5);
            void *p = malloc(16);
            free(p);
            _exit(p ? 0 : 1);
        }
        int status;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
            ;
        if (WIFSIGNALED(status) && WTERMSIG(status) != SIGALRM) {
            crashed++;
            if (!first_signal)
                first_signal = WTERMSIG(status);
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            other++;
        }
    }
    atomic_store(&stop_hammers, 1);
    pthread_join(threads[0], NULL);
    pthread_join(threads[1], NULL);
    printf("fork during fast paths: %d forks in %.1f s: %d children crashed, %d deadlocked or "
           "failed\n",
           forks, now_seconds() - start, crashed, other);
    if (crashed || other)
        fail_msg("%d of %d children crashed (first by signal %d: %s), %d deadlocked or failed",
                 crashed, forks, first_signal, first_signal ? strsignal(first_signal) : "-", other);
    assert_true(forks >= 20);
}

int main(void)
{
    times = mmap(NULL, sizeof *times, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (times == MAP_FAILED)
        return 2;
    test_seed = seed_from_env("test_fork_stress");
    start_watchdog("test_fork_stress", 120);
    fflush(stdout);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fork_under_load),
        cmocka_unit_test(test_fork_during_fast_path),
    };
    return cmocka_run_group_tests_name("fork_stress", tests, NULL, NULL);
}
