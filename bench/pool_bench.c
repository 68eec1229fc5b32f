/* pool_bench - cmalloc's object pool and arena against malloc: N allocations of one size, then
 * the N frees.
 *
 * What it measures
 *   One round: --count allocations of --size bytes, then every object freed, in allocation
 *   order (--free-order=fifo), the reverse (lifo) or a random order drawn before timing
 *   (random); every pointer is folded into a sink at its free, so nothing is optimised away,
 *   and the sum is checked against the pointers allocated. The arena has no single frees: it
 *   folds every pointer, then resets once. So the time is the allocator's own work (and the
 *   memory it touches itself: headers, links, bitmaps), not the program's.
 *   --touch: each object is also written (its index) at allocation and read back (folded
 *   instead of its pointer) at its free, as a program would use it: every allocator then pays
 *   the same extra memory traffic, which narrows the ratios.
 *   --alloc malloc   malloc/free: whichever allocator is loaded (glibc, or LD_PRELOAD)
 *   --alloc pool     cmalloc_pool_alloc/free on a GROW pool with room for --count objects
 *   --alloc arena    cmalloc_arena_alloc(size, 16), then cmalloc_arena_reset
 *   pool and arena are cmalloc's API, found with dlsym: run them with cmalloc preloaded
 *   (LD_PRELOAD=build/libcmalloc.so). The pool or arena is created before the first round and
 *   destroyed after the last, outside the timed region; the pointer array comes from mmap.
 *   --rounds rounds (default 7) run back to back, each timed alone with CLOCK_MONOTONIC; the
 *   first one also pays for faulting the memory in, for every allocator alike.
 *
 * How to read it
 *   ns/object  the median round's time divided by --count: one allocation plus one free (or
 *              its share of the reset), with the write and the read under --touch. Lower is
 *              better.
 *   ops/s      --count / the median round's time: objects allocated and freed per second.
 *   The RESULT line (bench_util.h) has ops_per_sec and wall_s (the median round); the latency
 *   fields are empty. --threads must be 1 (the work is fixed; the matrix runs it once);
 *   --seconds and --warmup are accepted for the matrix script and ignored.
 *
 * Example: LD_PRELOAD=build/libcmalloc.so build/bench/pool_bench --alloc pool --size 16
 */
#define _GNU_SOURCE
#include <dlfcn.h>

#include "bench_util.h"

typedef struct cmalloc_pool cmalloc_pool;
typedef struct cmalloc_arena cmalloc_arena;
#define POOL_GROW 1u /* CMALLOC_POOL_GROW: bench programs do not include cmalloc.h */

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
} opt = {KIND_MALLOC, 1000000, 16, ORDER_FIFO, 7, 1, "pool", 1, 0};

static struct {
    cmalloc_pool *(*pool_create)(size_t, size_t, unsigned);
    void *(*pool_alloc)(cmalloc_pool *);
    void (*pool_free)(cmalloc_pool *, void *);
    void (*pool_destroy)(cmalloc_pool *);
    cmalloc_arena *(*arena_create)(size_t);
    void *(*arena_alloc)(cmalloc_arena *, size_t, size_t);
    void (*arena_reset)(cmalloc_arena *);
    void (*arena_destroy)(cmalloc_arena *);
} api;

static void *need(const char *name)
{
    void *f = dlsym(RTLD_DEFAULT, name);
    if (f == NULL) {
        fprintf(stderr,
                "pool_bench: --alloc pool/arena needs cmalloc's API (%s not found): "
                "run with LD_PRELOAD=build/libcmalloc.so\n",
                name);
        exit(2);
    }
    return f;
}

static void lookup_api(void)
{
    /* cmalloc_pool_in_use came with the three-argument create: older cmallocs lack both */
    need("cmalloc_pool_in_use");
    *(void **)&api.pool_create = need("cmalloc_pool_create");
    *(void **)&api.pool_alloc = need("cmalloc_pool_alloc");
    *(void **)&api.pool_free = need("cmalloc_pool_free");
    *(void **)&api.pool_destroy = need("cmalloc_pool_destroy");
    *(void **)&api.arena_create = need("cmalloc_arena_create");
    *(void **)&api.arena_alloc = need("cmalloc_arena_alloc");
    *(void **)&api.arena_reset = need("cmalloc_arena_reset");
    *(void **)&api.arena_destroy = need("cmalloc_arena_destroy");
}

