/* alloc_bench - raw malloc/free throughput and per-call latency, in three traffic patterns.
 *
 * What it measures
 *   --mode=immediate    each op: p = malloc(size); touch p; free(p). The thread-cache fast path
 *                       at its best: the same few objects come back again and again.
 *   --mode=window       each thread keeps a ring of --window live objects; each op frees the
 *                       oldest and allocates a new one in its place. Objects live long enough to
 *                       leave the hottest cache lines, and with a mixed size distribution every
 *                       size class is in play. The ring is filled before the warm-up starts.
 *   --mode=crossthread  --threads producer threads allocate and touch, --threads consumer threads
 *                       free, each pair joined by a lock-free single-producer single-consumer ring.
 *                       Every free is of another thread's memory: the pattern that sends a
 *                       per-thread cache's objects back through the shared layers.
 *   Sizes: --size is the size (fixed) or the upper bound (mixed: log-uniform over [16, size];
 *   powerlaw: Pareto alpha 1.2 from 16 up, cut at size); sizes are drawn into a table before
 *   timing (window mode takes them in turn from a prime number of its entries, so that a new
 *   object's size is not the one it replaces: "replacements" prints how often it is). "touch"
 *   writes the first and last byte and one byte per 4 KiB page.
 *
 * How to read it
 *   ops/s     completed malloc+free pairs per second over the measured --seconds, all threads
 *             together (crossthread: objects freed by consumers). Higher is better. The --warmup
 *             period before it is not counted.
 *   latency   one in --sample-rate calls (1,024 by default) is timed with the cycle counter
 *             (fenced rdtsc/rdtscp); the cost of an empty timing pair is measured at start and
 *             subtracted from each sample, and sampling is sparse, so the timing costs the
 *             ops/s little (2-5% on the 64-byte loop; bench_util.h's BENCH_SAMPLE_RATE).
 *             p50/p99/p99.9/max per allocator call (a malloc or a free), from a log-linear
 *             histogram (about 3% resolution; max exact). malloc and free are also shown apart.
 *             On an oversubscribed machine (more threads than cores) the tail includes being
 *             descheduled mid-call, which hits every allocator alike.
 *   peak RSS  the process's maximum resident set (getrusage), in KiB: what the allocator kept
 *             mapped and touched at its worst, plus the benchmark's own ~1 MiB.
 *   The last line is a RESULT line (see bench_util.h) for scripts/bench-matrix.sh.
 *   --sharing (window mode): at the end, how many live objects share a 128-byte block (a pair
 *             of cache lines, which the L2 prefetcher fetches together) with another thread's
 *             live object: writes to such neighbours make both threads' cores trade the lines.
 *             --sharing-block BYTES counts blocks of another power of two instead (4096: live
 *             objects on a page that holds another thread's, as the mixed window's slow runs
 *             have them; docs/PERFORMANCE.md).
 *   --pin: thread i (crossthread: producers even, consumers odd) runs only on the i-th CPU the
 *             process may use, modulo their number (bench_util.h's bench_pin_thread), so a
 *             producer and its consumer never share a core where there are two.
 *
 * Example: build/bench/alloc_bench --threads 4 --mode=window --size-dist=mixed --size 4096
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <unistd.h>

#include "bench_util.h"

enum mode { MODE_IMMEDIATE, MODE_WINDOW, MODE_CROSSTHREAD };

static struct {
    int threads;
    size_t size;
    enum bench_dist dist;
    enum mode mode;
    size_t window;
    double warmup_s;
    double seconds;
    unsigned sample_rate;
    const char *label;
    uint64_t seed;
    bool sharing;
    unsigned sharing_shift; /* log2 of --sharing-block */
    bool pin;
} opt = {1, 64, DIST_FIXED, MODE_IMMEDIATE, 1024, 0.2, 1.0, BENCH_SAMPLE_RATE, NULL, 1, false,
         7, false};

static _Atomic int phase = BENCH_WARMUP;
static uint64_t tsc_overhead;
static pthread_barrier_t start_barrier;

/* Single-producer single-consumer ring for the crossthread mode. head is written by the
 * consumer only, tail by the producer only; each on its own cache line. */
