/* larson_bench - a server's worker threads: a window of live blocks replaced at random, with the
 * window passed from each thread to a new one after every round.
 *
 * What it measures
 *   --threads lanes run side by side; each lane keeps a window of --window blocks (5000) of
 *   sizes uniform over --min-size..--max-size (8..1000 B). A replacement picks a block at random,
 *   checks and frees it, and allocates one of a new random size in its place. A lane is a relay of
 *   threads (bench_util.h's lanes): each does --round replacements (50,000), then starts a new
 *   thread and exits, and the new thread carries on with the same window, so the first blocks it
 *   frees were allocated by a thread that is exiting or gone, and by the end of its round nearly
 *   all of the window is its own. The lane's first thread fills the window (during the warm-up).
 *   This is a server whose connection threads come and go while the data they built lives on:
 *   the allocator sees a steady, fragmented heap of small objects, frees of a dead thread's
 *   memory, and per-thread state created and torn down every round.
 *   Memory is bounded: --window live blocks per lane, about 2.5 MiB with the defaults.
 *   Every random choice comes from --seed, the lane and the thread's place in the lane.
 *
 * How to read it
 *   ops/s     replacements (one free and one malloc) per second, all lanes together, thread
 *             start and exit included. Higher is better. Counted in chunks of 64 as they finish,
 *             during the measured --seconds after --warmup. Threads started per second are
 *             printed too.
 *   latency   one call in --sample-rate (1,024), malloc or free, is timed with the cycle
 *             counter, timing overhead subtracted: p50/p99/p99.9/max per call.
 *   peak RSS  the process's maximum resident set, KiB: the windows' live data (printed) plus what
 *             the allocator holds beside it; grows if exited threads' memory is stranded.
 *   A block found changed when it is freed stops the program with status 3.
 *
 * Example: build/bench/larson_bench --threads 2 --seconds 1
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>

#include "bench_util.h"

static bench_common opt = {1, 0.2, 1.0, BENCH_SAMPLE_RATE, 1, "larson"};
static uint64_t window = 5000;
static uint64_t round_len = 50000; /* replacements per thread */
static uint64_t min_size = 8;
static uint64_t max_size = 1000;

static _Atomic int phase = BENCH_WARMUP;

static inline uint32_t pick_size(uint64_t *rs)
{
    return (uint32_t)min_size + bench_rand_below(rs, (uint32_t)(max_size - min_size + 1));
}

#define CHUNK 64 /* replacements between looks at the phase */

/* One thread's round on its lane's window. */
static void leg(bench_lane *l, bench_slots *s, uint64_t rs, bench_sampler smp)
{
    if (l->generation == 0)
        for (uint32_t j = 0; j < s->n; j++)
            bench_slot_alloc(s, j, pick_size(&rs), &smp);
    for (uint64_t done = 0; done < round_len;) {
        if (!bench_counter_check(&l->count, l->phase))
            return; /* the run is over: the window stays for main to check and free */
        uint64_t k = round_len - done < CHUNK ? round_len - done : CHUNK;
        for (uint64_t i = 0; i < k; i++) {
            uint32_t j = bench_rand_below(&rs, s->n);
            bench_slot_free(s, j, &smp);
            bench_slot_alloc(s, j, pick_size(&rs), &smp);
        }
        done += k;
        l->count.ops += k;
    }
}

int main(int argc, char **argv)
{
    const bench_option opts[] = {{"--window", &window, 1, 1u << 24, NULL},
                                 {"--round", &round_len, 1, UINT64_MAX >> 12, NULL},
                                 {"--min-size", &min_size, 1, 1u << 30, NULL},
                                 {"--max-size", &max_size, 1, 1u << 30, &min_size}};
    bench_parse_args(argc, argv, &opt, opts, 4,
                     "usage: larson_bench [--window N] [--round N] [--min-size BYTES]\n"
                     "                    [--max-size BYTES]\n"
                     "  --threads: lanes, each a relay of threads doing --round replacements\n");

    char params[128];
    snprintf(params, sizeof params, "window=%llu;round=%llu;sizes=%llu-%llu",
             (unsigned long long)window, (unsigned long long)round_len,
             (unsigned long long)min_size, (unsigned long long)max_size);
    bench_lane *lanes = bench_lanes_map(opt.threads, leg, (uint32_t)window);
    bench_period t = bench_lanes_run(lanes, opt.threads, &phase, &opt);
    printf("larson_bench: live data about %.1f MiB in the windows\n",
           (double)opt.threads * (double)window * (double)(min_size + max_size) / 2 / 1048576.0);
    bench_lanes_report(lanes, &opt, t, "larson_bench", params, "replacements");
    return 0;
}
