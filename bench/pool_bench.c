/* pool_bench - cmalloc's object pool and arena against malloc: N allocations of one size, then
 * the N frees.
 *
 * What it measures
 *   One round: --count allocations of --size bytes, each pointer stored in an array and folded
 *   into a sink, then every object freed, its pointer read back in allocation order
 *   (--free-order=fifo), the reverse (lifo) or a random order drawn before timing (random)
 *   and folded again, so nothing is optimised away and the two sums are checked against each
 *   other. The arena has no single frees: its frees are one reset, and it reads no pointer
 *   back (that would be the benchmark's work, 0.3 ns an object on 1M x 16 B). So the time is
 *   the allocator's own work (and the memory it touches itself: headers, links, bitmaps) plus
 *   the same loop for every allocator, not the program's. The loops are compiled once for each
 *   allocator, order and option (run()), with their counters in registers.
 *   --touch: each object is also written (its index) at allocation and read back (folded
 *   instead of its pointer) at its free, as a program would use it: every allocator then pays
 *   the same extra memory traffic, which narrows the ratios.
 *   --alloc malloc   malloc/free: whichever allocator is loaded (glibc, or LD_PRELOAD)
 *   --alloc pool     cmalloc_pool_alloc/free on a GROW pool with room for --count objects
 *   --alloc arena    cmalloc_arena_alloc(size, 16), then cmalloc_arena_reset
 *   pool and arena are cmalloc's API as cmalloc.h gives it to a program, with the inline fast
 *   paths of cmalloc_pool_alloc/free and cmalloc_arena_alloc; the functions are weak symbols,
 *   found when cmalloc is preloaded (LD_PRELOAD=build/libcmalloc.so). --calls: every pool and
 *   arena call goes to the library instead (what a call costs: a program calling through a
 *   function pointer, or without the inline paths). The pool or arena is created before the
 *   first round and destroyed after the last, outside the timed region; the pointer array
 *   comes from mmap. malloc and free are called as any program calls them (through the PLT).
 *   --rounds rounds (default 7) run back to back, each timed alone with CLOCK_MONOTONIC; the
 *   first one also pays for faulting the memory in, for every allocator alike.
 *
 * How to read it
 *   ns/object  the median round's time divided by --count: one allocation plus one free (or
 *              its share of the reset), with the write and the read under --touch. Lower is
 *              better. Beneath it the same for the rounds' allocation loops alone and their
 *              free loops alone (each loop's median, so the two need not add up to the whole):
 *              where the time goes, as in a free order that makes every free miss the cache.
 *   ops/s      --count / the median round's time: objects allocated and freed per second.
 *   The RESULT line (bench_util.h) has ops_per_sec and wall_s (the median round); the latency
 *   fields are empty. --threads must be 1 (the work is fixed; the matrix runs it once);
 *   --seconds and --warmup are accepted for the matrix script and ignored.
 *
 * Example: LD_PRELOAD=build/libcmalloc.so build/bench/pool_bench --alloc pool --size 16 [--calls]
 */
#define _GNU_SOURCE
#include <stdbool.h>

#include "bench_util.h"

/* cmalloc's API as a program compiled against cmalloc.h sees it (with the inline fast paths of
 * cmalloc_pool_alloc and cmalloc_arena_alloc), its functions declared weak: the binary links
 * without cmalloc, so its malloc runs compare every allocator on the very same program, and
 * they resolve when cmalloc is preloaded. */
#include "cmalloc.h"
#pragma weak cmalloc_pool_create
#pragma weak cmalloc_pool_alloc
#pragma weak cmalloc_pool_free
#pragma weak cmalloc_pool_in_use
#pragma weak cmalloc_pool_destroy
#pragma weak cmalloc_arena_create
#pragma weak cmalloc_arena_alloc
#pragma weak cmalloc_arena_reset
#pragma weak cmalloc_arena_destroy

