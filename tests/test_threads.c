/* test_threads.c - the malloc family under threads, black box.
 *
 * Linked with build/libcmalloc.a by the Makefile, so cmalloc serves every call here.
 *
 *   test_random_threads       8 threads allocate, realloc and free random sizes (seeded); every
 *                             object is filled with a tag at allocation and checked at free,
 *                             so overlapping or corrupted objects are caught; meanwhile the
 *                             main thread calls malloc_trim(0) and reads the statistics.
 *   test_cross_thread_free    producers allocate, consumers (other threads) check and free,
 *                             through a queue; over several rounds the memory held must not
 *                             grow, and bytes in use come back to where they were.
 *   test_short_lived_threads  5000 threads, each allocating, freeing and handing one object to
 *                             the main thread, then exiting: memory held after 5000 is not more
 *                             than after 1000 (generous bound), and no thread cache outlives
 *                             its thread.
 *   test_malloc_in_thread_exit_destructors  a pthread key destructor that runs after the
 *                             allocator's own (3 rounds per thread, 400 threads) frees the
 *                             thread's block, mallocs and frees: it works, and neither
 *                             memory nor thread caches leak.
 *   test_fork_while_allocating up to 300 forks (12 s at most, 20 at least) while 2 threads
 *                             allocate: every child mallocs and frees, frees a block of the
 *                             parent, sometimes starts a thread or forks a grandchild, and
 *                             _exits; some forks are made from a thread other
 *                             than the main one; a child that deadlocks is killed (its own
 *                             alarm after 10 s, or the parent after 15 s) and a parent stuck in
 *                             fork() for 30 s ends the binary: a deadlock fails, never hangs.
 *   test_fork_with_allocating_atfork_handlers  pthread_atfork handlers registered by a
 *                             constructor before main malloc and free in prepare, parent and
 *                             child (allowed with glibc): fork neither deadlocks nor fails.
 *
 * The seed is printed; set TEST_SEED to repeat a run, TEST_FILTER (a cmocka
 * glob such as "*fork*") to run some tests only. Runtime on two cores: about 20 s at most,
 * 12 of them in the forks (fork is slow on small VMs).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
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
#include "rng.h"

static unsigned test_seed;

static uint64_t rng_seed(unsigned stream)
{
    uint64_t s = ((uint64_t)test_seed << 20) ^ (stream * 0x9e3779b97f4a7c15ull) ^ 0x5bd1e995;
    return s ? s : 1;
}

/* Random size: mostly small, some medium, a few large (up to 2 MiB), and very rarely huge
 * (8 to 20 MiB: above the mmap threshold, so realloc of those goes through mremap). */
static size_t random_size(uint64_t *rng)
{
    uint64_t r = rng_next(rng);
    unsigned pick = (unsigned)(r % 1000);
    r >>= 10;
    if (pick < 850)
        return (size_t)(r % 512);
    if (pick < 990)
        return (size_t)(r % (32 * KiB));
    if (pick < 999)
        return (size_t)(r % (300 * KiB));
    if ((r >> 32) % 32 == 0)
        return 8 * MiB + (size_t)(r % (12 * MiB));
    return (size_t)(r % (2 * MiB));
}

/* Objects carry their size and a tag in every byte: tag_fill at allocation, tag_check before
 * free. The first word also holds size ^ tag so a swapped object is noticed. */
static void tag_fill(void *p, size_t n, uint64_t tag)
{
    memset(p, (int)(tag & 0xff), n);
    if (n >= sizeof(uint64_t)) {
        uint64_t head = (uint64_t)n ^ tag;
        memcpy(p, &head, sizeof head);
    }
    clobber(p);
}

/* Returns 1 when the object is intact. */
static int tag_check(const void *p, size_t n, uint64_t tag)
{
    const unsigned char *b = opaque((void *)p);
    size_t i = 0;
    if (n >= sizeof(uint64_t)) {
        uint64_t head;
        memcpy(&head, b, sizeof head);
        if (head != ((uint64_t)n ^ tag))
            return 0;
        i = sizeof(uint64_t);
    }
    const unsigned char v = (unsigned char)(tag & 0xff);
    const uint64_t word = 0x0101010101010101ull * v;
    for (; i < n && (i & 7) != 0; i++)
        if (b[i] != v)
            return 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, sizeof w);
        if (w != word)
            return 0;
    }
    for (; i < n; i++)
        if (b[i] != v)
            return 0;
    return 1;
}

/* Errors found in worker threads: cmocka's asserts only work on the test's own thread. */
static atomic_int worker_errors;
static char worker_error_text[512];