static uint64_t volatile sink;

/* What a round keeps of object p (allocated i-th): with --touch its contents, written at
 * allocation; else the pointer itself. Either way it goes into the sink. */
static inline uint64_t keep(void *p, size_t i)
{
    if (opt.touch)
        *(uint64_t *)p = i;
    return opt.touch ? 0 : (uint64_t)(uintptr_t)p;
}
static inline uint64_t fold(const void *p)
{
    return opt.touch ? *(const uint64_t *)p : (uint64_t)(uintptr_t)p;
}

/* The i-th object to free: in allocation order without reading an array (order == NULL), so
 * that the common case adds no memory traffic of the benchmark's own. */
static inline size_t nth(const uint32_t *order, size_t i)
{
    return order ? order[i] : i;
}

/* One timed round; returns its ns. objects: the pointer array; order: the free order. */
static uint64_t round_ns(void **objects, const uint32_t *order, cmalloc_pool *pool,
                         cmalloc_arena *arena)
{
    size_t n = opt.count, size = opt.size;
    uint64_t kept = 0, folded = 0;
    uint64_t start = bench_now_ns();
    switch (opt.kind) {
    case KIND_MALLOC:
        for (size_t i = 0; i < n; i++)
            kept += keep(objects[i] = malloc(size), i);
        for (size_t i = 0; i < n; i++) {
            void *p = objects[nth(order, i)];
            folded += fold(p);
            free(p);
        }
        break;
    case KIND_POOL:
        for (size_t i = 0; i < n; i++)
            kept += keep(objects[i] = api.pool_alloc(pool), i);
        for (size_t i = 0; i < n; i++) {
            void *p = objects[nth(order, i)];
            folded += fold(p);
            api.pool_free(pool, p);
        }
        break;
    case KIND_ARENA:
        for (size_t i = 0; i < n; i++)
            kept += keep(objects[i] = api.arena_alloc(arena, size, 16), i);
        for (size_t i = 0; i < n; i++)
            folded += fold(objects[nth(order, i)]);
        api.arena_reset(arena);
        break;
    }
    uint64_t took = bench_now_ns() - start;
    sink += folded;
    /* untouched: the pointers folded at free are those kept at allocation; touched: every
     * object still holds its index */
    if (opt.touch ? folded != (uint64_t)n * (n - 1) / 2 : folded != kept) {
        fprintf(stderr, "pool_bench: objects were lost or overwritten\n");
        exit(1);
    }
    return took;
}

static int compare_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void usage(void)
{
    fprintf(
        stderr,
        "usage: pool_bench [--alloc malloc|pool|arena] [--count N] [--size BYTES (8..)]\n"
        "                  [--free-order fifo|lifo|random] [--rounds R] [--seed S] [--touch]\n");
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
        lookup_api();
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
    if (opt.kind == KIND_POOL && (pool = api.pool_create(opt.size, opt.count, POOL_GROW)) == NULL) {
        perror("pool_bench: cmalloc_pool_create");
        return 2;
    }
    if (opt.kind == KIND_ARENA &&
        (arena = api.arena_create(opt.count * ((opt.size + 15) & ~(size_t)15))) == NULL) {
        perror("pool_bench: cmalloc_arena_create");
        return 2;
    }
    uint64_t *times = bench_map((size_t)opt.rounds * sizeof *times);
    for (int r = 0; r < opt.rounds; r++)
        times[r] = round_ns(objects, opt.order == ORDER_FIFO ? NULL : order, pool, arena);
    if (pool)
        api.pool_destroy(pool);
    if (arena)
        api.arena_destroy(arena);
    qsort(times, (size_t)opt.rounds, sizeof *times, compare_u64);
    double median = (double)times[opt.rounds / 2];
    printf("pool_bench: %s, %zu objects of %zu bytes, free order %s, %d rounds%s\n",
           kinds[opt.kind], opt.count, opt.size, orders[opt.order], opt.rounds,
           opt.touch ? ", objects touched" : "");
    printf("  ns/object  min %.2f  median %.2f  max %.2f\n", (double)times[0] / (double)opt.count,
           median / (double)opt.count, (double)times[opt.rounds - 1] / (double)opt.count);
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