#define QUEUE_CAP 4096u
typedef struct {
    _Alignas(BENCH_CACHELINE) _Atomic uint64_t head; /* next slot to pop */
    _Alignas(BENCH_CACHELINE) _Atomic uint64_t tail; /* next slot to push */
    _Alignas(BENCH_CACHELINE) _Atomic int producer_done;
    _Alignas(BENCH_CACHELINE) void *slot[QUEUE_CAP];
} spsc_queue;

typedef struct {
    _Alignas(BENCH_CACHELINE) int id;
    int role; /* crossthread: 0 producer, 1 consumer */
    spsc_queue *queue;
    uint32_t *sizes;
    unsigned size_pos;  /* next index into sizes (window mode: after the fill) */
    void **ring;        /* window mode: the live objects, oldest at the cursor */
    uint64_t *edges;    /* --sharing: each live object's first and last 128-byte block */
    uint64_t ops;       /* ops completed in the measured phase */
    bench_hist hmalloc; /* sampled malloc latencies, cycles */
    bench_hist hfree;   /* sampled free latencies, cycles */
} worker;

static inline unsigned next_countdown(uint64_t *rs)
{
    /* sample about one call in sample_rate, jittered so it cannot beat with a ring or a queue */
    unsigned r = opt.sample_rate;
    if (r <= 1)
        return 1;
    return r / 2 + 1 + (unsigned)(bench_rand(rs) % r);
}

static inline void record(bench_hist *h, uint64_t t0, uint64_t t1)
{
    uint64_t d = t1 - t0;
    bench_hist_add(h, d > tsc_overhead ? d - tsc_overhead : 0);
}

/* Called between chunks: notices phase changes. Returns 0 when the thread must stop. */
static inline int check_phase(worker *w, int *seen)
{
    int p = atomic_load_explicit(&phase, memory_order_relaxed);
    if (p == *seen)
        return 1;
    if (p == BENCH_MEASURE) {
        w->ops = 0;
        memset(&w->hmalloc, 0, sizeof w->hmalloc);
        memset(&w->hfree, 0, sizeof w->hfree);
    }
    *seen = p;
    return p != BENCH_STOP;
}

#define CHUNK 64

static void run_immediate(worker *w)
{
    uint64_t rs = bench_seed(1000 + w->id);
    unsigned countdown = next_countdown(&rs);
    unsigned si = 0;
    int seen = BENCH_WARMUP;
    while (check_phase(w, &seen)) {
        for (int k = 0; k < CHUNK; k++) {
            size_t sz = w->sizes[si++ & (BENCH_SIZE_TABLE - 1)];
            if (__builtin_expect(--countdown == 0, 0)) {
                countdown = next_countdown(&rs);
                uint64_t t0 = bench_tsc_start();
                void *p = malloc(sz);
                uint64_t t1 = bench_tsc_stop();
                record(&w->hmalloc, t0, t1);
                bench_touch(p, sz);
                t0 = bench_tsc_start();
                free(p);
                t1 = bench_tsc_stop();
                record(&w->hfree, t0, t1);
            } else {
                void *p = malloc(sz);
                bench_touch(p, sz);
                free(p);
            }
        }
        w->ops += CHUNK;
    }
}

/* Window mode takes the table's sizes in turn from its first size_cycle entries, a prime that
 * does not divide the window: were the window a multiple of the cycle (4,096, the table's length,
 * is the matrix's mixed window), the index would come round with the ring and every new object
 * would take the size of the one it replaces, one size class per slot for the whole run. */
static unsigned size_cycle;
_Static_assert(BENCH_SIZE_TABLE >= 4093, "the size cycles fit the size table");

static unsigned size_cycle_for(size_t window)
{
    static const unsigned primes[] = {4093, 4091, 4079};
    for (size_t i = 0; i < sizeof primes / sizeof primes[0] - 1; i++)
        if (window % primes[i] != 0)
            return primes[i];
    return primes[sizeof primes / sizeof primes[0] - 1]; /* 4093 and 4091 both divide it */
}