static void worker_error(const char *fmt, ...)
{
    if (atomic_fetch_add(&worker_errors, 1) == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(worker_error_text, sizeof worker_error_text, fmt, ap);
        va_end(ap);
    }
}

static void expect_no_worker_errors(void)
{
    int n = atomic_load(&worker_errors);
    if (n != 0)
        fail_msg("%d error(s) in worker threads (seed %u); first: %s", n, test_seed,
                 worker_error_text);
}

static void start_threads(pthread_t *t, int n, void *(*fn)(void *), void *args, size_t arg_size)
{
    for (int i = 0; i < n; i++) {
        int rc = pthread_create(&t[i], NULL, fn, (char *)args + (size_t)i * arg_size);
        if (rc != 0)
            fail_msg("pthread_create: %s", strerror(rc));
    }
}

static void join_threads(pthread_t *t, int n)
{
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
}

/* ---------------------------------------------------------------------------------------- */
/* Many threads, random sizes, content checked at free. */

enum { RANDOM_THREADS = 8, RANDOM_SLOTS = 512, RANDOM_STEPS = 120000 };

struct random_arg {
    int index;
};

static atomic_int random_done;

static void *random_worker(void *argp)
{
    struct random_arg *arg = argp;
    uint64_t rng = rng_seed((unsigned)arg->index + 1);
    void **slot = calloc(RANDOM_SLOTS, sizeof *slot);
    size_t *size = calloc(RANDOM_SLOTS, sizeof *size);
    uint64_t *tag = calloc(RANDOM_SLOTS, sizeof *tag);
    if (slot == NULL || size == NULL || tag == NULL) {
        worker_error("thread %d: calloc of its slot arrays failed", arg->index);
        return NULL;
    }
    for (int step = 0; step < RANDOM_STEPS; step++) {
        uint64_t r = rng_next(&rng);
        int i = (int)(r % RANDOM_SLOTS);
        unsigned op = (unsigned)((r >> 16) % 16);
        if (slot[i] != NULL && op < 14) {
            if (!tag_check(slot[i], size[i], tag[i])) {
                worker_error("thread %d step %d: object %p of %zu bytes corrupted before free",
                             arg->index, step, slot[i], size[i]);
                return NULL;
            }
            if (op == 0) { /* grow or shrink in place of a free */
                size_t n = random_size(&rng);
                void *q = realloc(slot[i], n);
                if (q == NULL && n != 0) {
                    worker_error("thread %d: realloc(%zu) returned NULL", arg->index, n);
                    return NULL;
                }
                if (q != NULL) {
                    size_t common = n < size[i] ? n : size[i];
                    /* The common prefix keeps the tag bytes (the head word only when the
                     * whole object survived). */
                    const unsigned char *b = q;
                    for (size_t k = sizeof(uint64_t); k < common; k++)
                        if (b[k] != (unsigned char)(tag[i] & 0xff)) {
                            worker_error("thread %d: realloc(%zu -> %zu) lost byte %zu", arg->index,
                                         size[i], n, k);
                            return NULL;
                        }
                    tag[i] = rng_next(&rng);
                    tag_fill(q, n, tag[i]);
                }
                slot[i] = q;
                size[i] = n;
            } else {
                free(slot[i]);
                slot[i] = NULL;
            }
            continue;
        }
        if (slot[i] != NULL) {
            free(slot[i]);
            slot[i] = NULL;
        }
        size_t n = random_size(&rng);
        void *p;
        if (op == 14) {
            p = calloc(1, n);
            if (p != NULL) {
                const unsigned char *b = p;
                for (size_t k = 0; k < n; k++)
                    if (b[k] != 0) {
                        worker_error("thread %d: calloc(%zu) byte %zu not zero", arg->index, n, k);
                        return NULL;
                    }
            }
        } else if (op == 15) {
            p = memalign((size_t)64 << (r % 7), n);
            if (p != NULL && ((uintptr_t)p & (((size_t)64 << (r % 7)) - 1)) != 0) {
                worker_error("thread %d: memalign(%zu) = %p misaligned", arg->index,
                             (size_t)64 << (r % 7), p);
                return NULL;
            }
        } else {
            p = malloc(n);
        }
        if (p == NULL) {
            worker_error("thread %d: allocation of %zu bytes returned NULL", arg->index, n);
            return NULL;
        }
        if (((uintptr_t)p & 15) != 0) {
            worker_error("thread %d: %p (size %zu) not 16-byte aligned", arg->index, p, n);
            return NULL;
        }
        tag[i] = rng_next(&rng);
        tag_fill(p, n, tag[i]);
        slot[i] = p;
        size[i] = n;
    }
    for (int i = 0; i < RANDOM_SLOTS; i++)
        if (slot[i] != NULL) {
            if (!tag_check(slot[i], size[i], tag[i]))
                worker_error("thread %d: object of %zu bytes corrupted at the end", arg->index,
                             size[i]);
            free(slot[i]);
        }
    free(slot);
    free(size);
    free(tag);
    atomic_fetch_add(&random_done, 1);
    return NULL;
}

