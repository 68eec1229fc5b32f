/* server_bench - a server-like workload: request-scoped garbage plus a shared, long-lived cache.
 *
 * What it measures
 *   A table of --slots objects of random sizes (log-uniform over [16, --max-size]) is shared by
 *   all threads, like a server's per-connection state or object cache. Each request, a thread
 *     1. allocates 1..--temps temporary buffers (same size distribution) and touches them,
 *     2. allocates a new object, writes it, and swaps it into a random slot of the table
 *        (atomic exchange); the object it takes out was most likely made by another thread
 *        ((threads-1)/threads of the time), and it checks and frees it,
 *     3. frees the temporaries.
 *   So most long-lived frees are remote (another thread's memory), objects of many sizes live
 *   for a random time, and the heap stays at a steady, fragmented size: the allocator's
 *   cross-thread free path, its fragmentation and its memory footprint all show.
 *   The table is filled by all threads before timing; a --warmup period follows, then the
 *   measured --seconds. Each object carries its size and a check byte; a mismatch (corruption)
 *   is reported and the program exits with status 3.
 *
 * How to read it
 *   ops/s     requests per second, all threads together. Higher is better.
 *   latency   one request in --sample-rate is timed whole (rdtsc, fenced, timing overhead
 *             subtracted): p50/p99/p99.9/max per request, in ns. A request is 3 to --temps+2
 *             allocator calls plus the touching, so these are request latencies, not call ones.
 *   peak RSS  the process's maximum resident set, KiB. The live data is about
 *             slots * mean size (printed); the rest is the allocator's overhead and retention.
 *
 * Example: build/bench/server_bench --threads 4 --slots 16384 --max-size 8192
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "bench_util.h"

static bench_common opt = {1, 0.2, 1.0, 32, 1, "server"};
static uint64_t slots = 16384;   /* --slots: the shared table's entries */
static uint64_t max_size = 8192; /* --max-size */
static uint64_t temps = 4;       /* --temps: most temporaries a request makes */

static _Atomic int phase = BENCH_WARMUP;
static _Atomic(void *) *table;
static uint64_t tsc_overhead;
static pthread_barrier_t barrier;
static _Atomic uint64_t live_bytes_filled;

typedef struct {
    _Alignas(BENCH_CACHELINE) int id;
    uint32_t *sizes;
    uint64_t ops;
    uint64_t remote_frees; /* frees of objects another thread allocated */
    uint64_t frees;
    bench_hist hreq;
} worker;

/* Object header: the allocating thread and the size, so the taker can tell remote frees
 * and check that nothing was overwritten. */
typedef struct {
    uint32_t size;
    uint32_t owner;
} object_header;

static void *make_object(worker *w, size_t sz)
{
    if (sz < sizeof(object_header) + 1)
        sz = sizeof(object_header) + 1;
    object_header *h = malloc(sz);
    if (!h) {
        fprintf(stderr, "server_bench: malloc(%zu) returned NULL\n", sz);
        exit(3);
    }
    bench_touch(h, sz);
    h->size = (uint32_t)sz;
    h->owner = (uint32_t)w->id;
    ((unsigned char *)h)[sz - 1] = (unsigned char)(sz * 31 + 7);
    return h;
}

static void check_free_object(worker *w, void *p)
{
    object_header *h = p;
    size_t sz = h->size;
    if (sz < sizeof(object_header) + 1 || sz > max_size + 64 ||
        ((unsigned char *)h)[sz - 1] != (unsigned char)(sz * 31 + 7)) {
        fprintf(stderr, "server_bench: corrupted object %p (size field %zu)\n", p, sz);
        exit(3);
    }
    w->frees++;
    if (h->owner != (uint32_t)w->id)
        w->remote_frees++;
    free(p);
}

static inline void one_request(worker *w, uint64_t *rs, unsigned *si)
{
    void *tmp[64];
    unsigned k = 1 + (unsigned)(bench_rand(rs) % temps);
    for (unsigned j = 0; j < k; j++) {
        size_t sz = w->sizes[(*si)++ & (BENCH_SIZE_TABLE - 1)];
        tmp[j] = malloc(sz);
        bench_touch(tmp[j], sz);
    }
    size_t slot = (size_t)(bench_rand(rs) % slots);
    void *obj = make_object(w, w->sizes[(*si)++ & (BENCH_SIZE_TABLE - 1)]);
    void *old = atomic_exchange_explicit(&table[slot], obj, memory_order_acq_rel);
    if (old)
        check_free_object(w, old);
    for (unsigned j = 0; j < k; j++)
        free(tmp[j]);
}