enum kind { KIND_MALLOC, KIND_POOL, KIND_ARENA };
enum order { ORDER_FIFO, ORDER_LIFO, ORDER_RANDOM };

static struct {
    enum kind kind;
    size_t count;
    size_t size;
    enum order order;
    int rounds;
    int threads;
    const char *label;
    uint64_t seed;
    int touch;
    int calls;
} opt = {KIND_MALLOC, 1000000, 16, ORDER_FIFO, 7, 1, "pool", 1, 0, 0};

static void need_api(void)
{
    /* all came together; cmalloc_pool_in_use came with the three-argument create, so an older
     * cmalloc that lacks it is not called with the wrong signature */
    if ((void *)cmalloc_pool_in_use == NULL || (void *)cmalloc_pool_create == NULL ||
        (void *)cmalloc_arena_create == NULL) {
        fprintf(stderr, "pool_bench: --alloc pool/arena needs cmalloc's API: run with "
                        "LD_PRELOAD=build/libcmalloc.so\n");
        exit(2);
    }
}

static uint64_t volatile sink;

/* A round's time, and its allocations' alone (its first loop), for the split of its time. */
typedef struct {
    uint64_t total_ns, allocations_ns;
} round_time;

/* One round's work, written once and instantiated for each allocator, --touch, free order and
 * --calls (all constants in each copy): so the loops keep their counters in registers and test
 * nothing but the allocator's result, and every allocator runs the same loop. What a round
 * keeps of object p (allocated i-th): with touch its contents, written at allocation; else the
 * pointer itself. The i-th object to free: in allocation order without reading an array
 * (ordered false), so that the common case adds no memory traffic of the benchmark's own.
 * calls: cmalloc_pool_alloc/free and cmalloc_arena_alloc called in the library, as
 * (cmalloc_pool_alloc)(pool) does, instead of cmalloc.h's inline fast paths. */
static inline __attribute__((always_inline)) round_time run(enum kind kind, bool touch,
                                                            bool ordered, bool calls,
                                                            void **objects, const uint32_t *order,
                                                            cmalloc_pool *pool,
                                                            cmalloc_arena *arena)
{
    size_t n = opt.count, size = opt.size;
    uint64_t kept = 0, folded = 0;
    uint64_t start = bench_now_ns();
    for (size_t i = 0; i < n; i++) {
        void *p = kind == KIND_MALLOC ? malloc(size)
                  : kind == KIND_POOL
                      ? (calls ? (cmalloc_pool_alloc)(pool) : cmalloc_pool_alloc(pool))
                  : calls ? (cmalloc_arena_alloc)(arena, size, 16)
                          : cmalloc_arena_alloc(arena, size, 16);
        objects[i] = p;
        if (touch)
            *(uint64_t *)p = i;
        else
            kept += (uint64_t)(uintptr_t)p;
    }
    uint64_t allocated = bench_now_ns() - start;
    /* The frees: each pointer read back (in the free order) and freed. The arena frees nothing
     * one by one, its frees are the reset: it reads the pointers back only to use the objects
     * (touch), and its pointers were folded as they came. */
    if (kind == KIND_ARENA && !touch)
        folded = kept;
    for (size_t i = 0; i < n && (kind != KIND_ARENA || touch); i++) {
        void *p = objects[ordered ? order[i] : i];
        folded += touch ? *(const uint64_t *)p : (uint64_t)(uintptr_t)p;
        if (kind == KIND_MALLOC)
            free(p);
        else if (kind == KIND_POOL && calls)
            (cmalloc_pool_free)(pool, p);
        else if (kind == KIND_POOL)
            cmalloc_pool_free(pool, p);
    }
    if (kind == KIND_ARENA)
        cmalloc_arena_reset(arena);
    uint64_t took = bench_now_ns() - start;
    sink += folded;
    /* untouched: the pointers folded at free are those kept at allocation; touched: every
     * object still holds its index */
    if (touch ? folded != (uint64_t)n * (n - 1) / 2 : folded != kept) {
        fprintf(stderr, "pool_bench: objects were lost or overwritten\n");
        exit(1);
    }
    return (round_time){.total_ns = took, .allocations_ns = allocated};
}