static void test_random_threads(void **state)
{
    (void)state;
    pthread_t t[RANDOM_THREADS];
    struct random_arg args[RANDOM_THREADS];
    atomic_store(&worker_errors, 0);
    cmalloc_stats before = stats_now();
    for (int i = 0; i < RANDOM_THREADS; i++)
        args[i].index = i;
    atomic_store(&random_done, 0);
    start_threads(t, RANDOM_THREADS, random_worker, args, sizeof args[0]);
    /* Meanwhile, give memory back to the OS and read the statistics again and again: a span
     * released while another thread uses it would show up as a corrupted object. */
    int devnull = open("/dev/null", O_WRONLY);
    assert_true(devnull >= 0);
    for (unsigned n = 0; atomic_load(&random_done) < RANDOM_THREADS; n++) {
        malloc_trim(0);
        cmalloc_stats s;
        cmalloc_stats_get(&s);
        struct mallinfo2 mi = mallinfo2();
        (void)mi;
        if (n % 16 == 0)
            cmalloc_stats_print(devnull);
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    close(devnull);
    join_threads(t, RANDOM_THREADS);
    expect_no_worker_errors();
    cmalloc_stats after = stats_now();
    /* Everything the threads allocated was freed. */
    if (after.bytes_in_use > before.bytes_in_use + 1 * MiB)
        fail_msg("bytes_in_use %zu before the threads, %zu after they freed everything",
                 before.bytes_in_use, after.bytes_in_use);
}

/* ---------------------------------------------------------------------------------------- */
/* Producer/consumer: objects freed by a thread other than the one that allocated them. */

enum { QUEUE_CAP = 8192, PRODUCERS = 2, CONSUMERS = 2, PER_PRODUCER = 150000, BATCH = 32 };

struct message {
    size_t size;
    uint64_t tag;
    void *object;
};

static struct {
    pthread_mutex_t lock;
    pthread_cond_t not_empty, not_full;
    struct message ring[QUEUE_CAP];
    size_t head, count;
    int producers_left;
} queue = {PTHREAD_MUTEX_INITIALIZER,
           PTHREAD_COND_INITIALIZER,
           PTHREAD_COND_INITIALIZER,
           {{0, 0, NULL}},
           0,
           0,
           0};

static void queue_push(const struct message *m, int n)
{
    pthread_mutex_lock(&queue.lock);
    while (queue.count + (size_t)n > QUEUE_CAP)
        pthread_cond_wait(&queue.not_full, &queue.lock);
    for (int i = 0; i < n; i++)
        queue.ring[(queue.head + queue.count++) % QUEUE_CAP] = m[i];
    pthread_cond_broadcast(&queue.not_empty);
    pthread_mutex_unlock(&queue.lock);
}

/* Returns how many messages were taken; 0 when every producer is done and the queue is empty. */
static int queue_pop(struct message *m, int max)
{
    pthread_mutex_lock(&queue.lock);
    while (queue.count == 0 && queue.producers_left > 0)
        pthread_cond_wait(&queue.not_empty, &queue.lock);
    int n = 0;
    while (n < max && queue.count > 0) {
        m[n++] = queue.ring[queue.head];
        queue.head = (queue.head + 1) % QUEUE_CAP;
        queue.count--;
    }
    pthread_cond_broadcast(&queue.not_full);
    pthread_mutex_unlock(&queue.lock);
    return n;
}

struct pc_arg {
    int index;
    unsigned round;
};

static void *producer(void *argp)
{
    struct pc_arg *arg = argp;
    uint64_t rng = rng_seed(100 + arg->round * 16 + (unsigned)arg->index);
    struct message batch[BATCH];
    int n = 0;
    for (int k = 0; k < PER_PRODUCER; k++) {
        uint64_t r = rng_next(&rng);
        size_t size = (r & 0xff) < 250 ? (size_t)((r >> 8) % 1024) : (size_t)((r >> 8) % 65536);
        if ((r >> 40) % 1024 == 0) /* now and then a large object, freed by another thread too */
            size = 256 * KiB + (size_t)((r >> 8) % (2 * MiB));
        void *p = malloc(size);
        if (p == NULL) {
            worker_error("producer %d: malloc(%zu) returned NULL", arg->index, size);
            size = 0;
        } else {
            tag_fill(p, size, r);
        }
        batch[n++] = (struct message){size, r, p};
        if (n == BATCH) {
            queue_push(batch, n);
            n = 0;
        }
    }
    if (n > 0)
        queue_push(batch, n);
    pthread_mutex_lock(&queue.lock);
    queue.producers_left--;
    pthread_cond_broadcast(&queue.not_empty);
    pthread_mutex_unlock(&queue.lock);
    return NULL;
}

static void *consumer(void *argp)
{
    struct pc_arg *arg = argp;
    struct message m[BATCH];
    int n;
    unsigned count = 0;
    while ((n = queue_pop(m, BATCH)) > 0)
        for (int i = 0; i < n; i++) {
            if (m[i].object == NULL)
                continue;
            if (!tag_check(m[i].object, m[i].size, m[i].tag)) {
                worker_error("consumer %d: object %p of %zu bytes from another thread corrupted",
                             arg->index, m[i].object, m[i].size);
                continue;
            }
            if (++count % 64 == 0) {
                /* realloc of another thread's object, then free. */
                void *q = realloc(m[i].object, m[i].size + 100);
                if (q == NULL) {
                    worker_error("consumer %d: realloc returned NULL", arg->index);
                    free(m[i].object);
                    continue;
                }
                m[i].object = q;
            }
            free(m[i].object);
        }
    return NULL;
}

static void test_cross_thread_free(void **state)
{
    (void)state;
    enum { ROUNDS = 3 };
    atomic_store(&worker_errors, 0);
    cmalloc_stats start = stats_now();
    size_t mapped_after_first = 0;
    size_t rss_start = resident_bytes();
    for (unsigned round = 0; round < ROUNDS; round++) {
        pthread_t p[PRODUCERS], c[CONSUMERS];
        struct pc_arg pa[PRODUCERS], ca[CONSUMERS];
        queue.producers_left = PRODUCERS;
        for (int i = 0; i < PRODUCERS; i++)
            pa[i] = (struct pc_arg){i, round};
        for (int i = 0; i < CONSUMERS; i++)
            ca[i] = (struct pc_arg){i, round};
        start_threads(c, CONSUMERS, consumer, ca, sizeof ca[0]);
        start_threads(p, PRODUCERS, producer, pa, sizeof pa[0]);
        join_threads(p, PRODUCERS);
        join_threads(c, CONSUMERS);
        expect_no_worker_errors();
        assert_int_equal(queue.count, 0);
        cmalloc_stats s = stats_now();
        print_message("  round %u: bytes_in_use %zu, bytes_mapped %zu, released %zu\n", round,
                      s.bytes_in_use, s.bytes_mapped, s.bytes_released);
        if (s.bytes_in_use > start.bytes_in_use + 1 * MiB)
            fail_msg("round %u: bytes_in_use %zu, %zu before: objects freed by another thread "
                     "are not accounted as freed",
                     round, s.bytes_in_use, start.bytes_in_use);
        if (round == 0)
            mapped_after_first = s.bytes_mapped;
        else if (s.bytes_mapped > mapped_after_first + mapped_after_first / 2 + 16 * MiB)
            fail_msg("round %u: bytes_mapped %zu, %zu after round 0: memory freed by other "
                     "threads is not reused",
                     round, s.bytes_mapped, mapped_after_first);
    }
    /* Everything is freed and the threads are gone: malloc_trim(0) gives it back to the OS. */
    malloc_trim(0);
    cmalloc_stats trimmed = stats_now();
    size_t rss_trimmed = resident_bytes();
    print_message("  after malloc_trim(0): rss %zu (%zu at the start), bytes_mapped %zu, "
                  "released %zu\n",
                  rss_trimmed, rss_start, trimmed.bytes_mapped, trimmed.bytes_released);
    if (rss_trimmed > rss_start + 16 * MiB)
        fail_msg("RSS %zu MiB after the producer/consumer rounds and malloc_trim(0), %zu MiB "
                 "before them: freed memory is not returned to the OS",
                 rss_trimmed >> 20, rss_start >> 20);
}

/* ---------------------------------------------------------------------------------------- */
/* Thousands of short-lived threads. */

enum { SHORT_THREADS = 5000, SHORT_WARMUP = 1000, SHORT_CONCURRENT = 4 };

struct short_arg {
    unsigned index;
    void *handed_over; /* one object allocated by the thread, freed by the main thread */
    size_t handed_size;
    int ok;
};

static void *short_worker(void *argp)
{
    struct short_arg *arg = argp;
    uint64_t rng = rng_seed(1000 + arg->index);
    void *p[64];
    size_t n[64];
    for (int i = 0; i < 64; i++) {
        n[i] = (size_t)(rng_next(&rng) % 4096);
        p[i] = malloc(n[i]);
        if (p[i] == NULL)
            return NULL;
        tag_fill(p[i], n[i], arg->index);
    }
    void *big = malloc(100 * KiB);
    if (big == NULL)
        return NULL;
    tag_fill(big, 100 * KiB, arg->index);
    for (int i = 1; i < 64; i++) {
        if (!tag_check(p[i], n[i], arg->index))
            return NULL;
        free(p[i]);
    }
    free(big);
    arg->handed_over = p[0];
    arg->handed_size = n[0];
    arg->ok = 1;
    return NULL;
}

static void run_short_threads(unsigned from, unsigned to)
{
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * KiB);
    for (unsigned base = from; base < to; base += SHORT_CONCURRENT) {
        pthread_t t[SHORT_CONCURRENT];
        struct short_arg a[SHORT_CONCURRENT];
        for (int i = 0; i < SHORT_CONCURRENT; i++) {
            a[i] = (struct short_arg){base + (unsigned)i, NULL, 0, 0};
            int rc = pthread_create(&t[i], &attr, short_worker, &a[i]);
            if (rc != 0)
                fail_msg("pthread_create #%u: %s", base + (unsigned)i, strerror(rc));
        }
        for (int i = 0; i < SHORT_CONCURRENT; i++) {
            pthread_join(t[i], NULL);
            if (!a[i].ok)
                fail_msg("short-lived thread %u: an allocation failed or was corrupted",
                         a[i].index);
            if (!tag_check(a[i].handed_over, a[i].handed_size, a[i].index))
                fail_msg("object of exited thread %u corrupted", a[i].index);
            free(a[i].handed_over);
        }
    }
    pthread_attr_destroy(&attr);
}

