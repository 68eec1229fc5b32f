/* thread_stacks - the fast path of a program whose heap grew after it started many threads.
 * A measuring tool, not a workload of the matrix.
 *
 * What it measures
 *   The main thread starts --threads threads that only wait (each stack a mapping of its own,
 *   8 MiB under glibc's defaults, placed by the kernel among the allocator's mappings), then
 *   allocates --blocks blocks of --block-mib MiB (4 by default: above every default mmap
 *   threshold, mappings too) and writes the first byte of each, then times a loop of
 *   malloc(64) and free: the best of --rounds rounds of --pairs pairs, in pairs per second.
 *   The blocks and the stacks between them spread the heap's mappings over gigabytes of
 *   address space: an allocator whose address-to-metadata map has a fast case for one region
 *   of it (cmalloc's pagemap, "the hot leaf") loses that case when the spread crosses the
 *   region's bounds, and every free then pays for it.
 *
 * Examples: LD_PRELOAD=build/libcmalloc.so build/bench/thread_stacks --threads 200 --blocks 64
 *           LD_PRELOAD=build/libcmalloc.so build/bench/thread_stacks --threads 0 --blocks 600
 *               --block-mib 40   (24 GiB of address space, 600 pages written)
 */
#define _GNU_SOURCE
#include <pthread.h>

#include "bench_util.h"

/* bench_option's values: whole numbers (bench_util.h) */
static struct {
    uint64_t threads, blocks, block_mib, pairs, rounds;
} opt = {200, 64, 4, 2000000, 5};

static pthread_barrier_t started, done;

static void *idle_thread(void *arg)
{
    pthread_barrier_wait(&started);
    pthread_barrier_wait(&done);
    return arg;
}

int main(int argc, char **argv)
{
    const bench_option opts[] = {{"--threads", &opt.threads, 0, 100000, NULL},
                                 {"--blocks", &opt.blocks, 0, 1000000, NULL},
                                 {"--block-mib", &opt.block_mib, 1, 1u << 20, NULL},
                                 {"--pairs", &opt.pairs, 1, UINT64_MAX >> 12, NULL},
                                 {"--rounds", &opt.rounds, 1, 1000000, NULL}};
    bench_parse_own_args(argc, argv, opts, 5,
                         "usage: thread_stacks [--threads N] [--blocks N] [--block-mib N]"
                         " [--pairs N] [--rounds N]\n");
    pthread_t *threads = calloc(opt.threads + 1, sizeof *threads);
    char **blocks = calloc(opt.blocks + 1, sizeof *blocks);
    if (threads == NULL || blocks == NULL) {
        perror("thread_stacks");
        return 1;
    }
    pthread_barrier_init(&started, NULL, (unsigned)opt.threads + 1);
    pthread_barrier_init(&done, NULL, (unsigned)opt.threads + 1);
    for (size_t i = 0; i < opt.threads; i++)
        if (pthread_create(&threads[i], NULL, idle_thread, NULL) != 0) {
            fprintf(stderr, "thread_stacks: thread %zu of %llu could not start\n", i,
                    (unsigned long long)opt.threads);
            return 1;
        }
    pthread_barrier_wait(&started);
    for (size_t i = 0; i < opt.blocks; i++) {
        blocks[i] = malloc(opt.block_mib << 20);
        if (blocks[i] == NULL) {
            perror("thread_stacks: malloc");
            return 1;
        }
        blocks[i][0] = 1;
    }
    uint64_t best = UINT64_MAX;
    for (uint64_t r = 0; r < opt.rounds; r++) {
        uint64_t start = bench_now_ns();
        for (uint64_t k = 0; k < opt.pairs; k++) {
            void *volatile p = malloc(64);
            free(p);
        }
        uint64_t took = bench_now_ns() - start;
        best = took < best ? took : best;
    }
    pthread_barrier_wait(&done);
    for (size_t i = 0; i < opt.threads; i++)
        pthread_join(threads[i], NULL);
    for (size_t i = 0; i < opt.blocks; i++)
        free(blocks[i]);
    printf("thread_stacks: %llu threads, %llu blocks of %llu MiB, best of %llu rounds of %llu "
           "pairs\n",
           (unsigned long long)opt.threads, (unsigned long long)opt.blocks,
           (unsigned long long)opt.block_mib, (unsigned long long)opt.rounds,
           (unsigned long long)opt.pairs);
    char params[96];
    snprintf(params, sizeof params, "blocks=%llu;block_mib=%llu;pairs=%llu",
             (unsigned long long)opt.blocks, (unsigned long long)opt.block_mib,
             (unsigned long long)opt.pairs);
    double seconds = (double)(best ? best : 1) / 1e9;
    bench_print_result(&(bench_result){.workload = "thread_stacks",
                                       .threads = (int)opt.threads,
                                       .params = params,
                                       .ops_per_sec = (double)opt.pairs / seconds,
                                       .wall_s = seconds});
    free(threads);
    free(blocks);
    return 0;
}