static inline size_t window_size(const uint32_t *sizes, unsigned *si)
{
    size_t sz = sizes[*si];
    if (++*si == size_cycle)
        *si = 0;
    return sz;
}

/* Of the first pass after the fill and one more (at most 4,096 ops each), the share of ops whose
 * new object takes the size of the one it frees: the index sequence run_window draws, replayed
 * without allocating, on w's table (each worker's is drawn apart). */
static double same_size_share(const worker *w)
{
    size_t n = opt.window, steps = 2 * (n < 4096 ? n : 4096), same = 0;
    unsigned *ring = bench_map(n * sizeof(unsigned)), si = 0;
    for (size_t i = 0; i < n; i++) {
        ring[i] = si;
        window_size(w->sizes, &si);
    }
    for (size_t k = 0; k < steps; k++) {
        size_t pos = k % n;
        unsigned at = si;
        same += w->sizes[ring[pos]] == window_size(w->sizes, &si);
        ring[pos] = at;
    }
    bench_unmap(ring, n * sizeof(unsigned));
    return (double)same / (double)steps;
}

/* Window mode's ring of live objects, filled before the start barrier (setup, not timed: with
 * many threads and big windows the first touch of fresh pages takes longer than a short warm-up).
 */
static void fill_window(worker *w)
{
    w->ring = bench_map(opt.window * sizeof(void *));
    for (size_t i = 0; i < opt.window; i++) {
        size_t sz = window_size(w->sizes, &w->size_pos);
        w->ring[i] = malloc(sz);
        bench_touch(w->ring[i], sz);
    }
}

static void run_window(worker *w)
{
    size_t n = opt.window;
    void **ring = w->ring;
    uint64_t rs = bench_seed(2000 + w->id);
    unsigned si = w->size_pos;
    unsigned countdown = next_countdown(&rs);
    size_t pos = 0;
    int seen = BENCH_WARMUP;
    while (check_phase(w, &seen)) {
        for (int k = 0; k < CHUNK; k++) {
            size_t sz = window_size(w->sizes, &si);
            if (__builtin_expect(--countdown == 0, 0)) {
                countdown = next_countdown(&rs);
                uint64_t t0 = bench_tsc_start();
                free(ring[pos]);
                uint64_t t1 = bench_tsc_stop();
                record(&w->hfree, t0, t1);
                t0 = bench_tsc_start();
                void *p = malloc(sz);
                t1 = bench_tsc_stop();
                record(&w->hmalloc, t0, t1);
                ring[pos] = p;
            } else {
                free(ring[pos]);
                ring[pos] = malloc(sz);
            }
            bench_touch(ring[pos], sz);
            if (++pos == n)
                pos = 0;
        }
        w->ops += CHUNK;
    }
    if (opt.sharing) {
        w->edges = bench_map(2 * n * sizeof(uint64_t));
        for (size_t i = 0; i < n; i++) {
            uintptr_t start = (uintptr_t)ring[i];
            w->edges[2 * i] = start >> opt.sharing_shift;
            w->edges[2 * i + 1] = (start + malloc_usable_size(ring[i]) - 1) >> opt.sharing_shift;
        }
    }
    for (size_t i = 0; i < n; i++)
        free(ring[i]);
    bench_unmap(ring, n * sizeof(void *));
}

/* --sharing: live objects (at the end of the run) with a block (128 bytes, or --sharing-block)
 * in common with another thread's. Only an object's first and last blocks can be shared: sort
 * (block, thread, object) entries and look for blocks with more than one thread. */
typedef struct {
    uint64_t block;
    uint32_t thread, object;
} block_entry;

static int by_block(const void *a, const void *b)
{
    const block_entry *x = a, *y = b;
    return x->block < y->block ? -1 : x->block > y->block;
}