static void test_short_lived_threads(void **state)
{
    (void)state;
    cmalloc_stats start = stats_now();
    run_short_threads(0, SHORT_WARMUP);
    cmalloc_stats warm = stats_now();
    size_t rss_warm = resident_bytes();
    run_short_threads(SHORT_WARMUP, SHORT_THREADS);
    cmalloc_stats end = stats_now();
    size_t rss_end = resident_bytes();
    print_message("  after %d threads: bytes_mapped %zu, rss %zu; after %d: bytes_mapped %zu, "
                  "rss %zu, live thread caches %zu\n",
                  SHORT_WARMUP, warm.bytes_mapped, rss_warm, SHORT_THREADS, end.bytes_mapped,
                  rss_end, end.thread_caches);
    /* 4000 more threads: a leak of even 4 KiB per thread would be 16 MiB. */
    const size_t bound = 12 * MiB;
    if (end.bytes_mapped > warm.bytes_mapped + bound)
        fail_msg("bytes_mapped grew from %zu to %zu over %d more short-lived threads",
                 warm.bytes_mapped, end.bytes_mapped, SHORT_THREADS - SHORT_WARMUP);
    if (rss_end > rss_warm + bound)
        fail_msg("RSS grew from %zu to %zu over %d more short-lived threads", rss_warm, rss_end,
                 SHORT_THREADS - SHORT_WARMUP);
    if (end.bytes_in_use > start.bytes_in_use + 1 * MiB)
        fail_msg("bytes_in_use %zu before the threads, %zu after all were joined and freed",
                 start.bytes_in_use, end.bytes_in_use);
    /* The thread caches of exited threads are gone (flushed at thread exit). */
    if (end.thread_caches > 8)
        fail_msg("%zu live thread caches after every short-lived thread exited", end.thread_caches);
}

