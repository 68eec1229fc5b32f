/* test_oom.c - out of memory, black box: every entry point fails cleanly and the heap survives.
 *
 * Linked with build/libcmalloc.a by the Makefile, so cmalloc serves every call here.
 *
 * Each test runs in a forked child (the address-space limit must not reach the parent or
 * cmocka). The child allocates objects of every kind and fills them with patterns, then lowers
 * RLIMIT_AS to a little above what it has mapped, so that any new mmap fails, and checks:
 *
 *   test_oom_every_entry_point  malloc, calloc, realloc (small and mremap'd), reallocarray,
 *                               posix_memalign, aligned_alloc, memalign, valloc, pvalloc of
 *                               sizes that need new memory return NULL (posix_memalign: ENOMEM,
 *                               *out untouched) with errno ENOMEM; realloc's old block is intact
 *   test_oom_exhaust_small      small and medium mallocs until the heap is exhausted: NULL with
 *                               ENOMEM, no crash; frees and mallocs still work at the limit
 *   test_oom_threads            two threads allocate until they see failures, while the limit
 *                               is on; after it is lifted they, a new thread and a forked child
 *                               (whose fork handlers take every allocator lock, so a lock left
 *                               held deadlocks it; an alarm turns that into a failure) allocate
 * and in every test, once the limit is lifted: allocation of every size works again, every
 * object made before (and during) the limit still holds its pattern, and cm_heap_check() holds.
 *
 *   test_heap_check_after_thread_exit   (no limit) a thread churns 10,000 mallocs and frees and
 *                               exits; cm_heap_check() holds right after (it once failed here).
 *
 * The child writes "FAIL <what>" lines on stdout and exits 1 on any failure; the parent shows
 * them. Runtime: about 0.1 s.

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
#include <sys/resource.h>
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

/* ---- child-side checks ---------------------------------------------------------------------- */

static atomic_int failures;

static void check(bool ok, const char *what)
{
    if (ok)
        return;
    char line[256];
    int n = snprintf(line, sizeof line, "FAIL %s\n", what);
    if (write(1, line, (size_t)n) < 0)
        _exit(3);
    atomic_fetch_add(&failures, 1);
}

/* A failed allocation: NULL with errno ENOMEM. */
static void check_enomem(void *p, int saved_errno, const char *what)
{
    char text[200];
    snprintf(text, sizeof text, "%s: got %p, errno %d (want NULL, ENOMEM)", what, p, saved_errno);
    check(p == NULL && saved_errno == ENOMEM, text);
    free(p);
}

static void fill(void *p, size_t n, unsigned tag)
{
    unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)(tag + i * 7);
}

static bool filled(const void *p, size_t n, unsigned tag)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != (unsigned char)(tag + i * 7))
            return false;
    return true;
}

/* Objects of every kind made before the limit, checked after it. */
enum { KEEP = 48 };
static const size_t keep_sizes[] = {8,         64,        500,     4000,    40 * KiB,
                                    256 * KiB, 700 * KiB, 3 * MiB, 12 * MiB};
enum { KEEP_KINDS = sizeof keep_sizes / sizeof keep_sizes[0] };
static void *keep[KEEP];

/* Big blocks are checked in their first and last 64 KiB only: the point is that they were
 * not moved or overwritten, and that costs no time. */
static void keep_fill(void *p, size_t n, unsigned tag)
{
    if (n <= 128 * KiB) {
        fill(p, n, tag);
    } else {
        fill(p, 64 * KiB, tag);
        fill((char *)p + n - 64 * KiB, 64 * KiB, tag + 1);
    }
}

static bool keep_filled(const void *p, size_t n, unsigned tag)
{
    if (n <= 128 * KiB)
        return filled(p, n, tag);
    return filled(p, 64 * KiB, tag) && filled((const char *)p + n - 64 * KiB, 64 * KiB, tag + 1);
}

static void make_keep(void)
{
    for (int i = 0; i < KEEP; i++) {
        size_t n = keep_sizes[i % KEEP_KINDS];
        keep[i] = malloc(n);
        check(keep[i] != NULL, "setup malloc");
        if (keep[i])
            keep_fill(keep[i], n, (unsigned)i);
    }
}