static size_t count_shared(const worker *ws, int nworkers)
{
    size_t n = (size_t)nworkers * opt.window * 2, shared = 0;
    block_entry *entries = bench_map(n * sizeof *entries);
    uint8_t *marked = bench_map((size_t)nworkers * opt.window);
    for (int t = 0; t < nworkers; t++)
        for (size_t i = 0; i < 2 * opt.window; i++)
            entries[t * 2 * opt.window + i] =
                (block_entry){ws[t].edges[i], (uint32_t)t, (uint32_t)(i / 2)};
    qsort(entries, n, sizeof *entries, by_block);
    for (size_t first = 0, last; first < n; first = last) {
        bool threads = false;
        for (last = first + 1; last < n && entries[last].block == entries[first].block; last++)
            threads |= entries[last].thread != entries[first].thread;
        for (size_t i = first; threads && i < last; i++) {
            uint8_t *m = &marked[entries[i].thread * opt.window + entries[i].object];
            shared += *m == 0;
            *m = 1;
        }
    }
    bench_unmap(entries, n * sizeof *entries);
    bench_unmap(marked, (size_t)nworkers * opt.window);
    return shared;
}

/* Waiting on the other side of the queue: spin briefly, then give the core away (on a machine
 * with fewer cores than threads, spinning would starve the thread we wait for). */
static inline void backoff(unsigned *spins)
{
    if (++*spins < 64)
        bench_spin_pause();
    else {
        sched_yield();
        *spins = 0;
    }
}

static void run_producer(worker *w)
{
    spsc_queue *q = w->queue;
    uint64_t rs = bench_seed(3000 + w->id);
    unsigned countdown = next_countdown(&rs);
    unsigned si = 0;
    uint64_t tail = 0;
    int seen = BENCH_WARMUP;
    while (check_phase(w, &seen)) {
        for (int k = 0; k < CHUNK; k++) {
            size_t sz = w->sizes[si++ & (BENCH_SIZE_TABLE - 1)];
            void *p;
            if (__builtin_expect(--countdown == 0, 0)) {
                countdown = next_countdown(&rs);
                uint64_t t0 = bench_tsc_start();
                p = malloc(sz);
                uint64_t t1 = bench_tsc_stop();
                record(&w->hmalloc, t0, t1);
            } else {
                p = malloc(sz);
            }
            bench_touch(p, sz);
            unsigned spins = 0;
            while (tail - atomic_load_explicit(&q->head, memory_order_acquire) >= QUEUE_CAP) {
                if (atomic_load_explicit(&phase, memory_order_relaxed) == BENCH_STOP) {
                    free(p); /* the consumer may be gone; do not block */
                    goto out;
                }
                backoff(&spins);
            }
            q->slot[tail & (QUEUE_CAP - 1)] = p;
            atomic_store_explicit(&q->tail, ++tail, memory_order_release);
        }
    }
out:
    atomic_store_explicit(&q->producer_done, 1, memory_order_release);
}

static void run_consumer(worker *w)
{
    spsc_queue *q = w->queue;
    uint64_t rs = bench_seed(4000 + w->id);
    unsigned countdown = next_countdown(&rs);
    uint64_t head = 0;
    int seen = BENCH_WARMUP;
    for (;;) {
        if (!check_phase(w, &seen))
            break;
        for (int k = 0; k < CHUNK; k++) {
            unsigned spins = 0;
            while (atomic_load_explicit(&q->tail, memory_order_acquire) == head) {
                if (atomic_load_explicit(&phase, memory_order_relaxed) == BENCH_STOP)
                    goto drain;
                backoff(&spins);
            }
            void *p = q->slot[head & (QUEUE_CAP - 1)];
            atomic_store_explicit(&q->head, ++head, memory_order_release);
            if (__builtin_expect(--countdown == 0, 0)) {
                countdown = next_countdown(&rs);
                uint64_t t0 = bench_tsc_start();
                free(p);
                uint64_t t1 = bench_tsc_stop();
                record(&w->hfree, t0, t1);
            } else {
                free(p);
            }
            w->ops++;
        }
    }
drain:
    /* Untimed: free what is still queued once the producer has stopped. */
    for (;;) {
        int done = atomic_load_explicit(&q->producer_done, memory_order_acquire);
        uint64_t tail = atomic_load_explicit(&q->tail, memory_order_acquire);
        while (head != tail) {
            free(q->slot[head & (QUEUE_CAP - 1)]);
            atomic_store_explicit(&q->head, ++head, memory_order_release);
        }
        if (done)
            break;
        sched_yield();
    }
}

