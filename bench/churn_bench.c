/* churn_bench - thread churn: short-lived threads that allocate, free, hand memory on and exit.
 *
 * What it measures
 *   The main thread keeps starting rounds of --threads threads and joining them. Each thread
 *     1. allocates --objects objects (log-uniform sizes over [16, --max-size]) and touches them,
 *     2. frees every other one itself,
 *     3. publishes the survivors (and the array holding them) in a global hand-off slot and
 *        frees what the previous thread left there: memory allocated by a thread that has
 *        already exited, freed by a different thread,
 *     4. exits, so the allocator must create and tear down its per-thread state every time.
 *   This is what thread pools that resize, request-per-thread servers and test runners do. An
 *   allocator whose per-thread caches or arenas are expensive to set up, are not flushed at
 *   thread exit, or hold memory per dead thread shows it here, in time or in peak RSS.
 *
 * How to read it
 *   ops/s     threads completed per second (each does --objects mallocs and as many frees).
 *             Higher is better. Thread creation and join are included, as in real programs;
 *             they cost the same under every allocator.
 *   latency   every thread's own work (first malloc to last free, including the slow path of a
 *             first malloc that creates the thread cache) is timed with the cycle counter:
 *             p50/p99/p99.9/max per thread lifetime, ns. The first malloc alone is printed too.
 *   peak RSS  the process's maximum resident set, KiB: stays flat if dead threads' memory is
 *             reused, grows if it is stranded.
 *
 * Example: build/bench/churn_bench --threads 4 --objects 256 --max-size 4096 --seconds 1
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "bench_util.h"

enum phase { PHASE_WARMUP, PHASE_MEASURE, PHASE_STOP };

static bench_common opt = {1, 0.2, 1.0, BENCH_SAMPLE_RATE, 1, "churn"};
static uint64_t objects = 256;   /* --objects: each thread's live blocks */
static uint64_t max_size = 4096; /* --max-size */

static uint32_t *sizes;
static uint64_t tsc_overhead;
static _Atomic(void **) handoff; /* survivors of the last thread: [count, p1, p2, ...] */

typedef struct {
    uint64_t seq;          /* which thread this is, for the sizes */
    uint64_t life_cycles;  /* first malloc to last free */
    uint64_t first_cycles; /* the first malloc alone */
} job;

static void free_batch(void **batch)
{
    if (!batch)
        return;
    size_t n = (size_t)batch[0];
    for (size_t i = 1; i <= n; i++)
        free(batch[i]);
    free(batch);
}

static void *thread_main(void *arg)
{
    job *j = arg;
    unsigned n = (unsigned)objects;
    size_t base = (size_t)(j->seq * 7919u);
    uint64_t t0 = bench_tsc_start();
    void **objs = malloc((n + 1) * sizeof(void *));
    uint64_t tf = bench_tsc_stop();
    if (!objs) {
        fprintf(stderr, "churn_bench: malloc returned NULL\n");
        exit(3);
    }
    for (unsigned i = 0; i < n; i++) {
        size_t sz = sizes[(base + i) & (BENCH_SIZE_TABLE - 1)];
        objs[i + 1] = malloc(sz);
        bench_touch(objs[i + 1], sz);
    }
    /* free every other object; compact the survivors to the front */
    size_t kept = 0;
    for (unsigned i = 0; i < n; i++) {
        if (i & 1)
            free(objs[i + 1]);
        else
            objs[++kept] = objs[i + 1];
    }
    objs[0] = (void *)kept;
    void **prev = atomic_exchange(&handoff, objs);
    free_batch(prev);
    uint64_t t1 = bench_tsc_stop();
    uint64_t life = t1 - t0, first = tf - t0;
    j->life_cycles = life > tsc_overhead ? life - tsc_overhead : 0;
    j->first_cycles = first > tsc_overhead ? first - tsc_overhead : 0;
    return NULL;
}

int main(int argc, char **argv)
{
    const bench_option opts[] = {{"--objects", &objects, 1, 1000000, NULL},
                                 {"--max-size", &max_size, 16, 1u << 30, NULL}};
    bench_parse_args(argc, argv, &opt, opts, 2,
                     "usage: churn_bench [--objects N] [--max-size BYTES]\n"
                     "  --threads: threads alive at once (started and joined in rounds);\n"
                     "  --sample-rate: not used (every thread's life is timed)\n");

    char params[128];
    snprintf(params, sizeof params, "objects=%llu;max_size=%llu", (unsigned long long)objects,
             (unsigned long long)max_size);
    tsc_overhead = bench_tsc_overhead();
    sizes = bench_size_table(opt.seed * 15485863u, DIST_MIXED, max_size);
    job *jobs = bench_map((size_t)opt.threads * sizeof(job));
    pthread_t *tids = bench_map((size_t)opt.threads * sizeof(pthread_t));
    static bench_hist hlife, hfirst;

    uint64_t seq = 0, done = 0;
    int measuring = 0;
    uint64_t start_ns = bench_now_ns();
    bench_stamp t1 = bench_stamp_now(), t2;
    for (;;) {
        uint64_t now = bench_now_ns();
        double el = (double)(now - start_ns) / 1e9;
        if (!measuring && el >= opt.warmup_s) {
            measuring = 1;
            done = 0;
            memset(&hlife, 0, sizeof hlife);
            memset(&hfirst, 0, sizeof hfirst);
            t1 = bench_stamp_now();
        }
        if (measuring && now > t1.ns && (double)(now - t1.ns) / 1e9 >= opt.seconds)
            break;
        for (int i = 0; i < opt.threads; i++) {
            jobs[i].seq = seq++;
            int rc = pthread_create(&tids[i], NULL, thread_main, &jobs[i]);
            if (rc) {
                fprintf(stderr, "churn_bench: pthread_create: %s\n", strerror(rc));
                return 1;
            }
        }
        for (int i = 0; i < opt.threads; i++) {
            pthread_join(tids[i], NULL);
            bench_hist_add(&hlife, jobs[i].life_cycles);
            bench_hist_add(&hfirst, jobs[i].first_cycles);
        }
        done += (uint64_t)opt.threads;
    }
    t2 = bench_stamp_now();
    free_batch(atomic_exchange(&handoff, NULL));

    double cpn = bench_cycles_per_ns(t1, t2);
    double wall = (double)(t2.ns - t1.ns) / 1e9;
    bench_result r = {opt.label,
                      opt.threads,
                      params,
                      (double)done / wall,
                      wall,
                      1,
                      bench_hist_summary(&hlife, cpn)};
    printf("churn_bench: %s threads=%d (alive at once) seconds=%.2f warmup=%.2f\n", params,
           opt.threads, opt.seconds, opt.warmup_s);
    printf("  throughput     %.0f threads/s (%.0f mallocs/s)\n", r.ops_per_sec,
           r.ops_per_sec * (objects + 1));
    bench_print_lat("thread life", r.lat);
    bench_print_lat("first malloc", bench_hist_summary(&hfirst, cpn));
    printf("  peak RSS       %ld KiB\n", bench_peak_rss_kib());
    bench_print_result(&r);
    return 0;
}