static void check_keep(const char *when)
{
    char text[128];
    for (int i = 0; i < KEEP; i++) {
        snprintf(text, sizeof text, "object %d (%zu bytes) intact %s", i,
                 keep_sizes[i % KEEP_KINDS], when);
        check(keep[i] && keep_filled(keep[i], keep_sizes[i % KEEP_KINDS], (unsigned)i), text);
    }
}

static void free_keep(void)
{
    for (int i = 0; i < KEEP; i++)
        free(keep[i]);
}

/* Virtual memory now in use, from /proc/self/statm (first field, in pages). */
static size_t vm_size(void)
{
    char text[128] = {0};
    FILE *f = fopen("/proc/self/statm", "r");
    if (f == NULL)
        return 0;
    size_t pages = 0;
    if (fgets(text, sizeof text, f))
        pages = strtoull(text, NULL, 10);
    fclose(f);
    return pages * (size_t)sysconf(_SC_PAGESIZE);
}

static void limit_address_space(size_t headroom)
{
    struct rlimit limit;
    getrlimit(RLIMIT_AS, &limit);
    limit.rlim_cur = vm_size() + headroom;
    check(setrlimit(RLIMIT_AS, &limit) == 0, "setrlimit(RLIMIT_AS)");
}

static void lift_limit(void)
{
    struct rlimit limit;
    getrlimit(RLIMIT_AS, &limit);
    limit.rlim_cur = limit.rlim_max;
    check(setrlimit(RLIMIT_AS, &limit) == 0, "lift RLIMIT_AS");
}

/* After the limit is lifted: every size allocates, fills and frees again. */
static void check_allocation_works(const char *when)
{
    static const size_t sizes[] = {1, 48, 1000, 30 * KiB, 200 * KiB, 600 * KiB, 5 * MiB, 64 * MiB};
    char text[128];
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        void *p = malloc(sizes[i]);
        snprintf(text, sizeof text, "malloc(%zu) %s", sizes[i], when);
        check(p != NULL, text);
        if (p) {
            keep_fill(p, sizes[i], 99);
            check(keep_filled(p, sizes[i], 99), text);
        }
        free(p);
    }
    void *a = NULL;
    check(posix_memalign(&a, 1 * MiB, 3 * MiB) == 0 && ((uintptr_t)a & (1 * MiB - 1)) == 0,
          "posix_memalign(1 MiB, 3 MiB) after the limit");
    free(a);
    void *c = calloc(1000, 1000);
    check(c != NULL && ((char *)c)[999999] == 0, "calloc(1000, 1000) after the limit");
    free(c);
}

/* ---- the scenarios (each the body of a child) ---------------------------------------------- */

