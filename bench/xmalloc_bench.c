/* xmalloc_bench - producer/consumer: one set of threads allocates, another frees, in batches.
 *
 * What it measures
 *   --threads N producer threads and N consumer threads share one queue of at most --queue
 *   batches (100), guarded by a mutex and two condition variables (not full, not empty). A
 *   producer allocates a batch array of --batch pointers (4096 of them: 32 KiB, itself from
 *   malloc), fills it with --batch objects of --size bytes (64), writing each, and pushes it,
 *   waiting while the queue is full. A consumer pops a batch, frees every object and then the
 *   array. Any consumer may take any producer's batch, so every free is of memory another thread
 *   allocated, and the objects come back in the large, same-size bursts of a message pipeline
 *   (a network thread allocating requests that worker threads retire). This is the pattern where
 *   a per-thread cache fills with remote objects it never allocates again and has to send them
 *   home; the 32 KiB arrays add a second, larger class travelling the same way.
 *   Memory is bounded: the queue, plus one batch per producer being filled and one per consumer
 *   being freed, is at most (queue + 2N) * (32 KiB + 4096 * 64 B), about 28 MiB + 0.6 MiB * N.
 *   --shuffle 1: a producer puts its i-th object in a slot of the batch drawn once before the
 *   run (the same permutation for every batch), so each batch is freed in an order unrelated to
 *   its allocation, as a server frees requests by when they finish; else (0, the default)
 *   nothing is random, and --seed only moves the latency sampling.
 *   --pin 1: thread i (producers even, consumers odd) runs only on the i-th CPU the process may
 *   use (modulo their number), so one pair's producer and consumer never share a core and every
 *   object crosses between the two; unpinned, the scheduler sometimes puts them on one core,
 *   and on a 2-core machine the rate moves 2-3x with it for every allocator.
 *
 * How to read it
 *   ops/s     objects freed per second by the consumers, all together (the batch arrays' frees
 *             are not counted). Higher is better. A batch is counted when its last free is done;
 *             the --warmup period before the measured --seconds is not counted.
 *   latency   one malloc in --sample-rate (1,024) by producers and one free in --sample-rate by
 *             consumers is timed with the cycle counter, timing overhead subtracted:
 *             p50/p99/p99.9/max per call, malloc and free also shown apart. Waiting on the queue
 *             is not in them.
 *   peak RSS  the process's maximum resident set, KiB: the bounded live data above plus what the
 *             allocator keeps of the freed objects (an allocator that strands remote frees in
 *             per-thread caches grows here).
 *   --threads N runs 2N threads; on a machine with fewer cores, the producers and consumers take
 *   turns, and the queue's bound makes producers wait for consumers, as in a real pipeline.
 *
 * Example: build/bench/xmalloc_bench --threads 4 --seconds 1
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>

#include "bench_util.h"

static bench_common opt = {1, 0.2, 1.0, BENCH_SAMPLE_RATE, 1, "xmalloc"};
static uint64_t batch_len = 4096; /* objects per batch */
static uint64_t object_size = 64;
static uint64_t queue_cap = 100; /* batches the queue holds at most */
static uint64_t shuffle;          /* --shuffle: 1 frees each batch in a fixed random order */
static uint64_t pin;              /* --pin: 1 runs thread i on the i-th allowed CPU */
static uint32_t *slot_of;         /* with --shuffle: where a batch's i-th object goes */

static _Atomic int phase = BENCH_WARMUP;
static uint64_t tsc_overhead;

/* The shared queue: a ring of batch arrays. Every field is guarded by lock. */
static struct {
    pthread_mutex_t lock;
    pthread_cond_t not_full;  /* signalled on pop, broadcast at stop */
    pthread_cond_t not_empty; /* signalled on push, broadcast when the last producer leaves */
    void ***ring;             /* queue_cap slots, from mmap */
    uint64_t head;            /* next slot to pop */
    uint64_t count;           /* batches queued: 0 <= count <= queue_cap */
    int producers_left;       /* producers not yet exited; consumers stop at 0 and empty */
} queue = {.lock = PTHREAD_MUTEX_INITIALIZER,
           .not_full = PTHREAD_COND_INITIALIZER,
           .not_empty = PTHREAD_COND_INITIALIZER};

typedef struct {
    _Alignas(BENCH_CACHELINE) int id;
    bench_counter count; /* consumers: objects freed; producers: only the sampled mallocs */
} worker;

static void free_batch(void **batch, bench_sampler *smp)
{
    for (uint64_t i = 0; i < batch_len; i++)
        bench_sampled_free(batch[i], smp);
    free(batch);
}

static void *producer_main(void *arg)
{
    worker *w = arg;
    bench_sampler smp = bench_sampler_make(opt.seed * 31 + (uint64_t)w->id, opt.sample_rate,
                                           tsc_overhead, &w->count);
    if (pin)
        bench_pin_thread(w->id);
    while (bench_counter_check(&w->count, &phase)) {
        void **batch = malloc(batch_len * sizeof(void *));
        if (!batch) {
            fprintf(stderr, "xmalloc_bench: malloc of a batch array returned NULL\n");
            exit(3);
        }
        for (uint64_t i = 0; i < batch_len; i++) {
            void *object = bench_sampled_malloc(object_size, &smp);
            bench_touch(object, object_size);
            batch[slot_of ? slot_of[i] : i] = object;
        }
        pthread_mutex_lock(&queue.lock);
        while (queue.count == queue_cap && atomic_load(&phase) != BENCH_STOP)
            pthread_cond_wait(&queue.not_full, &queue.lock);
        if (queue.count == queue_cap) { /* stopping, and no room: the batch goes back untimed */
            pthread_mutex_unlock(&queue.lock);
            bench_sampler_silence(&smp);
            free_batch(batch, &smp);
            break;
        }
        queue.ring[(queue.head + queue.count) % queue_cap] = batch;
        queue.count++;
        pthread_cond_signal(&queue.not_empty);
        pthread_mutex_unlock(&queue.lock);
    }
    pthread_mutex_lock(&queue.lock);
    if (--queue.producers_left == 0)
        pthread_cond_broadcast(&queue.not_empty);
    pthread_mutex_unlock(&queue.lock);
    return NULL;
}