static void *thread_main(void *arg)
{
    worker *w = arg;
    uint64_t rs = bench_seed(5000 + (uint64_t)w->id);
    unsigned si = 0;

    /* fill this thread's share of the table */
    uint64_t filled = 0;
    for (size_t s = (size_t)w->id; s < slots; s += (size_t)opt.threads) {
        size_t sz = w->sizes[si++ & (BENCH_SIZE_TABLE - 1)];
        atomic_store_explicit(&table[s], make_object(w, sz), memory_order_release);
        filled += sz;
    }
    atomic_fetch_add(&live_bytes_filled, filled);
    pthread_barrier_wait(&barrier);

    unsigned countdown = 1 + (unsigned)(bench_rand(&rs) % opt.sample_rate);
    int seen = BENCH_WARMUP;
    for (;;) {
        int p = atomic_load_explicit(&phase, memory_order_relaxed);
        if (p != seen) {
            if (p == BENCH_STOP)
                break;
            w->ops = w->frees = w->remote_frees = 0;
            memset(&w->hreq, 0, sizeof w->hreq);
            seen = p;
        }
        for (int c = 0; c < 16; c++) {
            if (__builtin_expect(--countdown == 0, 0)) {
                countdown = opt.sample_rate / 2 + 1 + (unsigned)(bench_rand(&rs) % opt.sample_rate);
                uint64_t t0 = bench_tsc_start();
                one_request(w, &rs, &si);
                uint64_t t1 = bench_tsc_stop();
                uint64_t d = t1 - t0;
                bench_hist_add(&w->hreq, d > tsc_overhead ? d - tsc_overhead : 0);
            } else {
                one_request(w, &rs, &si);
            }
        }
        w->ops += 16;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    const bench_option opts[] = {{"--slots", &slots, 1, 1u << 30, NULL},
                                 {"--max-size", &max_size, 16, 1u << 30, NULL},
                                 {"--temps", &temps, 1, 64, NULL}};
    bench_parse_args(argc, argv, &opt, opts, 3,
                     "usage: server_bench [--slots N] [--max-size BYTES] [--temps N]\n");

    char params[128];
    snprintf(params, sizeof params, "slots=%llu;max_size=%llu;temps=%llu",
             (unsigned long long)slots, (unsigned long long)max_size, (unsigned long long)temps);
    tsc_overhead = bench_tsc_overhead();
    table = bench_map(slots * sizeof(*table));
    worker *ws = bench_map((size_t)opt.threads * sizeof(worker));
    pthread_t *tids = bench_map((size_t)opt.threads * sizeof(pthread_t));
    pthread_barrier_init(&barrier, NULL, (unsigned)opt.threads + 1);
    for (int i = 0; i < opt.threads; i++) {
        ws[i].id = i;
        ws[i].sizes = bench_size_table(opt.seed * 104729 + (uint64_t)i, DIST_MIXED, max_size);
        int rc = pthread_create(&tids[i], NULL, thread_main, &ws[i]);
        if (rc) {
            fprintf(stderr, "server_bench: pthread_create: %s\n", strerror(rc));
            return 1;
        }
    }
    pthread_barrier_wait(&barrier);
    bench_period t = bench_timeline(&phase, opt.warmup_s, opt.seconds);
    for (int i = 0; i < opt.threads; i++)
        pthread_join(tids[i], NULL);

    double cpn = bench_cycles_per_ns(t.begin, t.end);
    double wall = bench_period_s(t);
    uint64_t ops = 0, frees = 0, remote = 0;
    static bench_hist h;
    for (int i = 0; i < opt.threads; i++) {
        ops += ws[i].ops;
        frees += ws[i].frees;
        remote += ws[i].remote_frees;
        bench_hist_merge(&h, &ws[i].hreq);
    }
    bench_result r = {
        opt.label, opt.threads, params, (double)ops / wall, wall, 1, bench_hist_summary(&h, cpn)};
    printf("server_bench: %s threads=%d seconds=%.2f warmup=%.2f sample-rate=1/%u\n", params,
           opt.threads, opt.seconds, opt.warmup_s, opt.sample_rate);
    printf("  live data      about %.1f MiB in the table\n",
           (double)atomic_load(&live_bytes_filled) / (1024.0 * 1024.0));
    printf("  throughput     %.0f requests/s\n", r.ops_per_sec);
    printf("  remote frees   %.1f%% of table frees\n",
           frees ? 100.0 * (double)remote / (double)frees : 0.0);
    bench_print_lat("request", r.lat);
    printf("  peak RSS       %ld KiB\n", bench_peak_rss_kib());
    bench_print_result(&r);

    worker cleaner = {0};
    cleaner.id = -1;
    for (size_t s = 0; s < slots; s++) {
        void *p = atomic_load(&table[s]);
        if (p)
            check_free_object(&cleaner, p);
    }
    return 0;
}