static void every_entry_point(void)
{
    make_keep();
    char *small = opaque(malloc(100)), *huge = opaque(malloc(16 * MiB));
    check(small && huge, "setup small and huge");
    fill(small, 100, 5);
    keep_fill(huge, 16 * MiB, 6);
    limit_address_space(1 * MiB);

    void *p;
    int e;
    /* each size below needs memory the limit forbids */
    errno = 0, p = malloc(256 * MiB), e = errno, check_enomem(p, e, "malloc(256 MiB)");
    errno = 0, p = malloc(6 * MiB), e = errno, check_enomem(p, e, "malloc(6 MiB) (page heap)");
    errno = 0, p = calloc(1, 64 * MiB), e = errno, check_enomem(p, e, "calloc(1, 64 MiB)");
    errno = 0, p = calloc(4 * MiB, 2), e = errno, check_enomem(p, e, "calloc(4 Mi, 2)");
    errno = 0, p = realloc(opaque(small), 64 * MiB), e = errno,
    check_enomem(p, e, "realloc(small, 64 MiB)");
    check(filled(small, 100, 5), "realloc's old small block intact after failing");
    errno = 0, p = realloc(opaque(small), 6 * MiB), e = errno,
    check_enomem(p, e, "realloc(small, 6 MiB)");
    errno = 0, p = realloc(opaque(huge), 512 * MiB), e = errno;
    check_enomem(p, e, "realloc(16 MiB, 512 MiB) (mremap)");
    check(keep_filled(huge, 16 * MiB, 6), "realloc's old 16 MiB block intact after failing");
    errno = 0, p = reallocarray(opaque(small), 16 * MiB, 4), e = errno;
    check_enomem(p, e, "reallocarray(small, 16 Mi, 4)");
    check(filled(small, 100, 5), "reallocarray's old block intact after failing");
    void *out = opaque((void *)0x1234);
    int r = posix_memalign(&out, 4096, 64 * MiB);
    check(r == ENOMEM && out == (void *)0x1234,
          "posix_memalign(4096, 64 MiB) == ENOMEM, out untouched");
    r = posix_memalign(&out, 2 * MiB, 4 * MiB);
    check(r == ENOMEM && out == (void *)0x1234, "posix_memalign(2 MiB, 4 MiB) == ENOMEM");
    errno = 0, p = aligned_alloc(64, 64 * MiB), e = errno,
    check_enomem(p, e, "aligned_alloc(64, 64 MiB)");
    errno = 0, p = aligned_alloc(1 * MiB, 6 * MiB), e = errno;
    check_enomem(p, e, "aligned_alloc(1 MiB, 6 MiB)");
    errno = 0, p = memalign(256, 64 * MiB), e = errno, check_enomem(p, e, "memalign(256, 64 MiB)");
    errno = 0, p = valloc(64 * MiB), e = errno, check_enomem(p, e, "valloc(64 MiB)");
    errno = 0, p = pvalloc(64 * MiB - 1), e = errno, check_enomem(p, e, "pvalloc(64 MiB - 1)");
    /* and a second time, to see no lock or state was left behind by the first failures */
    errno = 0, p = malloc(256 * MiB), e = errno, check_enomem(p, e, "malloc(256 MiB) again");
    errno = 0, p = malloc(6 * MiB), e = errno, check_enomem(p, e, "malloc(6 MiB) again");
    check_keep("under the limit");
    check(cm_heap_check(), "cm_heap_check() under the limit");

    lift_limit();
    check_keep("after the limit");
    check(filled(small, 100, 5) && keep_filled(huge, 16 * MiB, 6), "small and huge intact");
    char *grown = realloc(huge, 64 * MiB);
    check(grown != NULL, "realloc(16 MiB, 64 MiB) after the limit");
    if (grown) {
        check(keep_filled(grown, 16 * MiB, 6), "realloc kept the 16 MiB");
        huge = grown;
    }
    check_allocation_works("after the limit");
    check(cm_heap_check(), "cm_heap_check() after the limit");
    free(small);
    free(huge);
    free_keep();
    check(cm_heap_check(), "cm_heap_check() at the end");
}

/* Allocates blocks of size until malloc fails (or max blocks), linking them through their
 * first word. Returns the list; *count gets how many. */
static void *exhaust(size_t size, size_t max, size_t *count, const char *what)
{
    void *list = NULL;
    size_t n = 0;
    char text[160];
    for (; n < max; n++) {
        errno = 0;
        void **p = malloc(size);
        if (p == NULL) {
            snprintf(text, sizeof text, "%s: malloc(%zu) failed with errno %d (want ENOMEM)", what,
                     size, errno);
            check(errno == ENOMEM, text);
            break;
        }
        fill(p + 1, size - sizeof *p < 256 ? size - sizeof *p : 256, (unsigned)size);
        *p = list;
        list = p;
    }
    snprintf(text, sizeof text, "%s: malloc(%zu) never failed after %zu blocks", what, size, n);
    check(n < max, text);
    *count = n;
    return list;
}

static size_t free_list_checked(void *list, size_t size, const char *what)
{
    size_t n = 0, bad = 0;
    while (list) {
        void **p = list;
        list = *p;
        bad += !filled(p + 1, size - sizeof *p < 256 ? size - sizeof *p : 256, (unsigned)size);
        free(p);
        n++;
    }
    check(bad == 0, what);
    return n;
}