/* ---------------------------------------------------------------------------------------- */
/* Allocation in other libraries' thread-exit destructors, after the allocator's own ran. */

enum { EXIT_THREADS = 400, EXIT_ROUNDS = 3 };

static pthread_key_t late_key;
static atomic_int late_destructor_runs;

/* Runs at thread exit, in key order after a key created before it (cmalloc's, created on the
 * first malloc), and again (up to PTHREAD_DESTRUCTOR_ITERATIONS) while it sets a new value. */
static void late_destructor(void *value)
{
    uintptr_t *block = value;
    uintptr_t round = block[0];
    if (!tag_check(block + 1, 200, round))
        worker_error("thread-exit destructor: the thread's block was corrupted");
    free(block);
    void *p[16];
    for (int i = 0; i < 16; i++) {
        p[i] = malloc((size_t)(i + 1) * 100);
        if (p[i] == NULL) {
            worker_error("malloc in a thread-exit destructor returned NULL");
            return;
        }
        tag_fill(p[i], (size_t)(i + 1) * 100, round + (uintptr_t)i);
    }
    for (int i = 0; i < 16; i++) {
        if (!tag_check(p[i], (size_t)(i + 1) * 100, round + (uintptr_t)i))
            worker_error("object allocated in a thread-exit destructor corrupted");
        free(p[i]);
    }
    atomic_fetch_add(&late_destructor_runs, 1);
    if (round + 1 < EXIT_ROUNDS) { /* ask for one more destructor round, with a new block */
        uintptr_t *next = malloc(sizeof(uintptr_t) + 200);
        if (next == NULL) {
            worker_error("malloc in a thread-exit destructor returned NULL");
            return;
        }
        next[0] = round + 1;
        tag_fill(next + 1, 200, round + 1);
        pthread_setspecific(late_key, next);
    }
}

