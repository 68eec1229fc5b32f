/* test_release.c - memory goes back to the OS, black box (RSS from /proc/self/statm).
 *
 * Linked with build/libcmalloc.a by the Makefile, so cmalloc serves every call here.
 *
 *   test_trim_returns_memory    512 MiB in 64-byte, 4 KiB, 2 MiB and 32 MiB objects, every page
 *                               touched; all freed; after malloc_trim(0) the resident set is
 *                               below 10% of its peak.
 *   test_trim_pagemap_leaves    1,000 blocks of 40 MiB (past every mmap threshold, so each has
 *                               its own mapping; one byte written in each), 39 GiB of address
 *                               space over more than one leaf: the pagemap's pages their entries
 *                               are written on (two a block) count in bytes_metadata; once all
 *                               are freed, malloc_trim(0) gives those pages back:
 *                               bytes_metadata falls by as much and the resident set is within
 *                               1 MiB of where it was before.
 *   test_idle_release           the same in a re-executed copy of this binary with
 *                               CMALLOC_RELEASE_DELAY_MS=100 (options are read once, at the
 *                               allocator's start): all freed, then 600 ms idle with no
 *                               allocator call at all, with CMALLOC_BACKGROUND_RELEASE=1; the
 *                               resident set must fall below 25% of its peak (the release
 *                               thread, started when the library loaded, does it).
 *   test_no_thread_by_default   the same in a child without the option: after the frees and
 *                               the idle time the process has only its own thread (no entry
 *                               point ever starts one: glibc may hold locks around them).
 *                               `--idle-child call` is the older variant that makes one 1 MiB
 *                               malloc/free after the sleep (release by age on page-heap entry).
 *   test_thread_churn           up to 100,000 short-lived threads (4 at a time; stops after 10 s
 *                               and prints how many ran), each allocating and freeing a mix of
 *                               sizes and handing one block to the next thread: at the end the
 *                               process maps no more than after the first 1000 threads plus
 *                               8 MiB, its RSS grew by less than 16 MiB, and only the main
 *                               thread's cache is alive.
 *
 * Soak (`build/tests/test_release --soak SECONDS`, `make soak SOAK_SECONDS=300`): threads mixing
 * sizes for minutes; RSS sampled each second must stay flat (see soak_main).
 *
 * Sizes: TEST_RELEASE_MIB (default 512; 1024 for a heavier run) sets the total. Runtime: about
 * 2-4 s for the first two on two cores (page faults dominate), up to 10 s for the churn.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "cmalloc.h"
#include "helpers.h"

bool cm_heap_check(void); /* src/internal.h: hidden in the .so, linkable from the .a */

static double now_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static size_t total_bytes(void)
{
    const char *s = getenv("TEST_RELEASE_MIB");
    size_t mib = s ? strtoull(s, NULL, 10) : 512;
    return (mib >= 64 ? mib : 64) * MiB;
}

/* ---- allocating and freeing a quarter of the total in each kind ---------------------------- */

/* Objects of one size linked through their first word, every page written (resident). */
typedef struct chain {
    size_t size, count;
    void *head;
} chain;

static bool build_chain(chain *c, size_t size, size_t bytes)
{
    c->size = size;
    c->count = 0;
    c->head = NULL;
    for (size_t done = 0; done < bytes; done += size) {
        char *p = malloc(size);
        if (p == NULL)
            return false;
        for (size_t offset = 4096; offset < size; offset += 4096)
            p[offset] = 1; /* fault every page in */
        p[size - 1] = 2;
        *(void **)p = c->head;
        c->head = p;
        c->count++;
    }
    return true;
}

static void free_chain(chain *c)
{
    while (c->head) {
        void *next = *(void **)c->head;
        free(c->head);
        c->head = next;
    }
}

enum { KINDS = 4 };
static const size_t kind_sizes[KINDS] = {64, 4 * KiB, 2 * MiB, 32 * MiB};

/* Allocates total_bytes() in the four kinds; returns the peak RSS, 0 on failure. */
static size_t allocate_all(chain chains[KINDS])
{
    size_t quarter = total_bytes() / KINDS;
    for (int k = 0; k < KINDS; k++)
        if (!build_chain(&chains[k], kind_sizes[k], quarter))
            return 0;
    return resident_bytes();
}

static void free_all(chain chains[KINDS])
{
    for (int k = 0; k < KINDS; k++)
        free_chain(&chains[k]);
}

/* ---- malloc_trim ------------------------------------------------------------------------ */