static void exhaust_small(void)
{
    make_keep();
    limit_address_space(4 * MiB);
    static const size_t sizes[] = {64, 1000, 20000, 200 * KiB};
    void *lists[4];
    size_t counts[4];
    for (int i = 0; i < 4; i++)
        lists[i] = exhaust(sizes[i], 2000000, &counts[i], "exhausting");
    /* At the limit, what was freed is reused: free half of the 64-byte blocks, reallocate. */
    void **p = lists[0];
    size_t reused = 0;
    for (int i = 0; i < 100 && p && *p; i++) {
        void **next = *p, **after = *next;
        free(next); /* unlink and free the second of each pair */
        *p = after;
        void **again = malloc(64);
        if (again) {
            fill(again + 1, 56, 64);
            *again = lists[0];
            lists[0] = again;
            reused++;
        }
        p = after;
    }
    check(reused > 0, "a freed block is reused at the limit");
    check(cm_heap_check(), "cm_heap_check() at the limit");
    check_keep("at the limit");
    lift_limit();
    for (int i = 0; i < 4; i++) {
        char text[96];
        snprintf(text, sizeof text, "blocks of %zu allocated at the limit intact", sizes[i]);
        free_list_checked(lists[i], sizes[i], text);
    }
    check_keep("after the limit");
    check_allocation_works("after the limit");
    check(cm_heap_check(), "cm_heap_check() after the limit");
    free_keep();
}

/* Two threads allocate mixed sizes until each has seen failures; the main thread lifts the
 * limit; they then allocate successfully and stop. Under the limit a thread can go on for good
 * without a failure: once its blocks' sizes have settled, the page heap's free spans serve
 * every request (seen: 1 run in 30 of the debug build past 30 s). So every 64th step under
 * the limit also asks for more than the heap holds, which must fail, with ENOMEM, however the
 * mixed sizes fare. */
enum { PHASE_LIMITED = 1, PHASE_LIFTED = 2, PHASE_STOP = 3 };
static atomic_int phase, thread_failures_seen, threads_succeeded_after;

static void *oom_thread(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    void *held[256] = {0};
    bool saw_failure = false, succeeded_after = false;
    while (atomic_load(&phase) != PHASE_STOP) {
        int now = atomic_load(&phase);
        seed = seed * 1103515245u + 12345u;
        size_t slot = (seed >> 8) % 256;
        size_t size =
            (seed >> 16) % 4 == 0 ? 300 * KiB + (seed >> 20) % (2 * MiB) : 16 + (seed >> 18) % 4000;
        if (held[slot]) {
            check(filled(held[slot], 16, (unsigned)slot), "a thread's block intact");
            free(held[slot]);
            held[slot] = NULL;
        }
        if (now == PHASE_LIMITED && slot % 64 == 0)
            size = 256 * MiB; /* past every free span and the limit: fails */
        errno = 0;
        void *p = malloc(size);
        if (p == NULL) {
            check(errno == ENOMEM, "thread: malloc failed without ENOMEM");
            if (now == PHASE_LIMITED && !saw_failure) {
                saw_failure = true;
                atomic_fetch_add(&thread_failures_seen, 1);
            }
            continue;
        }
        fill(p, 16, (unsigned)slot);
        held[slot] = p;
        if (now == PHASE_LIFTED && !succeeded_after) {
            succeeded_after = true;
            atomic_fetch_add(&threads_succeeded_after, 1);
        }
    }
    for (int i = 0; i < 256; i++)
        free(held[i]);
    return NULL;
}

static void *new_thread(void *arg)
{
    (void)arg;
    void *p = malloc(1000), *q = malloc(1 * MiB);
    check(p && q, "a new thread allocates after the limit");
    free(p);
    free(q);
    return NULL;
}

static void wait_until(atomic_int *counter, int value, int seconds, const char *what)
{
    for (int i = 0; i < seconds * 1000 && atomic_load(counter) < value; i++)
        usleep(1000);
    check(atomic_load(counter) >= value, what);
}