static void *late_worker(void *argp)
{
    (void)argp;
    void *first = malloc(64); /* the allocator sets up this thread's cache (and its key) */
    free(first);
    uintptr_t *block = malloc(sizeof(uintptr_t) + 200);
    if (block == NULL) {
        worker_error("malloc returned NULL");
        return NULL;
    }
    block[0] = 0;
    tag_fill(block + 1, 200, 0);
    pthread_setspecific(late_key, block);
    return NULL;
}

static void test_malloc_in_thread_exit_destructors(void **state)
{
    (void)state;
    atomic_store(&worker_errors, 0);
    atomic_store(&late_destructor_runs, 0);
    /* Our key is created after the allocator's (the allocator is initialized by now). */
    free(malloc(1));
    assert_int_equal(pthread_key_create(&late_key, late_destructor), 0);
    cmalloc_stats before = stats_now();
    pthread_t t[8];
    for (int done = 0; done < EXIT_THREADS; done += 8) {
        start_threads(t, 8, late_worker, NULL, 0);
        join_threads(t, 8);
    }
    expect_no_worker_errors();
    cmalloc_stats after = stats_now();
    pthread_key_delete(late_key);
    int runs = atomic_load(&late_destructor_runs);
    print_message("  %d destructor runs; bytes_in_use %zu -> %zu, live thread caches %zu\n", runs,
                  before.bytes_in_use, after.bytes_in_use, after.thread_caches);
    if (runs != EXIT_THREADS * EXIT_ROUNDS)
        fail_msg("%d destructor runs, expected %d", runs, EXIT_THREADS * EXIT_ROUNDS);
    if (after.bytes_in_use > before.bytes_in_use + 1 * MiB)
        fail_msg("bytes_in_use %zu -> %zu: what thread-exit destructors freed is not freed",
                 before.bytes_in_use, after.bytes_in_use);
    /* A cache made again by a malloc after the allocator's own destructor must not leak. */
    if (after.thread_caches > before.thread_caches + 8)
        fail_msg("live thread caches %zu -> %zu after %d threads exited: caches leak when "
                 "destructors allocate at thread exit",
                 before.thread_caches, after.thread_caches, EXIT_THREADS);
}

/* ---------------------------------------------------------------------------------------- */
/* fork() while other threads allocate. */

/* Up to FORKS forks, but no more than FORK_SECONDS of them: a fork costs 15 ms to 150 ms on a
 * small VM while other threads run (copy-on-write faults), and the whole file must stay within
 * about 20 s on two cores. At least FORKS_MIN must fit. */
enum { FORKS = 300, FORKS_MIN = 20, FORK_SECONDS = 12, BUSY_THREADS = 2 };

static double seconds_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static atomic_int busy_stop;

static void *busy_worker(void *argp)
{
    unsigned index = *(unsigned *)argp;
    uint64_t rng = rng_seed(5000 + index);
    void *slot[64] = {0};
    while (!atomic_load_explicit(&busy_stop, memory_order_relaxed)) {
        uint64_t r = rng_next(&rng);
        int i = (int)(r % 64);
        free(slot[i]);
        size_t n =
            (r >> 8) % 1000 == 0 ? (size_t)((r >> 20) % (3 * MiB)) : (size_t)((r >> 20) % 8192);
        slot[i] = (r >> 6) % 8 == 0 ? calloc(1, n) : malloc(n);
        if (slot[i] != NULL)
            memset(slot[i], 0x77, n < 256 ? n : 256);
    }
    for (int i = 0; i < 64; i++)
        free(slot[i]);
    return NULL;
}

static void *child_thread(void *argp)
{
    (void)argp;
    for (int i = 0; i < 100; i++) {
        void *p = malloc((size_t)i * 37);
        if (p == NULL)
            return NULL;
        memset(p, 1, (size_t)i * 37);
        free(p);
    }
    return argp; /* non-NULL: success */
}

/* The child: everything it does goes through the allocator whose locks may have been held by
 * another thread at the moment of fork. Exit 0 on success, 1 on a wrong result; a deadlock is
 * ended by SIGALRM. */
