/* mstress_bench - random-size malloc/free over a small live set, by threads that keep ending.
 *
 * What it measures
 *   --threads lanes run side by side. A lane is a relay of short-lived threads (bench_util.h's
 *   lanes): each thread makes --life allocator calls, then starts its successor and exits, and
 *   the successor carries on with the lane's --slots slots (1000). A step picks a slot at random:
 *   an empty slot gets a new block; a full one has its block checked and freed, and half the time
 *   (at random) a new block is allocated in its place. Sizes are uniform over 8 B..--max-size
 *   (1 KiB), except one allocation in --large-every (100), which is uniform over
 *   --max-size..--large-size (64 KiB). A slot is full about two times in three.
 *   Before it exits, a thread frees about half of its live blocks (each with probability 1/2) and
 *   leaves the rest to its successor, which frees them as it meets them: so frees cross threads,
 *   of memory whose allocating thread is exiting or gone, while the allocator also creates and
 *   tears down per-thread state every --life calls. This is the worker-pool pattern of servers
 *   that retire workers after some requests (and of test runners), with the size mix of ordinary
 *   programs.
 *   Memory is bounded: each lane has at most --slots live blocks, about 0.6 MiB with the defaults.
 *   Every random choice (slot, size, what is handed on) comes from --seed, the lane and the
 *   thread's place in the lane, so each run makes the same calls in the same order per lane.
 *
 * How to read it
 *   ops/s     allocator calls (mallocs and frees) per second, all lanes together, thread start
 *             and exit included. Higher is better. Counted in chunks of 64 steps as they finish,
 *             during the measured --seconds after --warmup. Threads started per second are
 *             printed too.
 *   latency   one call in --sample-rate (1,024), malloc or free, is timed with the cycle
 *             counter, timing overhead subtracted: p50/p99/p99.9/max per call. A thread's first
 *             calls, where the allocator sets up its cache, show in the tail.
 *   peak RSS  the process's maximum resident set, KiB: grows when an allocator strands the
 *             memory of exited threads instead of reusing it.
 *   A block found changed when it is freed stops the program with status 3.
 *
 * Example: build/bench/mstress_bench --threads 4 --seconds 1
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>

#include "bench_util.h"

static bench_common opt = {1, 0.2, 1.0, BENCH_SAMPLE_RATE, 1, "mstress"};
static uint64_t slots = 1000;
static uint64_t life = 10000;       /* allocator calls per thread */
static uint64_t max_size = 1024;    /* small sizes: 8 .. max_size */
static uint64_t large_size = 65536; /* large sizes: max_size .. large_size */
static uint64_t large_every = 100;  /* one allocation in this many is large */

static _Atomic int phase = BENCH_WARMUP;

static inline uint32_t pick_size(uint64_t *rs)
{
    if (bench_rand_below(rs, (uint32_t)large_every) == 0)
        return (uint32_t)max_size + bench_rand_below(rs, (uint32_t)(large_size - max_size + 1));
    return 8 + bench_rand_below(rs, (uint32_t)max_size - 8 + 1);
}

#define STEPS 64 /* steps between looks at the phase */

/* One thread's life on its lane's slots. */
static void leg(bench_lane *l, bench_slots *s, uint64_t rs, bench_sampler smp)
{
    uint64_t calls = 0;
    while (calls < life) {
        if (!bench_counter_check(&l->count, l->phase))
            return; /* the run is over: the blocks stay for main to check and free */
        uint64_t before = calls;
        for (int k = 0; k < STEPS; k++) {
            uint32_t j = bench_rand_below(&rs, s->n);
            if (s->block[j]) {
                bench_slot_free(s, j, &smp);
                calls++;
                if (bench_rand(&rs) & 1)
                    continue;
            }
            bench_slot_alloc(s, j, pick_size(&rs), &smp);
            calls++;
        }
        l->count.ops += calls - before;
    }
    /* hand on about half of the live blocks to the successor, free the rest */
    uint64_t before = calls;
    for (uint32_t j = 0; j < s->n; j++) {
        if (s->block[j] && (bench_rand(&rs) & 1)) {
            bench_slot_free(s, j, &smp);
            calls++;
        }
    }
    if (bench_counter_check(&l->count, l->phase))
        l->count.ops += calls - before;
}

int main(int argc, char **argv)
{
    const bench_option opts[] = {{"--slots", &slots, 1, 1u << 24, NULL},
                                 {"--life", &life, 1, UINT64_MAX >> 12, NULL},
                                 {"--max-size", &max_size, 8, 1u << 30, NULL},
                                 {"--large-size", &large_size, 8, 1u << 30, &max_size},
                                 {"--large-every", &large_every, 1, 1u << 30, NULL}};
    bench_parse_args(argc, argv, &opt, opts, 5,
                     "usage: mstress_bench [--slots N] [--life CALLS] [--max-size BYTES]\n"
                     "                     [--large-size BYTES] [--large-every N]\n"
                     "  --threads: lanes, each a relay of threads living --life calls each\n");

    char params[128];
    snprintf(params, sizeof params, "slots=%llu;life=%llu;max_size=%llu;large=%llu/%llu",
             (unsigned long long)slots, (unsigned long long)life, (unsigned long long)max_size,
             (unsigned long long)large_size, (unsigned long long)large_every);
    bench_lane *lanes = bench_lanes_map(opt.threads, leg, (uint32_t)slots);
    bench_period t = bench_lanes_run(lanes, opt.threads, &phase, &opt);
    bench_lanes_report(lanes, &opt, t, "mstress_bench", params, "calls");
    return 0;
}