#define RUN(kind, touch, ordered, calls)                                                 \
    static __attribute__((noinline)) round_time run_##kind##_##touch##ordered##calls(    \
        void **objects, const uint32_t *order, cmalloc_pool *pool, cmalloc_arena *arena) \
    {                                                                                    \
        return run(kind, touch, ordered, calls, objects, order, pool, arena);            \
    }
#define RUN_KIND(kind)                                                                             \
    RUN(kind, 0, 0, 0)                                                                             \
    RUN(kind, 0, 1, 0) RUN(kind, 1, 0, 0) RUN(kind, 1, 1, 0) RUN(kind, 0, 0, 1) RUN(kind, 0, 1, 1) \
        RUN(kind, 1, 0, 1) RUN(kind, 1, 1, 1)
RUN_KIND(KIND_MALLOC)
RUN_KIND(KIND_POOL)
RUN_KIND(KIND_ARENA)

typedef round_time round_fn(void **, const uint32_t *, cmalloc_pool *, cmalloc_arena *);
/* rounds[kind][touch][ordered][calls] */
#define ROW(k)                                                            \
    {                                                                     \
        {{run_##k##_000, run_##k##_001}, {run_##k##_010, run_##k##_011}}, \
        {                                                                 \
            {run_##k##_100, run_##k##_101},                               \
            {                                                             \
                run_##k##_110, run_##k##_111                              \
            }                                                             \
        }                                                                 \
    }
static round_fn *const rounds[3][2][2][2] = {ROW(KIND_MALLOC), ROW(KIND_POOL), ROW(KIND_ARENA)};

static int compare_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: pool_bench [--alloc malloc|pool|arena] [--count N] [--size BYTES (8..)]\n"
            "                  [--free-order fifo|lifo|random] [--rounds R] [--seed S] [--touch]\n"
            "                  [--calls]\n");
    exit(2);
}

static void parse(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *v;
        if ((v = bench_opt(argc, argv, &i, "--alloc"))) {
            opt.kind = !strcmp(v, "malloc")  ? KIND_MALLOC
                       : !strcmp(v, "pool")  ? KIND_POOL
                       : !strcmp(v, "arena") ? KIND_ARENA
                                             : (usage(), KIND_MALLOC);
        } else if ((v = bench_opt(argc, argv, &i, "--count"))) {
            opt.count = (size_t)bench_parse_num("--count", v);
        } else if ((v = bench_opt(argc, argv, &i, "--size"))) {
            opt.size = (size_t)bench_parse_num("--size", v);
        } else if ((v = bench_opt(argc, argv, &i, "--free-order"))) {
            opt.order = !strcmp(v, "fifo")     ? ORDER_FIFO
                        : !strcmp(v, "lifo")   ? ORDER_LIFO
                        : !strcmp(v, "random") ? ORDER_RANDOM
                                               : (usage(), ORDER_FIFO);
        } else if ((v = bench_opt(argc, argv, &i, "--rounds"))) {
            opt.rounds = (int)bench_parse_num("--rounds", v);
        } else if (!strcmp(argv[i], "--touch")) {
            opt.touch = 1;
        } else if (!strcmp(argv[i], "--calls")) {
            opt.calls = 1;
        } else if ((v = bench_opt(argc, argv, &i, "--seed"))) {
            opt.seed = (uint64_t)bench_parse_num("--seed", v);
        } else if ((v = bench_opt(argc, argv, &i, "--threads"))) {
            opt.threads = (int)bench_parse_num("--threads", v);
        } else if ((v = bench_opt(argc, argv, &i, "--label"))) {
            opt.label = v;
        } else if ((v = bench_opt(argc, argv, &i, "--seconds")) ||
                   (v = bench_opt(argc, argv, &i, "--warmup"))) {
            /* fixed work: accepted for scripts/bench-matrix.sh, ignored */
        } else {
            usage();
        }
    }
    if (opt.count < 2 || opt.count > UINT32_MAX || opt.size < 8 || opt.rounds < 1 ||
        opt.threads != 1)
        usage();
}