static void test_trim_returns_memory(void **state)
{
    (void)state;
    chain chains[KINDS];
    double start = now_seconds();
    size_t before = resident_bytes();
    size_t peak = allocate_all(chains);
    assert_true(peak != 0);
    free_all(chains);
    size_t after_free = resident_bytes();
    malloc_trim(0);
    size_t after_trim = resident_bytes();
    printf("trim: rss before %zu KiB, peak %zu KiB, after free %zu KiB, after malloc_trim(0) "
           "%zu KiB (%.1f%% of peak), %.2f s\n",
           before / KiB, peak / KiB, after_free / KiB, after_trim / KiB,
           100.0 * (double)after_trim / (double)peak, now_seconds() - start);
    assert_true(cm_heap_check());
    if (after_trim * 10 >= peak)
        fail_msg("after malloc_trim(0) RSS is %zu KiB, not below 10%% of the peak %zu KiB",
                 after_trim / KiB, peak / KiB);
}

/* ---- release by age (runs in a re-executed child) ------------------------------------------ */

static int thread_count(void)
{
    FILE *status = fopen("/proc/self/status", "r");
    char line[256];
    int threads = -1;
    while (status != NULL && fgets(line, sizeof line, status) != NULL)
        if (sscanf(line, "Threads: %d", &threads) == 1)
            break;
    if (status != NULL)
        fclose(status);
    return threads;
}

/* mode "call": sleep past the delay, then one 1 MiB malloc/free; mode "none": only sleep (with
 * the release thread); mode "threads": only sleep, without it, and count the threads. */
static int idle_child_main(const char *mode)
{
    if (strcmp(mode, "threads") == 0) {
        chain chains[KINDS];
        if (allocate_all(chains) == 0)
            return 1;
        free_all(chains);
        usleep(300 * 1000);
        int threads = thread_count();
        printf("threads after freeing everything and 300 ms idle: %d (want 1)\n", threads);
        return threads == 1 ? 0 : 1;
    }
    chain chains[KINDS];
    size_t peak = allocate_all(chains);
    if (peak == 0) {
        printf("idle: allocation failed\n");
        return 1;
    }
    free_all(chains);
    size_t after_free = resident_bytes();
    usleep(600 * 1000); /* CMALLOC_RELEASE_DELAY_MS=100 in our environment */
    if (strcmp(mode, "call") == 0) {
        /* Enters the page heap (a 1 MiB block is a page-heap span), which releases by age. */
        void *p = malloc(1 * MiB);
        ((volatile char *)p)[0] = 1;
        free(p);
    }
    size_t after_idle = resident_bytes();
    bool ok = after_idle * 4 < peak;
    printf("idle (%s): rss peak %zu KiB, after free %zu KiB, after 600 ms idle%s %zu KiB "
           "(%.1f%% of peak): %s\n",
           mode, peak / KiB, after_free / KiB,
           strcmp(mode, "call") == 0 ? " and one 1 MiB malloc/free" : " (no call)",
           after_idle / KiB, 100.0 * (double)after_idle / (double)peak,
           ok ? "below 25%" : "NOT below 25%");
    return ok ? 0 : 1;
}

/* Re-executes this binary with --idle-child mode and the delay option; returns its status. */
static int run_idle_child(const char *mode, char *output, size_t capacity)
{
    static child_result result;
    child_spec spec = {.self_args = (char *[]){"test_release", "--idle-child", (char *)mode, NULL},
                       .env = {"CMALLOC_RELEASE_DELAY_MS=100",
                               strcmp(mode, "none") == 0 ? "CMALLOC_BACKGROUND_RELEASE=1"
                                                         : "CMALLOC_BACKGROUND_RELEASE=0"},
                       .with_stdout = true,
                       .alarm_seconds = 60};
    run_child(&spec, &result);
    snprintf(output, capacity, "%s", result.output);
    return result.status;
}

static void test_trim_pagemap_leaves(void **state)
{
    (void)state;
    enum { BLOCKS = 1000 };
    const size_t block = 40 * MiB, entries = 2 * 4 * KiB; /* a block's entry pages */
    static char *blocks[BLOCKS];
    malloc_trim(0);
    size_t rss_before = resident_bytes();
    size_t metadata_before = stats_now().bytes_metadata;
    for (int i = 0; i < BLOCKS; i++) {
        blocks[i] = malloc(block);
        assert_non_null(blocks[i]);
        blocks[i][0] = 1;
    }
    size_t metadata_held = stats_now().bytes_metadata;
    for (int i = 0; i < BLOCKS; i++)
        free(blocks[i]);
    malloc_trim(0);
    size_t metadata_after = stats_now().bytes_metadata;
    size_t rss_after = resident_bytes();
    printf("pagemap leaves: metadata %zu KiB before, %zu KiB with the blocks, %zu KiB after "
           "malloc_trim(0); rss %zu KiB before, %zu KiB after\n",
           metadata_before / KiB, metadata_held / KiB, metadata_after / KiB, rss_before / KiB,
           rss_after / KiB);
    assert_true(metadata_held >= metadata_before + BLOCKS / 2 * entries);
    assert_true(metadata_after + BLOCKS / 2 * entries <= metadata_held);
    assert_true(rss_after <= rss_before + MiB);
    assert_true(cm_heap_check());
}

