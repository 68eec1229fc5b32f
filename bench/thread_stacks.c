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

static struct {
    int threads, blocks, block_mib, rounds;
    long pairs;
} opt = {200, 64, 4, 5, 2000000};

static pthread_barrier_t started, done;

static void *idle_thread(void *arg)
{
    pthread_barrier_wait(&started);
    pthread_barrier_wait(&done);
    return arg;
}

static void usage(void)
{
    fprintf(stderr, "usage: thread_stacks [--threads N] [--blocks N] [--block-mib N] [--pairs N]\n"
                    "                     [--rounds N]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *v;
        if ((v = bench_opt(argc, argv, &i, "--threads")))
            opt.threads = (int)bench_parse_num("--threads", v);
        else if ((v = bench_opt(argc, argv, &i, "--blocks")))
            opt.blocks = (int)bench_parse_num("--blocks", v);
        else if ((v = bench_opt(argc, argv, &i, "--block-mib")))
            opt.block_mib = (int)bench_parse_num("--block-mib", v);
        else if ((v = bench_opt(argc, argv, &i, "--pairs")))
            opt.pairs = (long)bench_parse_num("--pairs", v);
        else if ((v = bench_opt(argc, argv, &i, "--rounds")))
            opt.rounds = (int)bench_parse_num("--rounds", v);
        else
            usage();
    }
    if (opt.threads < 0 || opt.blocks < 0 || opt.block_mib < 1 || opt.pairs < 1 || opt.rounds < 1)
        usage();
    pthread_t *threads = calloc((size_t)opt.threads + 1, sizeof *threads);
    char **blocks = calloc((size_t)opt.blocks + 1, sizeof *blocks);
    if (threads == NULL || blocks == NULL) {
        perror("thread_stacks");
        return 1;
    }
    pthread_barrier_init(&started, NULL, (unsigned)opt.threads + 1);
    pthread_barrier_init(&done, NULL, (unsigned)opt.threads + 1);
    for (int i = 0; i < opt.threads; i++)
        if (pthread_create(&threads[i], NULL, idle_thread, NULL) != 0) {
            fprintf(stderr, "thread_stacks: thread %d of %d could not start\n", i, opt.threads);
            return 1;
        }
    pthread_barrier_wait(&started);
    for (int i = 0; i < opt.blocks; i++) {
        blocks[i] = malloc((size_t)opt.block_mib << 20);
        if (blocks[i] == NULL) {
            perror("thread_stacks: malloc");
            return 1;
        }
        blocks[i][0] = 1;
    }
    uint64_t best = UINT64_MAX;
    for (int r = 0; r < opt.rounds; r++) {
        uint64_t start = bench_now_ns();
        for (long k = 0; k < opt.pairs; k++) {
            void *volatile p = malloc(64);
            free(p);
        }
        uint64_t took = bench_now_ns() - start;
        best = took < best ? took : best;
    }
    pthread_barrier_wait(&done);
    for (int i = 0; i < opt.threads; i++)
        pthread_join(threads[i], NULL);
    for (int i = 0; i < opt.blocks; i++)
        free(blocks[i]);
    printf("thread_stacks: %d threads, %d blocks of %d MiB, best of %d rounds of %ld pairs\n",
           opt.threads, opt.blocks, opt.block_mib, opt.rounds, opt.pairs);
    char params[80];
    snprintf(params, sizeof params, "blocks=%d;block_mib=%d;pairs=%ld", opt.blocks, opt.block_mib,
             opt.pairs);
    double seconds = (double)(best ? best : 1) / 1e9;
    bench_print_result(&(bench_result){.workload = "thread_stacks",
                                       .threads = opt.threads,
                                       .params = params,
                                       .ops_per_sec = (double)opt.pairs / seconds,
                                       .wall_s = seconds});
    free(threads);
    free(blocks);
    return 0;
}