/* Consumers keep going after the stop until the producers are gone and the queue is empty, so
 * every object is freed; what they free after the stop is not counted. */
static void *consumer_main(void *arg)
{
    worker *w = arg;
    bench_sampler smp = bench_sampler_make(opt.seed * 31 + (uint64_t)w->id, opt.sample_rate,
                                           tsc_overhead, &w->count);
    if (pin)
        bench_pin_thread(w->id);
    for (;;) {
        pthread_mutex_lock(&queue.lock);
        while (queue.count == 0 && queue.producers_left > 0)
            pthread_cond_wait(&queue.not_empty, &queue.lock);
        if (queue.count == 0) {
            pthread_mutex_unlock(&queue.lock);
            break;
        }
        void **batch = queue.ring[queue.head];
        queue.head = (queue.head + 1) % queue_cap;
        queue.count--;
        pthread_cond_signal(&queue.not_full);
        pthread_mutex_unlock(&queue.lock);
        free_batch(batch, &smp);
        if (!bench_counter_check(&w->count, &phase))
            bench_sampler_silence(&smp);
        else if (w->count.seen == BENCH_MEASURE)
            w->count.ops += batch_len;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    const bench_option opts[] = {{"--batch", &batch_len, 1, 1u << 24, NULL},
                                 {"--size", &object_size, 1, 1u << 20, NULL},
                                 {"--queue", &queue_cap, 1, 100000, NULL},
                                 {"--shuffle", &shuffle, 0, 1, NULL},
                                 {"--pin", &pin, 0, 1, NULL}};
    bench_parse_args(argc, argv, &opt, opts, 5,
                     "usage: xmalloc_bench [--batch N] [--size BYTES] [--queue N] [--shuffle 0|1]"
                     " [--pin 0|1]\n"
                     "  --threads N runs N producers and N consumers\n");
    if (shuffle) { /* a Fisher-Yates shuffle of 0..batch-1, drawn before the run */
        slot_of = bench_map(batch_len * sizeof(uint32_t));
        uint64_t rs = bench_seed(opt.seed);
        for (uint64_t i = 0; i < batch_len; i++)
            slot_of[i] = (uint32_t)i;
        for (uint64_t i = batch_len - 1; i > 0; i--) {
            uint64_t j = bench_rand(&rs) % (i + 1);
            uint32_t t = slot_of[i];
            slot_of[i] = slot_of[j];
            slot_of[j] = t;
        }
    }

    char params[160];
    snprintf(params, sizeof params, "batch=%llu;size=%llu;queue=%llu%s%s",
             (unsigned long long)batch_len, (unsigned long long)object_size,
             (unsigned long long)queue_cap, shuffle ? ";shuffle" : "", pin ? ";pin" : "");
    tsc_overhead = bench_tsc_overhead();
    queue.ring = bench_map(queue_cap * sizeof(void **));
    queue.producers_left = opt.threads;

    int n = 2 * opt.threads; /* even ids produce, odd ids consume */
    worker *ws = bench_map((size_t)n * sizeof(worker));
    pthread_t *tids = bench_map((size_t)n * sizeof(pthread_t));
    for (int i = 0; i < n; i++) {
        ws[i].id = i;
        int rc = pthread_create(&tids[i], NULL, i % 2 ? consumer_main : producer_main, &ws[i]);
        if (rc) {
            fprintf(stderr, "xmalloc_bench: pthread_create: %s\n", strerror(rc));
            return 1;
        }
    }
    bench_period t = bench_timeline(&phase, opt.warmup_s, opt.seconds);
    /* wake producers waiting for room: they see the stop and leave */
    pthread_mutex_lock(&queue.lock);
    pthread_cond_broadcast(&queue.not_full);
    pthread_mutex_unlock(&queue.lock);
    for (int i = 0; i < n; i++)
        pthread_join(tids[i], NULL);

    uint64_t frees = 0;
    const bench_counter **counters = bench_map((size_t)n * sizeof(*counters));
    for (int i = 0; i < n; i++) {
        frees += ws[i].count.ops; /* producers count nothing */
        counters[i] = &ws[i].count;
    }
    double wall = bench_period_s(t);
    bench_result r = {.workload = opt.label,
                      .threads = opt.threads,
                      .params = params,
                      .ops_per_sec = (double)frees / wall,
                      .wall_s = wall};
    printf("xmalloc_bench: %s threads=%d producers + %d consumers seconds=%.2f warmup=%.2f "
           "sample-rate=1/%u\n",
           params, opt.threads, opt.threads, opt.seconds, opt.warmup_s, opt.sample_rate);
    printf("  throughput     %.0f frees/s (%.0f batches/s)\n", r.ops_per_sec,
           r.ops_per_sec / (double)batch_len);
    bench_report(&r, counters, n, bench_cycles_per_ns(t.begin, t.end));
    return 0;
}