static void test_idle_release(void **state)
{
    (void)state;
    static char output[4096];
    int status = run_idle_child("none", output, sizeof output);
    printf("%s", output);
    if (!(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0))
        fail_msg("idle release: the child failed (status 0x%x)", status);
}

static void test_no_thread_by_default(void **state)
{
    (void)state;
    static char output[4096];
    int status = run_idle_child("threads", output, sizeof output);
    printf("%s", output);
    if (!(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0))
        fail_msg("a thread was started without CMALLOC_BACKGROUND_RELEASE=1 (status 0x%x)", status);
}

/* ---- thread churn ------------------------------------------------------------------------ */

static void *handed; /* one block passed from each thread to the next (they run in waves) */
static pthread_mutex_t handed_lock = PTHREAD_MUTEX_INITIALIZER;

static void *churn_thread(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    void *blocks[12];
    for (int i = 0; i < 12; i++) {
        seed = seed * 1103515245u + 12345u;
        size_t size = i == 11 ? 64 * KiB : 16 + (seed >> 16) % 8000;
        blocks[i] = malloc(size);
        if (blocks[i])
            memset(blocks[i], i, 16);
    }
    pthread_mutex_lock(&handed_lock);
    void *old = handed;
    handed = blocks[0];
    pthread_mutex_unlock(&handed_lock);
    free(old); /* a block another thread made, freed here */
    for (int i = 1; i < 12; i++)
        free(blocks[i]);
    return NULL;
}

static void test_thread_churn(void **state)
{
    (void)state;
    enum { WAVE = 4, TARGET = 100000, BASELINE = 1000 };
    const double limit_seconds = 10.0;
    double start = now_seconds();
    size_t done = 0, base_mapped = 0, base_rss = 0;
    cmalloc_stats stats;
    while (done < TARGET) {
        pthread_t threads[WAVE];
        int started = 0;
        for (int i = 0; i < WAVE; i++) {
            int e =
                pthread_create(&threads[i], NULL, churn_thread, (void *)(uintptr_t)(done + i + 1));
            if (e != 0)
                fail_msg("pthread_create after %zu threads: %s", done, strerror(e));
            started++;
        }
        for (int i = 0; i < started; i++)
            pthread_join(threads[i], NULL);
        done += (size_t)started;
        if (done == BASELINE) {
            cmalloc_stats_get(&stats);
            base_mapped = stats.bytes_mapped;
            base_rss = resident_bytes();
        }
        if (done >= BASELINE && (done % 1000) == 0 && now_seconds() - start > limit_seconds)
            break;
    }
    cmalloc_stats_get(&stats);
    size_t rss = resident_bytes();
    printf("thread churn: %zu threads in %.1f s; after %d: mapped %zu KiB, rss %zu KiB; at the "
           "end: mapped %zu KiB, rss %zu KiB, %zu thread caches alive\n",
           done, now_seconds() - start, BASELINE, base_mapped / KiB, base_rss / KiB,
           stats.bytes_mapped / KiB, rss / KiB, stats.thread_caches);
    if (stats.bytes_mapped > base_mapped + 8 * MiB)
        fail_msg("mapped grew from %zu KiB after %d threads to %zu KiB after %zu",
                 base_mapped / KiB, BASELINE, stats.bytes_mapped / KiB, done);
    if (rss > base_rss + 16 * MiB)
        fail_msg("RSS grew from %zu KiB after %d threads to %zu KiB after %zu", base_rss / KiB,
                 BASELINE, rss / KiB, done);
    assert_true(stats.thread_caches <= 1);
    free(handed);
    handed = NULL;
}

