/* rpmalloc_bench - threads replacing their blocks in rounds, every second round's blocks freed by
 * another thread.
 *
 * What it measures
 *   --threads threads each keep --blocks live blocks (1000) of random size, log-uniform over
 *   --min-size..--max-size (8 B..16 KiB: every power of two equally likely). A round replaces the
 *   next --round blocks (100) in the thread's ring: each is checked and freed, and a block of a
 *   new random size takes its place. Every second round the thread does not free them itself: it
 *   hands that round's blocks (pointer and size) to the next thread's mailbox (thread i to
 *   i + 1 mod T; with one thread, to itself), and every thread frees what its mailbox holds at
 *   the start of each round. So half of all frees are remote, in batches of --round, of blocks of
 *   every size class, by a thread that is also allocating and freeing its own: the allocator's
 *   remote-free path competes with its local fast path on the same caches. This is the
 *   cross-thread pattern of rpmalloc's benchmark, written here from its description.
 *   A mailbox holds --mailbox rounds (8); a thread whose target's mailbox is full frees its own
 *   mailbox while it waits, so a ring of threads never deadlocks. Memory is bounded: per thread
 *   --blocks live blocks plus --mailbox rounds in its mailbox, about 2.5 MiB with the defaults.
 *   Every random choice comes from --seed and the thread's number.
 *
 * How to read it
 *   ops/s     block replacements per second (one malloc, and one free by this thread or the
 *             next), all threads together. Higher is better. Counted by rounds as they finish,
 *             during the measured --seconds after --warmup.
 *   latency   one call in --sample-rate (1,024), malloc or free (local or remote), is timed
 *             with the cycle counter, timing overhead subtracted: p50/p99/p99.9/max per call.
 *   peak RSS  the process's maximum resident set, KiB: the live blocks plus what the allocator
 *             keeps; grows when remote frees are stranded in the freeing thread's cache.
 *   A block found changed when it is freed stops the program with status 3.
 *
 * Example: build/bench/rpmalloc_bench --threads 4 --seconds 1
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "bench_util.h"

static bench_common opt = {1, 0.2, 1.0, BENCH_SAMPLE_RATE, 1, "rpmalloc"};
static uint64_t blocks = 1000;
static uint64_t round_len = 100; /* blocks replaced per round */
static uint64_t mailbox_rounds = 8;
static uint64_t min_size = 8;
static uint64_t max_size = 16384;

static _Atomic int phase = BENCH_WARMUP;
static uint64_t tsc_overhead;

/* Blocks handed to a thread, freed by it: a ring of (pointer, size), guarded by lock. */
typedef struct {
    pthread_mutex_t lock;
    void **block;
    uint32_t *size;
    uint64_t head, count; /* count <= mailbox_rounds * round_len */
} mailbox;

typedef struct {
    _Alignas(BENCH_CACHELINE) int id;
    bench_counter count;
    bench_slots slots;
    mailbox box;
    void **taken; /* what the thread took out of its mailbox to free, from mmap */
    uint32_t *taken_size;
} worker;

static worker *ws;

static inline uint32_t pick_size(uint64_t *rs)
{
    double lo = (double)min_size, hi = (double)max_size;
    double s = lo * pow(hi / lo, bench_rand_unit(rs));
    return s > hi ? (uint32_t)hi : (uint32_t)s;
}

/* Frees what this thread's mailbox holds (copied out under the lock, freed outside it). */
static void free_mailbox(worker *w, bench_sampler *smp)
{
    mailbox *b = &w->box;
    uint64_t cap = mailbox_rounds * round_len, n;
    pthread_mutex_lock(&b->lock);
    n = b->count;
    for (uint64_t i = 0; i < n; i++) {
        w->taken[i] = b->block[(b->head + i) % cap];
        w->taken_size[i] = b->size[(b->head + i) % cap];
    }
    b->head = (b->head + n) % cap;
    b->count = 0;
    pthread_mutex_unlock(&b->lock);
    bench_slots s = {w->taken, w->taken_size, (uint32_t)n};
    for (uint32_t i = 0; i < n; i++)
        bench_slot_free(&s, i, smp);
}

/* Hands slots [first, first + round_len) of w to target's mailbox, waiting for room (and freeing
 * w's own mailbox meanwhile). False when the run stopped while it waited. */
static int hand_over(worker *w, worker *target, uint32_t first, bench_sampler *smp)
{
    mailbox *b = &target->box;
    uint64_t cap = mailbox_rounds * round_len;
    for (;;) {
        pthread_mutex_lock(&b->lock);
        if (b->count + round_len <= cap) {
            for (uint64_t i = 0; i < round_len; i++) {
                uint64_t at = (b->head + b->count + i) % cap;
                b->block[at] = w->slots.block[first + i];
                b->size[at] = w->slots.size[first + i];
                w->slots.block[first + i] = NULL;
            }
            b->count += round_len;
            pthread_mutex_unlock(&b->lock);
            return 1;
        }
        pthread_mutex_unlock(&b->lock);
        free_mailbox(w, smp);
        if (atomic_load_explicit(&phase, memory_order_relaxed) == BENCH_STOP)
            return 0;
        sched_yield();
    }
}