static void child_body(int iteration, void *from_parent, size_t parent_size)
{
    alarm(10);
    static const size_t sizes[] = {0, 16, 100, 1000, 5000, 70000, 300000, 2 * 1024 * 1024};
    void *p[sizeof sizes / sizeof sizes[0]];
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        p[k] = malloc(sizes[k]);
        if (p[k] == NULL)
            _exit(1);
        memset(p[k], (int)k, sizes[k]);
    }
    void *c = calloc(100, 100);
    if (c == NULL)
        _exit(1);
    c = realloc(c, 200000);
    if (c == NULL)
        _exit(1);
    free(c);
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
        free(p[k]);
    /* A block the parent allocated before fork can be checked and freed in the child. */
    if (!tag_check(from_parent, parent_size, 0x42))
        _exit(1);
    free(from_parent);
    if (iteration % 10 == 5) { /* the child forks again: the grandchild allocates too */
        pid_t grandchild = fork();
        if (grandchild < 0)
            _exit(1);
        if (grandchild == 0) {
            alarm(10);
            void *g = malloc(3000);
            if (g == NULL)
                _exit(1);
            memset(g, 3, 3000);
            free(g);
            _exit(0);
        }
        int status = 0;
        if (waitpid(grandchild, &status, 0) != grandchild || !WIFEXITED(status) ||
            WEXITSTATUS(status) != 0)
            _exit(1);
    }
    if (iteration % 4 == 0) {
        pthread_t t;
        void *result = NULL;
        if (pthread_create(&t, NULL, child_thread, (void *)&busy_stop) != 0)
            _exit(1);
        pthread_join(t, &result);
        if (result == NULL)
            _exit(1);
    }
    _exit(0);
}

/* Waits for a child up to timeout_ms; kills a child that is still running then (deadlocked).
 * Returns the wait status, or -1 when the child had to be killed. */
static int wait_child(pid_t pid, int timeout_ms)
{
    int status = 0;
    long slept_us = 0, step_us = 50;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return status;
        if (r < 0 && errno != EINTR)
            return status;
        if (slept_us > (long)timeout_ms * 1000) {
            kill(pid, SIGKILL);
            while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
                ;
            return -1;
        }
        struct timespec ts = {0, step_us * 1000};
        nanosleep(&ts, NULL);
        slept_us += step_us;
        if (step_us < 10000)
            step_us *= 2;
    }
}

/* pthread_atfork handlers that allocate, registered by a constructor that runs before main
 * (as a library's constructor would), and so possibly before the allocator registers its own.
 * Allocating in them is allowed: glibc's malloc takes its locks after the prepare handlers
 * and drops them before the parent and child handlers. Active only in the test that wants
 * them. */
static atomic_int atfork_alloc_enabled;
static atomic_int atfork_alloc_failures;

static void atfork_allocate(void)
{
    if (!atomic_load(&atfork_alloc_enabled))
        return;
    static const size_t sizes[] = {24, 3000, 70000, 400000, 3 * 1024 * 1024};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        void *p = malloc(sizes[k]);
        if (p == NULL) {
            atomic_fetch_add(&atfork_alloc_failures, 1);
            continue;
        }
        memset(p, 9, sizes[k]);
        clobber(p);
        free(p);
    }
}

__attribute__((constructor)) static void register_early_atfork(void)
{
    pthread_atfork(atfork_allocate, atfork_allocate, atfork_allocate);
}

struct fork_job {
    int iteration;
    void *from_parent;
    size_t parent_size;
    pid_t pid;
};

static void child_reset_alarm(void)
{
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL; /* the child's alarm kills it */
    sigaction(SIGALRM, &dfl, NULL);
}

static void *fork_from_thread(void *argp)
{
    struct fork_job *job = argp;
    job->pid = fork();
    if (job->pid == 0) {
        child_reset_alarm();
        child_body(job->iteration, job->from_parent, job->parent_size);
    }
    return NULL;
}

static void parent_timeout(int sig)
{
    (void)sig;
    static const char msg[] = "test_threads: FAIL: fork() has not returned in the parent for 30 s: "
                              "deadlock in the fork handlers (or in an allocating pthread_atfork "
                              "handler)\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(2);
}