/* ---- soak (`make soak`, not in `make test`) ----------------------------------------------------
 * 4 threads keep a working set of 2000 blocks each (about 200 MiB in all), replacing random
 * ones with new blocks of a random size (mostly small, some page-heap sized, a few mmap'd),
 * every byte written, and pass 1 in 8 to another thread to free. The main thread samples RSS and
 * bytes mapped every second. Passes when the highest RSS of the last third of the run is within 25%
 * (plus 16 MiB) of the highest of the first third: the working set is constant, so memory must be
 * too. */
enum { SOAK_THREADS = 4, SOAK_BLOCKS = 2000 };
static volatile int soak_stop;
static void *_Atomic soak_mailbox[SOAK_THREADS];

static void *soak_thread(void *arg)
{
    unsigned index = (unsigned)(uintptr_t)arg;
    uint64_t rng = 0x9E3779B97F4A7C15ULL * (index + 1);
    static __thread void *blocks[SOAK_BLOCKS];
    while (!soak_stop) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        unsigned slot = (unsigned)(rng >> 8) % SOAK_BLOCKS;
        unsigned kind = (unsigned)(rng >> 40) % 1000;
        size_t size = kind < 900   ? 8 + (rng >> 20) % 512
                      : kind < 990 ? 512 + (rng >> 20) % (64 * KiB)
                      : kind < 999 ? 256 * KiB + (rng >> 20) % (2 * MiB)
                                   : 9 * MiB;
        void *old = blocks[slot];
        if (old && (rng & 7) == 0) { /* to another thread's mailbox; free what was there */
            void *prev = atomic_exchange(&soak_mailbox[(index + 1) % SOAK_THREADS], old);
            free(prev);
        } else {
            free(old);
        }
        char *p = malloc(size);
        if (p)
            memset(p, (int)index, size); /* all of it resident: RSS follows the working set */
        blocks[slot] = p;
        /* take mail addressed to us */
        if ((rng & 63) == 1)
            free(atomic_exchange(&soak_mailbox[index], NULL));
    }
    for (int i = 0; i < SOAK_BLOCKS; i++) {
        free(blocks[i]);
        blocks[i] = NULL;
    }
    return NULL;
}

static int soak_main(double seconds)
{
    pthread_t threads[SOAK_THREADS];
    for (int i = 0; i < SOAK_THREADS; i++)
        pthread_create(&threads[i], NULL, soak_thread, (void *)(uintptr_t)i);
    int samples = (int)seconds;
    if (samples < 3)
        samples = 3;
    size_t *rss = calloc((size_t)samples, sizeof *rss);
    printf("soak: %d threads for %d s (RSS and mapped, KiB, once a second)\n", SOAK_THREADS,
           samples);
    for (int i = 0; i < samples; i++) {
        sleep(1);
        cmalloc_stats stats;
        cmalloc_stats_get(&stats);
        rss[i] = resident_bytes();
        printf("  %4d s  rss %8zu  mapped %8zu  in use %8zu\n", i + 1, rss[i] / KiB,
               stats.bytes_mapped / KiB, stats.bytes_in_use / KiB);
        fflush(stdout);
    }
    soak_stop = 1;
    for (int i = 0; i < SOAK_THREADS; i++)
        pthread_join(threads[i], NULL);
    for (int i = 0; i < SOAK_THREADS; i++)
        free(atomic_exchange(&soak_mailbox[i], NULL));
    size_t first = 0, last = 0;
    int third = samples / 3;
    for (int i = 0; i < third; i++)
        first = rss[i] > first ? rss[i] : first;
    for (int i = samples - third; i < samples; i++)
        last = rss[i] > last ? rss[i] : last;
    bool ok = last <= first + first / 4 + 16 * MiB;
    printf("soak: highest RSS in the first third %zu KiB, in the last third %zu KiB: %s\n",
           first / KiB, last / KiB, ok ? "flat" : "GROWING");
    free(rss);
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc > 2 && strcmp(argv[1], "--idle-child") == 0)
        return idle_child_main(argv[2]);
    start_watchdog("test_release", argc > 1 && strcmp(argv[1], "--soak") == 0 ? 3600 : 180);
    if (argc > 1 && strcmp(argv[1], "--soak") == 0)
        return soak_main(argc > 2 ? atof(argv[2]) : 300);
    const char *filter = getenv("TEST_FILTER");
    if (filter != NULL)
        cmocka_set_test_filter(filter);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trim_returns_memory),
        cmocka_unit_test(test_trim_pagemap_leaves),
        cmocka_unit_test(test_idle_release),
        cmocka_unit_test(test_no_thread_by_default),
        cmocka_unit_test(test_thread_churn),
    };
    return cmocka_run_group_tests_name("release", tests, NULL, NULL);
}