static void *thread_main(void *arg)
{
    worker *w = arg;
    if (opt.pin)
        bench_pin_thread(w->id);
    if (opt.mode == MODE_WINDOW)
        fill_window(w);
    pthread_barrier_wait(&start_barrier);
    if (opt.mode == MODE_IMMEDIATE)
        run_immediate(w);
    else if (opt.mode == MODE_WINDOW)
        run_window(w);
    else if (w->role == 0)
        run_producer(w);
    else
        run_consumer(w);
    return NULL;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: alloc_bench [--threads N] [--size BYTES] [--size-dist=fixed|mixed|powerlaw]\n"
            "                   [--mode=immediate|window|crossthread] [--window N]\n"
            "                   [--warmup S] [--seconds S] [--sample-rate N] [--label NAME]\n"
            "                   [--seed N] [--sharing] [--sharing-block BYTES] [--pin]\n"
            "  crossthread runs --threads producers and --threads consumers.\n");
    exit(2);
}

/* log2 of --sharing-block's bytes: a power of two of a cache line or more. */
static unsigned sharing_shift(const char *v)
{
    uint64_t bytes = (uint64_t)bench_parse_num("--sharing-block", v);
    if (bytes < 64 || (bytes & (bytes - 1)) != 0) {
        fprintf(stderr, "alloc_bench: --sharing-block %s: not a power of two of 64 or more\n", v);
        exit(2);
    }
    return (unsigned)__builtin_ctzll(bytes);
}

static void parse_args(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *v;
        if ((v = bench_opt(argc, argv, &i, "--threads")))
            opt.threads = (int)bench_parse_num("--threads", v);
        else if ((v = bench_opt(argc, argv, &i, "--size-dist"))) {
            if (bench_parse_dist(v, &opt.dist))
                usage();
        } else if ((v = bench_opt(argc, argv, &i, "--size")))
            opt.size = (size_t)bench_parse_num("--size", v);
        else if ((v = bench_opt(argc, argv, &i, "--mode"))) {
            if (!strcmp(v, "immediate"))
                opt.mode = MODE_IMMEDIATE;
            else if (!strcmp(v, "window"))
                opt.mode = MODE_WINDOW;
            else if (!strcmp(v, "crossthread"))
                opt.mode = MODE_CROSSTHREAD;
            else
                usage();
        } else if ((v = bench_opt(argc, argv, &i, "--window")))
            opt.window = (size_t)bench_parse_num("--window", v);
        else if ((v = bench_opt(argc, argv, &i, "--warmup")))
            opt.warmup_s = bench_parse_num("--warmup", v);
        else if ((v = bench_opt(argc, argv, &i, "--seconds")))
            opt.seconds = bench_parse_num("--seconds", v);
        else if ((v = bench_opt(argc, argv, &i, "--sample-rate")))
            opt.sample_rate = (unsigned)bench_parse_num("--sample-rate", v);
        else if ((v = bench_opt(argc, argv, &i, "--label")))
            opt.label = v;
        else if ((v = bench_opt(argc, argv, &i, "--seed")))
            opt.seed = (uint64_t)bench_parse_num("--seed", v);
        else if (!strcmp(argv[i], "--sharing"))
            opt.sharing = true;
        else if ((v = bench_opt(argc, argv, &i, "--sharing-block"))) {
            opt.sharing_shift = sharing_shift(v);
            opt.sharing = true;
        } else if (!strcmp(argv[i], "--pin"))
            opt.pin = true;
        else
            usage();
    }
    if (opt.threads < 1 || opt.threads > 1024 || opt.window < 1 || opt.seconds <= 0 ||
        opt.size > (1u << 30) || opt.sample_rate < 1)
        usage();
}