static void *thread_main(void *arg)
{
    worker *w = arg;
    worker *target = &ws[(w->id + 1) % opt.threads];
    uint64_t rs = bench_seed(opt.seed * 977 + (uint64_t)w->id);
    bench_sampler smp = bench_sampler_make(opt.seed * 31 + (uint64_t)w->id, opt.sample_rate,
                                           tsc_overhead, &w->count);
    for (uint32_t j = 0; j < w->slots.n; j++)
        bench_slot_alloc(&w->slots, j, pick_size(&rs), &smp);
    uint32_t cursor = 0;
    for (uint64_t r = 0; bench_counter_check(&w->count, &phase); r++) {
        free_mailbox(w, &smp);
        if (r % 2 == 1) {
            if (!hand_over(w, target, cursor, &smp))
                break;
        } else {
            for (uint32_t i = 0; i < round_len; i++)
                bench_slot_free(&w->slots, cursor + i, &smp);
        }
        for (uint32_t i = 0; i < round_len; i++)
            bench_slot_alloc(&w->slots, cursor + i, pick_size(&rs), &smp);
        cursor = (uint32_t)((cursor + round_len) % w->slots.n);
        w->count.ops += round_len;
    }
    bench_sampler_silence(&smp);
    return NULL;
}

int main(int argc, char **argv)
{
    const bench_option opts[] = {{"--blocks", &blocks, 1, 1u << 24, NULL},
                                 {"--round", &round_len, 1, 1u << 20, NULL},
                                 {"--mailbox", &mailbox_rounds, 1, 1u << 16, NULL},
                                 {"--min-size", &min_size, 1, 1u << 30, NULL},
                                 {"--max-size", &max_size, 1, 1u << 30, &min_size}};
    bench_parse_args(argc, argv, &opt, opts, 5,
                     "usage: rpmalloc_bench [--blocks N] [--round N] [--mailbox ROUNDS]\n"
                     "                      [--min-size BYTES] [--max-size BYTES]\n"
                     "  --blocks must be a multiple of --round\n");
    if (blocks % round_len != 0) {
        fprintf(stderr, "rpmalloc_bench: --blocks %llu is not a multiple of --round %llu\n",
                (unsigned long long)blocks, (unsigned long long)round_len);
        return 2;
    }

    char params[128];
    snprintf(params, sizeof params, "blocks=%llu;round=%llu;mailbox=%llu;sizes=%llu-%llu",
             (unsigned long long)blocks, (unsigned long long)round_len,
             (unsigned long long)mailbox_rounds, (unsigned long long)min_size,
             (unsigned long long)max_size);
    tsc_overhead = bench_tsc_overhead();
    int n = opt.threads;
    uint64_t cap = mailbox_rounds * round_len;
    ws = bench_map((size_t)n * sizeof(worker));
    pthread_t *tids = bench_map((size_t)n * sizeof(pthread_t));
    for (int i = 0; i < n; i++) {
        ws[i].id = i;
        ws[i].slots = bench_slots_map((uint32_t)blocks);
        pthread_mutex_init(&ws[i].box.lock, NULL);
        ws[i].box.block = bench_map(cap * sizeof(void *));
        ws[i].box.size = bench_map(cap * sizeof(uint32_t));
        ws[i].taken = bench_map(cap * sizeof(void *));
        ws[i].taken_size = bench_map(cap * sizeof(uint32_t));
    }
    for (int i = 0; i < n; i++) {
        int rc = pthread_create(&tids[i], NULL, thread_main, &ws[i]);
        if (rc) {
            fprintf(stderr, "rpmalloc_bench: pthread_create: %s\n", strerror(rc));
            return 1;
        }
    }
    bench_period t = bench_timeline(&phase, opt.warmup_s, opt.seconds);
    for (int i = 0; i < n; i++)
        pthread_join(tids[i], NULL);

    /* Everything left (the rings and the mailboxes) is checked and freed by the main thread. */
    uint64_t replaced = 0;
    const bench_counter **counters = bench_map((size_t)n * sizeof(*counters));
    bench_sampler quiet = bench_sampler_make(0, 1, 0, &ws[0].count);
    bench_sampler_silence(&quiet);
    for (int i = 0; i < n; i++) {
        free_mailbox(&ws[i], &quiet);
        for (uint32_t j = 0; j < ws[i].slots.n; j++)
            if (ws[i].slots.block[j] != NULL)
                bench_slot_free(&ws[i].slots, j, &quiet);
        replaced += ws[i].count.ops;
        counters[i] = &ws[i].count;
    }
    double wall = bench_period_s(t);
    bench_result r = {.workload = opt.label,
                      .threads = n,
                      .params = params,
                      .ops_per_sec = (double)replaced / wall,
                      .wall_s = wall};
    printf("rpmalloc_bench: %s threads=%d seconds=%.2f warmup=%.2f sample-rate=1/%u\n", params, n,
           opt.seconds, opt.warmup_s, opt.sample_rate);
    printf("  throughput     %.0f replacements/s, half of them freed by the next thread\n",
           r.ops_per_sec);
    bench_report(&r, counters, n, bench_cycles_per_ns(t.begin, t.end));
    return 0;
}