static void oom_threads(void)
{
    make_keep();
    pthread_t threads[2];
    atomic_store(&phase, 0);
    for (int i = 0; i < 2; i++)
        check(pthread_create(&threads[i], NULL, oom_thread, (void *)(uintptr_t)(i + 1)) == 0,
              "pthread_create");
    usleep(2000);
    limit_address_space(2 * MiB);
    atomic_store(&phase, PHASE_LIMITED);
    /* Generous: a thread that reuses the page heap's free spans can go a while without a
     * failure, and on a loaded 2-core machine 5 s was seen to be too short (1 run in 30). */
    wait_until(&thread_failures_seen, 2, 30, "both threads saw malloc fail under the limit");
    lift_limit();
    atomic_store(&phase, PHASE_LIFTED);
    wait_until(&threads_succeeded_after, 2, 30, "both threads allocate after the limit");
    pthread_t late;
    check(pthread_create(&late, NULL, new_thread, NULL) == 0, "pthread_create after the limit");
    pthread_join(late, NULL);
    /* fork takes every allocator lock: a lock left held by a failed path hangs here */
    pid_t pid = fork();
    if (pid == 0) {
        alarm(5);
        void *p = malloc(5000), *q = malloc(2 * MiB);
        _exit(p && q ? 0 : 1);
    }
    int status = 0;
    check(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
              WEXITSTATUS(status) == 0,
          "a forked child allocates after the limit (no lock left held)");
    atomic_store(&phase, PHASE_STOP);
    for (int i = 0; i < 2; i++)
        pthread_join(threads[i], NULL);
    check_keep("after the threads' limit");
    check_allocation_works("after the threads' limit");
    check(cm_heap_check(), "cm_heap_check() after the threads");
    free_keep();
}

/* ---- parent side ----------------------------------------------------------------------------- */

/* In the child: the body, then an exit status that says whether any check failed. */
static void checked_body(void *body)
{
    (*(void (**)(void))body)();
    _exit(atomic_load(&failures) == 0 ? 0 : 1);
}

static void run_in_child(void (*body)(void), const char *name)
{
    static child_result result;
    child_spec spec = {
        .body = checked_body, .arg = &body, .with_stdout = true, .alarm_seconds = 30};
    run_child(&spec, &result);
    int status = result.status;
    if (WIFSIGNALED(status))
        fail_msg("%s: the child was killed by signal %d (%s); its output:\n%s", name,
                 WTERMSIG(status), strsignal(WTERMSIG(status)), result.output);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("%s: the child failed; its output:\n%s", name, result.output);
}

static void test_oom_every_entry_point(void **state)
{
    (void)state;
    run_in_child(every_entry_point, "every entry point");
}

static void test_oom_exhaust_small(void **state)
{
    (void)state;
    run_in_child(exhaust_small, "exhaust small");
}

static void test_oom_threads(void **state)
{
    (void)state;
    run_in_child(oom_threads, "threads");
}

/* One thread makes 10,000 seeded mallocs and frees (16..4000 bytes) and exits. */
static void *churn_and_exit(void *arg)
{
    (void)arg;
    unsigned seed = 1;
    void *held[256] = {0};
    for (int k = 0; k < 10000; k++) {
        seed = seed * 1103515245u + 12345u;
        size_t slot = (seed >> 8) % 256;
        free(held[slot]);
        held[slot] = malloc(16 + (seed >> 18) % 4000);
    }
    for (int i = 0; i < 256; i++)
        free(held[i]);
    return NULL;
}

/* The heap check right after a thread's cache was flushed into the transfer caches at its
 * exit (cm_central_valid once counted those objects twice and failed on a sound heap). */
static void heap_check_after_thread_exit(void)
{
    pthread_t thread;
    check(pthread_create(&thread, NULL, churn_and_exit, NULL) == 0, "pthread_create");
    pthread_join(thread, NULL);
    check(cm_heap_check(), "cm_heap_check() after a thread exited");
}

static void test_heap_check_after_thread_exit(void **state)
{
    (void)state;
    run_in_child(heap_check_after_thread_exit, "heap check after thread exit");
}

int main(void)
{
    start_watchdog("test_oom", 120);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_oom_every_entry_point),
        cmocka_unit_test(test_oom_exhaust_small),
        cmocka_unit_test(test_oom_threads),
        cmocka_unit_test(test_heap_check_after_thread_exit),
    };
    return cmocka_run_group_tests_name("oom", tests, NULL, NULL);
}