int main(int argc, char **argv)
{
    static const char *kinds[] = {"malloc", "pool", "arena"},
                      *orders[] = {"fifo", "lifo", "random"};
    parse(argc, argv);
    if (opt.kind != KIND_MALLOC)
        need_api();
    void **objects = bench_map(opt.count * sizeof *objects);
    uint32_t *order = bench_map(opt.count * sizeof *order);
    for (size_t i = 0; i < opt.count; i++)
        order[i] = (uint32_t)(opt.order == ORDER_LIFO ? opt.count - 1 - i : i);
    uint64_t state = bench_seed(opt.seed);
    for (size_t i = opt.count - 1; opt.order == ORDER_RANDOM && i > 0; i--) { /* Fisher-Yates */
        size_t j = bench_rand(&state) % (i + 1);
        uint32_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    cmalloc_pool *pool = NULL;
    cmalloc_arena *arena = NULL;
    if (opt.kind == KIND_POOL &&
        (pool = cmalloc_pool_create(opt.size, opt.count, CMALLOC_POOL_GROW)) == NULL) {
        perror("pool_bench: cmalloc_pool_create");
        return 2;
    }
    if (opt.kind == KIND_ARENA &&
        (arena = cmalloc_arena_create(opt.count * ((opt.size + 15) & ~(size_t)15))) == NULL) {
        perror("pool_bench: cmalloc_arena_create");
        return 2;
    }
    uint64_t *times = bench_map((size_t)opt.rounds * sizeof *times);
    uint64_t *allocations = bench_map((size_t)opt.rounds * sizeof *allocations);
    uint64_t *frees = bench_map((size_t)opt.rounds * sizeof *frees);
    for (int r = 0; r < opt.rounds; r++) {
        round_time t = rounds[opt.kind][opt.touch][opt.order != ORDER_FIFO][opt.calls](
            objects, order, pool, arena);
        times[r] = t.total_ns;
        allocations[r] = t.allocations_ns;
        frees[r] = t.total_ns - t.allocations_ns;
    }
    if (pool)
        cmalloc_pool_destroy(pool);
    if (arena)
        cmalloc_arena_destroy(arena);
    qsort(times, (size_t)opt.rounds, sizeof *times, compare_u64);
    qsort(allocations, (size_t)opt.rounds, sizeof *allocations, compare_u64);
    qsort(frees, (size_t)opt.rounds, sizeof *frees, compare_u64);
    double median = (double)times[opt.rounds / 2];
    printf("pool_bench: %s, %zu objects of %zu bytes, free order %s, %d rounds%s\n",
           kinds[opt.kind], opt.count, opt.size, orders[opt.order], opt.rounds,
           opt.touch ? ", objects touched" : "");
    printf("  ns/object  min %.2f  median %.2f  max %.2f\n", (double)times[0] / (double)opt.count,
           median / (double)opt.count, (double)times[opt.rounds - 1] / (double)opt.count);
    printf("  of which   allocations median %.2f  frees median %.2f (each phase's own median)\n",
           (double)allocations[opt.rounds / 2] / (double)opt.count,
           (double)frees[opt.rounds / 2] / (double)opt.count);
    char params[96];
    snprintf(params, sizeof params, "size=%zu;count=%zu;order=%s%s", opt.size, opt.count,
             orders[opt.order], opt.touch ? ";touch" : "");
    bench_result result = {.workload = opt.label,
                           .threads = 1,
                           .params = params,
                           .ops_per_sec = (double)opt.count / (median * 1e-9),
                           .wall_s = median * 1e-9};
    bench_print_result(&result);
    return 0;
}