int main(int argc, char **argv)
{
    parse_args(argc, argv);
    static const char *mode_names[] = {"immediate", "window", "crossthread"};
    const char *mode_name = mode_names[opt.mode];

    char label[128];
    if (opt.label)
        snprintf(label, sizeof label, "%s", opt.label);
    else
        snprintf(label, sizeof label, "alloc-%s-%s-%zu", mode_name, bench_dist_name(opt.dist),
                 opt.size);
    char params[160];
    int at = snprintf(params, sizeof params, "mode=%s;dist=%s;size=%zu", mode_name,
                      bench_dist_name(opt.dist), opt.size);
    if (opt.mode == MODE_WINDOW)
        at += snprintf(params + at, sizeof params - (size_t)at, ";window=%zu", opt.window);
    if (opt.pin)
        snprintf(params + at, sizeof params - (size_t)at, ";pin");

    tsc_overhead = bench_tsc_overhead();
    size_cycle = size_cycle_for(opt.window);

    int nworkers = opt.mode == MODE_CROSSTHREAD ? 2 * opt.threads : opt.threads;
    worker *ws = bench_map((size_t)nworkers * sizeof(worker));
    spsc_queue *queues = NULL;
    if (opt.mode == MODE_CROSSTHREAD)
        queues = bench_map((size_t)opt.threads * sizeof(spsc_queue));
    for (int i = 0; i < nworkers; i++) {
        ws[i].id = i;
        if (opt.mode == MODE_CROSSTHREAD) {
            ws[i].role = i % 2;
            ws[i].queue = &queues[i / 2];
        }
        ws[i].sizes = bench_size_table(opt.seed * 7919 + (uint64_t)i, opt.dist, opt.size);
    }

    pthread_t *tids = bench_map((size_t)nworkers * sizeof(pthread_t));
    pthread_barrier_init(&start_barrier, NULL, (unsigned)nworkers + 1);
    for (int i = 0; i < nworkers; i++) {
        int rc = pthread_create(&tids[i], NULL, thread_main, &ws[i]);
        if (rc) {
            fprintf(stderr, "alloc_bench: pthread_create: %s\n", strerror(rc));
            return 1;
        }
    }
    pthread_barrier_wait(&start_barrier);
    bench_period t = bench_timeline(&phase, opt.warmup_s, opt.seconds);
    for (int i = 0; i < nworkers; i++)
        pthread_join(tids[i], NULL);

    double cpn = bench_cycles_per_ns(t.begin, t.end);
    double wall = bench_period_s(t);
    uint64_t ops = 0;
    static bench_hist hm, hf, hall;
    for (int i = 0; i < nworkers; i++) {
        if (opt.mode != MODE_CROSSTHREAD || ws[i].role == 1)
            ops += ws[i].ops;
        bench_hist_merge(&hm, &ws[i].hmalloc);
        bench_hist_merge(&hf, &ws[i].hfree);
    }
    bench_hist_merge(&hall, &hm);
    bench_hist_merge(&hall, &hf);

    bench_result r = {
        label, opt.threads, params, (double)ops / wall, wall, 1, bench_hist_summary(&hall, cpn)};
    printf("alloc_bench: %s threads=%d%s seconds=%.2f warmup=%.2f sample-rate=1/%u\n", params,
           opt.threads, opt.mode == MODE_CROSSTHREAD ? " (producers, and as many consumers)" : "",
           opt.seconds, opt.warmup_s, opt.sample_rate);
    printf("  throughput     %.0f ops/s (an op: one malloc and its free)\n", r.ops_per_sec);
    bench_print_lat("malloc", bench_hist_summary(&hm, cpn));
    bench_print_lat("free", bench_hist_summary(&hf, cpn));
    bench_print_lat("either call", r.lat);
    printf("  peak RSS       %ld KiB\n", bench_peak_rss_kib());
    if (opt.mode == MODE_WINDOW)
        printf("  replacements   %.1f%% of ops allocate the size they free (sizes drawn in turn "
               "from %u)\n",
               100.0 * same_size_share(&ws[0]), size_cycle);
    if (opt.sharing && opt.mode == MODE_WINDOW)
        printf("  sharing        %zu of %zu live objects share a %zu-byte block with another "
               "thread's\n",
               count_shared(ws, nworkers), (size_t)nworkers * opt.window,
               (size_t)1 << opt.sharing_shift);
    bench_print_result(&r);
    return 0;
}