static void test_fork_while_allocating(void **state)
{
    (void)state;
    pthread_t t[BUSY_THREADS];
    unsigned idx[BUSY_THREADS];
    struct sigaction sa, old_sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = parent_timeout;
    sigaction(SIGALRM, &sa, &old_sa);
    fflush(stdout); /* parent_timeout _exits: let cmocka's report so far reach a pipe */
    atomic_store(&busy_stop, 0);
    for (int i = 0; i < BUSY_THREADS; i++)
        idx[i] = (unsigned)i;
    start_threads(t, BUSY_THREADS, busy_worker, idx, sizeof idx[0]);
    int failures = 0, deadlocks = 0, forks = 0;
    const double start = seconds_now();
    for (int f = 0; f < FORKS && seconds_now() - start < FORK_SECONDS; f++, forks++) {
        size_t parent_size = 100 + (size_t)f * 13;
        void *from_parent = malloc(parent_size);
        assert_non_null(from_parent);
        tag_fill(from_parent, parent_size, 0x42);
        alarm(30); /* a deadlock in the parent (fork handlers) ends the test binary */
        pid_t pid;
        if (f % 10 == 3) { /* fork from a thread other than the main one */
            pthread_t forker;
            struct fork_job job = {f, from_parent, parent_size, -1};
            if (pthread_create(&forker, NULL, fork_from_thread, &job) != 0)
                fail_msg("pthread_create failed");
            pthread_join(forker, NULL);
            pid = job.pid;
        } else {
            pid = fork();
        }
        if (pid < 0)
            fail_msg("fork #%d: %s", f, strerror(errno));
        if (pid == 0) {
            child_reset_alarm();
            child_body(f, from_parent, parent_size);
        }
        free(from_parent);
        int status = wait_child(pid, 15000);
        alarm(0);
        if (status == -1 || (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)) {
            if (deadlocks++ == 0)
                print_error("fork #%d: the child deadlocked in the allocator (killed after "
                            "10-15 s)\n",
                            f);
            break;
        }
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            if (failures++ < 3)
                print_error("fork #%d: child %s %d\n", f,
                            WIFSIGNALED(status) ? "killed by signal" : "exited with",
                            WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
        }
    }
    atomic_store(&busy_stop, 1);
    join_threads(t, BUSY_THREADS);
    alarm(0);
    sigaction(SIGALRM, &old_sa, NULL);
    const double elapsed = seconds_now() - start;
    print_message("  %d forks in %.1f s (%.1f ms each)\n", forks, elapsed,
                  forks ? elapsed * 1000 / forks : 0.0);
    if (deadlocks != 0)
        fail_msg("a child of a multi-threaded parent deadlocked in malloc after fork");
    if (failures != 0)
        fail_msg("%d of %d children failed (allocation error or crash) after fork", failures,
                 forks);
    if (forks < FORKS_MIN)
        fail_msg("only %d forks in %d s: fork is far too slow while threads allocate", forks,
                 FORK_SECONDS);
}

/* Allocation inside pthread_atfork handlers registered before main. */
static void test_fork_with_allocating_atfork_handlers(void **state)
{
    (void)state;
    struct sigaction sa, old_sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = parent_timeout;
    sigaction(SIGALRM, &sa, &old_sa);
    fflush(stdout); /* parent_timeout _exits: let cmocka's report so far reach a pipe */
    atomic_store(&atfork_alloc_failures, 0);
    atomic_store(&atfork_alloc_enabled, 1);
    int deadlocks = 0, failures = 0;
    for (int f = 0; f < 20; f++) {
        alarm(30); /* a deadlock in the parent's handlers ends the test binary */
        pid_t pid = fork();
        if (pid < 0)
            fail_msg("fork: %s", strerror(errno));
        if (pid == 0) {
            void *p = malloc(5000);
            if (p == NULL || atomic_load(&atfork_alloc_failures) != 0)
                _exit(1);
            free(p);
            _exit(0);
        }
        int status = wait_child(pid, 15000);
        alarm(0);
        if (status == -1) {
            deadlocks++;
            break;
        }
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            failures++;
    }
    atomic_store(&atfork_alloc_enabled, 0);
    sigaction(SIGALRM, &old_sa, NULL);
    if (deadlocks != 0)
        fail_msg("the child deadlocked: malloc in a pthread_atfork child handler registered "
                 "before main (by a constructor) hangs");
    if (failures != 0 || atomic_load(&atfork_alloc_failures) != 0)
        fail_msg("%d children failed, %d allocations in atfork handlers failed", failures,
                 atomic_load(&atfork_alloc_failures));
}

int main(void)
{
    test_seed = seed_from_env("test_threads");
    const char *filter = getenv("TEST_FILTER"); /* e.g. "*fork*" */
    if (filter != NULL)
        cmocka_set_test_filter(filter);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_threads),
        cmocka_unit_test(test_cross_thread_free),
        cmocka_unit_test(test_short_lived_threads),
        cmocka_unit_test(test_malloc_in_thread_exit_destructors),
        cmocka_unit_test(test_fork_while_allocating),
        cmocka_unit_test(test_fork_with_allocating_atfork_handlers),
    };
    return cmocka_run_group_tests_name("threads", tests, NULL, NULL);
}
