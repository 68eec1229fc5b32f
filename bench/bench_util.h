/* bench_util.h - shared pieces of the benchmark programs (header-only, static inline).
 *
 * What lives here and why:
 *   - a cycle counter (rdtsc fenced on x86-64, clock_gettime elsewhere) and its calibration to ns;
 *   - a latency histogram, log-linear (32 sub-buckets per power of two, so each bucket is within
 *     about 3% of its value) plus an exact maximum, in cycles; merging and percentiles;
 *   - a small xorshift random generator and the size distributions (fixed, mixed, powerlaw);
 *   - peak RSS from getrusage, option parsing helpers, and the RESULT line every program prints;
 *   - pinning a thread to one CPU (--pin: threads that hand memory over on cores of their own);
 *   - for the newer programs (xmalloc, mstress, larson): the options they all take, the
 *     warm-up/measure/stop timeline and the counters that follow it, sampled malloc and free,
 *     slots of checked live blocks, the report, and lanes (a relay of short-lived threads, each
 *     starting the next and handing it the lane's blocks), so each program holds only its own
 *     workload.
 *
 * Rule: none of the measurement state is allocated with malloc. Histograms, rings and size tables
 * come from mmap (bench_map), so the allocator under test only ever sees the workload's own calls,
 * and the numbers of different allocators are measured with identical overhead.
 *
 * Output contract (parsed by scripts/bench-matrix.sh): after the human-readable lines each program
 * prints exactly one line
 *   RESULT workload=<name> threads=<n> params=<text> ops_per_sec=<x> wall_s=<x> p50_ns=<x>
 *          p99_ns=<x> p999_ns=<x> max_ns=<x> peak_rss_kib=<n>
 * with keys always in this order; a figure that does not apply is written as an empty value.
 */
#ifndef BENCH_UTIL_H
#define BENCH_UTIL_H

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif
/* -DBENCH_HAVE_TSC=0 times with clock_gettime instead: for valgrind, which lacks rdtscp. */
#ifndef BENCH_HAVE_TSC
#if defined(__x86_64__) || defined(__i386__)
#define BENCH_HAVE_TSC 1
#else
#define BENCH_HAVE_TSC 0
#endif
#endif

#define BENCH_CACHELINE 64

/* A spin-wait's hint to the core (a pause where the architecture has one): apart from the
 * timing stamps, so a build without them (valgrind's) spins as the others do. */
static inline void bench_spin_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
}

/* ---- clocks ---------------------------------------------------------------------------------- */

static inline uint64_t bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Start and stop stamps around one timed call. The fences keep the call from moving across the
 * stamps; the measured overhead of an empty pair is subtracted from every sample (see
 * bench_tsc_overhead), so a sample is the call's own cost. */
static inline uint64_t bench_tsc_start(void)
{
#if BENCH_HAVE_TSC
    _mm_lfence();
    uint64_t t = __rdtsc();
    _mm_lfence();
    return t;
#else
    return bench_now_ns();
#endif
}

static inline uint64_t bench_tsc_stop(void)
{
#if BENCH_HAVE_TSC
    unsigned aux;
    uint64_t t = __rdtscp(&aux);
    _mm_lfence();
    return t;
#else
    return bench_now_ns();
#endif
}

/* How often the programs that time single calls time one by default (--sample-rate): one call
 * in 1,024. The fences around a timed call drain the core, which costs some allocators' loops
 * more than others' (why is open: docs/PERFORMANCE.md, "What a sample costs"): at one call in
 * 64 the samples took 23-31% of the 64-byte malloc/free loop's throughput (snmalloc 186.1M ->
 * 142.6M ops/s, mimalloc v3 161.8M -> 118.5M, cmalloc 175.8M -> 121.3M), at one in 1,024 2-5%
 * (178.0M, 158.5M, 167.9M; best of 4 alternating runs pinned to one vCPU, `LD_PRELOAD=<lib>
 * taskset -c 0 build/bench/alloc_bench --mode=immediate --size-dist=fixed --size 64 --seconds
 * 0.3 --sample-rate R`). A run of the matrix's 0.8 s still times tens of thousands of calls. */
#define BENCH_SAMPLE_RATE 1024

/* The smallest cost of an empty start/stop pair, in cycles: what a sample pays for being timed. */
static inline uint64_t bench_tsc_overhead(void)
{
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < 20000; i++) {
        uint64_t a = bench_tsc_start();
        uint64_t b = bench_tsc_stop();
        if (b - a < best)
            best = b - a;
    }
    return best;
}

/* Cycles per ns, from two (ns, cycles) stamps taken at least ~100 ms apart. */
typedef struct {
    uint64_t ns;
    uint64_t cycles;
} bench_stamp;

static inline bench_stamp bench_stamp_now(void)
{
    bench_stamp s;
    s.ns = bench_now_ns();
    s.cycles = bench_tsc_start();
    return s;
}

static inline double bench_cycles_per_ns(bench_stamp a, bench_stamp b)
{
    if (!BENCH_HAVE_TSC || b.ns <= a.ns)
        return 1.0;
    return (double)(b.cycles - a.cycles) / (double)(b.ns - a.ns);
}

/* ---- memory that is not the allocator's --------------------------------------------------------
 */

static inline void *bench_map(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("bench: mmap");
        exit(2);
    }
    return p;
}

static inline void bench_unmap(void *p, size_t bytes)
{
    munmap(p, bytes);
}

/* ---- latency histogram ------------------------------------------------------------------------
 * Values in cycles. Bucket index: values below 32 get a bucket each; above, the power of two
 * (exponent e >= 5) and the next 5 bits below the leading one pick one of 32 sub-buckets.
 *   index = (e - 4) * 32 + sub          covering [2^e + sub*2^(e-5), 2^e + (sub+1)*2^(e-5))
 * 64-bit values need (63 - 4) * 32 + 32 = 1920 buckets. */
#define BENCH_HIST_SUB_BITS 5
#define BENCH_HIST_SUB      (1u << BENCH_HIST_SUB_BITS)
#define BENCH_HIST_BUCKETS  ((64 - BENCH_HIST_SUB_BITS + 1) * BENCH_HIST_SUB)

typedef struct {
    uint64_t count[BENCH_HIST_BUCKETS]; /* samples per bucket */
    uint64_t total;                     /* sum of count[] */
    uint64_t max;                       /* largest sample, exact */
} bench_hist;

static inline unsigned bench_hist_index(uint64_t v)
{
    if (v < BENCH_HIST_SUB)
        return (unsigned)v;
    unsigned e = 63u - (unsigned)__builtin_clzll(v);
    unsigned sub = (unsigned)(v >> (e - BENCH_HIST_SUB_BITS)) & (BENCH_HIST_SUB - 1);
    return (e - BENCH_HIST_SUB_BITS + 1) * BENCH_HIST_SUB + sub;
}

/* The middle of a bucket's range, in cycles. */
static inline double bench_hist_value(unsigned idx)
{
    if (idx < BENCH_HIST_SUB)
        return (double)idx;
    unsigned e = idx / BENCH_HIST_SUB + BENCH_HIST_SUB_BITS - 1;
    unsigned sub = idx % BENCH_HIST_SUB;
    double width = ldexp(1.0, (int)e - BENCH_HIST_SUB_BITS);
    return ldexp(1.0, (int)e) + (sub + 0.5) * width;
}

static inline void bench_hist_add(bench_hist *h, uint64_t v)
{
    h->count[bench_hist_index(v)]++;
    h->total++;
    if (v > h->max)
        h->max = v;
}

static inline void bench_hist_merge(bench_hist *into, const bench_hist *from)
{
    for (unsigned i = 0; i < BENCH_HIST_BUCKETS; i++)
        into->count[i] += from->count[i];
    into->total += from->total;
    if (from->max > into->max)
        into->max = from->max;
}

/* The q-quantile (0 < q < 1) in cycles; 0 when empty. */
static inline double bench_hist_quantile(const bench_hist *h, double q)
{
    if (h->total == 0)
        return 0;
    uint64_t rank = (uint64_t)ceil(q * (double)h->total);
    if (rank < 1)
        rank = 1;
    uint64_t seen = 0;
    for (unsigned i = 0; i < BENCH_HIST_BUCKETS; i++) {
        seen += h->count[i];
        if (seen >= rank) {
            double v = bench_hist_value(i);
            return v > (double)h->max ? (double)h->max : v;
        }
    }
    return (double)h->max;
}

/* Percentiles of a histogram, in ns. */
typedef struct {
    double p50, p99, p999, max;
    uint64_t samples;
} bench_lat;

static inline bench_lat bench_hist_summary(const bench_hist *h, double cycles_per_ns)
{
    bench_lat l;
    l.p50 = bench_hist_quantile(h, 0.50) / cycles_per_ns;
    l.p99 = bench_hist_quantile(h, 0.99) / cycles_per_ns;
    l.p999 = bench_hist_quantile(h, 0.999) / cycles_per_ns;
    l.max = (double)h->max / cycles_per_ns;
    l.samples = h->total;
    return l;
}

/* ---- random numbers and sizes -----------------------------------------------------------------
 */

static inline uint64_t bench_rand(uint64_t *state)
{
    /* xorshift64*: fast, good enough for picking sizes and slots */
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static inline uint64_t bench_seed(uint64_t n)
{
    uint64_t s = (n + 1) * 0x9E3779B97F4A7C15ull;
    return s ? s : 1;
}

/* A uniform double in [0, 1). */
static inline double bench_rand_unit(uint64_t *state)
{
    return (double)(bench_rand(state) >> 11) * (1.0 / 9007199254740992.0);
}

enum bench_dist { DIST_FIXED, DIST_MIXED, DIST_POWERLAW };

static inline int bench_parse_dist(const char *s, enum bench_dist *out)
{
    if (!strcmp(s, "fixed"))
        *out = DIST_FIXED;
    else if (!strcmp(s, "mixed"))
        *out = DIST_MIXED;
    else if (!strcmp(s, "powerlaw"))
        *out = DIST_POWERLAW;
    else
        return -1;
    return 0;
}

static inline const char *bench_dist_name(enum bench_dist d)
{
    return d == DIST_FIXED ? "fixed" : d == DIST_MIXED ? "mixed" : "powerlaw";
}

/* One request size, max_size the upper bound:
 *   fixed     always max_size;
 *   mixed     log-uniform over [16, max_size]: every power of two equally likely, so small,
 *             medium and large classes all get traffic;
 *   powerlaw  Pareto with alpha 1.2 from 16 up, cut at max_size: mostly small objects with a
 *             heavy tail of big ones, as real programs have. */
static inline size_t bench_pick_size(uint64_t *state, enum bench_dist d, size_t max_size)
{
    const double lo = 16;
    if (d == DIST_FIXED || max_size <= 16)
        return max_size;
    double u = bench_rand_unit(state);
    double s;
    if (d == DIST_MIXED)
        s = lo * pow((double)max_size / lo, u);
    else
        s = lo * pow(1.0 - u, -1.0 / 1.2);
    if (s > (double)max_size)
        s = (double)max_size;
    if (s < 1)
        s = 1;
    return (size_t)s;
}

/* A table of sizes drawn once before timing, so the timed loop pays one load per size. */
#define BENCH_SIZE_TABLE 4096
static inline uint32_t *bench_size_table(uint64_t seed, enum bench_dist d, size_t max_size)
{
    uint32_t *t = bench_map(BENCH_SIZE_TABLE * sizeof(uint32_t));
    uint64_t st = bench_seed(seed);
    for (unsigned i = 0; i < BENCH_SIZE_TABLE; i++)
        t[i] = (uint32_t)bench_pick_size(&st, d, max_size);
    return t;
}

/* Write to the object the way a program would start using it: the first and last byte and one
 * byte per 4 KiB page in between, so fresh pages are faulted in (and charged to whoever hands them
 * out) without turning the benchmark into a memset benchmark. */
static inline void bench_touch(void *p, size_t n)
{
    volatile unsigned char *c = p;
    if (n == 0)
        return;
    c[0] = (unsigned char)n;
    for (size_t off = 4096; off < n; off += 4096)
        c[off] = 1;
    c[n - 1] = 2;
}

/* ---- pinning --------------------------------------------------------------------------------
 * --pin: the calling thread onto the nth CPU the process may use (modulo their number). Left to
 * the scheduler, a producer and its consumer share a core in some runs and not in others, and
 * on a 2-core machine the rate moves 2-3x with it for every allocator; pinned apart, every
 * object crosses cores in every run, as on a machine with a core for each. */
static inline void bench_pin_thread(int nth)
{
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) {
        perror("sched_getaffinity");
        exit(1);
    }
    nth %= CPU_COUNT(&allowed);
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (CPU_ISSET(cpu, &allowed) && nth-- == 0) {
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(cpu, &one);
            int rc = pthread_setaffinity_np(pthread_self(), sizeof one, &one);
            if (rc != 0) {
                fprintf(stderr, "pthread_setaffinity_np: %s\n", strerror(rc));
                exit(1);
            }
            return;
        }
    }
}

/* ---- process figures ------------------------------------------------------------------------ */

static inline long bench_peak_rss_kib(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return -1;
    return ru.ru_maxrss; /* Linux reports KiB */
}

/* ---- options ----------------------------------------------------------------------------------
 */

/* Matches "--name=value" or "--name value"; advances *i past a separate value. */
static inline const char *bench_opt(int argc, char **argv, int *i, const char *name)
{
    size_t n = strlen(name);
    const char *a = argv[*i];
    if (strncmp(a, name, n) != 0)
        return NULL;
    if (a[n] == '=')
        return a + n + 1;
    if (a[n] == '\0') {
        if (*i + 1 >= argc) {
            fprintf(stderr, "option %s needs a value\n", name);
            exit(2);
        }
        return argv[++*i];
    }
    return NULL;
}

/* A non-negative number with an optional K/M/G suffix (powers of 1024). */
static inline double bench_parse_num(const char *name, const char *s)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno)
        goto bad;
    if (*end == 'k' || *end == 'K')
        v *= 1024, end++;
    else if (*end == 'm' || *end == 'M')
        v *= 1024 * 1024, end++;
    else if (*end == 'g' || *end == 'G')
        v *= 1024.0 * 1024 * 1024, end++;
    if (*end != '\0' || v < 0)
        goto bad;
    return v;
bad:
    fprintf(stderr, "bad value for %s: '%s'\n", name, s);
    exit(2);
}

/* ---- the RESULT line ----------------------------------------------------------------------------
 */

typedef struct {
    const char *workload;
    int threads;
    const char *params;
    double ops_per_sec;
    double wall_s;
    int have_latency;
    bench_lat lat;
} bench_result;

static inline void bench_print_result(const bench_result *r)
{
    printf("RESULT workload=%s threads=%d params=%s ops_per_sec=%.0f wall_s=%.4f", r->workload,
           r->threads, r->params, r->ops_per_sec, r->wall_s);
    if (r->have_latency)
        printf(" p50_ns=%.1f p99_ns=%.1f p999_ns=%.1f max_ns=%.0f", r->lat.p50, r->lat.p99,
               r->lat.p999, r->lat.max);
    else
        printf(" p50_ns= p99_ns= p999_ns= max_ns=");
    printf(" peak_rss_kib=%ld\n", bench_peak_rss_kib());
    fflush(stdout);
}

static inline void bench_print_lat(const char *what, bench_lat l)
{
    printf("  %-14s p50 %8.1f ns  p99 %8.1f ns  p99.9 %9.1f ns  max %10.0f ns  (%llu samples)\n",
           what, l.p50, l.p99, l.p999, l.max, (unsigned long long)l.samples);
}

/* ---- the timeline: warm-up, measure, stop ------------------------------------------------------
 * The main thread sleeps through --warmup, stamps, switches the phase to BENCH_MEASURE, sleeps
 * --seconds, switches to BENCH_STOP and stamps again; workers read the phase between chunks of
 * work. Named apart from the older programs' own PHASE_* enums, which this header must not clash
 * with. */
enum { BENCH_WARMUP, BENCH_MEASURE, BENCH_STOP };

static inline void bench_sleep_s(double s)
{
    struct timespec ts;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

typedef struct {
    bench_stamp begin; /* when the measured period started */
    bench_stamp end;   /* when it ended */
} bench_period;

static inline bench_period bench_timeline(_Atomic int *phase, double warmup_s, double seconds)
{
    bench_period p;
    bench_sleep_s(warmup_s);
    p.begin = bench_stamp_now();
    atomic_store(phase, BENCH_MEASURE);
    bench_sleep_s(seconds);
    atomic_store(phase, BENCH_STOP);
    p.end = bench_stamp_now();
    return p;
}

static inline double bench_period_s(bench_period p)
{
    return (double)(p.end.ns - p.begin.ns) / 1e9;
}

/* One thread's (or one lane's) figures. ops and hist are zeroed when the phase turns to
 * BENCH_MEASURE, so only the measured period counts; work is counted when it completes, so a chunk
 * that straddles the start is counted whole and one that straddles the stop not at all, and the
 * two errors cancel on average. */
typedef struct {
    uint64_t ops;           /* completed operations in the measured period */
    int seen;               /* the phase as this counter last saw it */
    bench_hist malloc_hist; /* sampled malloc latencies, cycles */
    bench_hist free_hist;   /* sampled free latencies, cycles */
} bench_counter;

/* Between chunks: follows the phase; returns 0 once it is BENCH_STOP. */
static inline int bench_counter_check(bench_counter *c, _Atomic int *phase)
{
    int p = atomic_load_explicit(phase, memory_order_relaxed);
    if (p != c->seen) {
        if (p == BENCH_MEASURE) {
            c->ops = 0;
            memset(&c->malloc_hist, 0, sizeof c->malloc_hist);
            memset(&c->free_hist, 0, sizeof c->free_hist);
        }
        c->seen = p;
    }
    return p != BENCH_STOP;
}

/* A uniform integer in [0, n), n < 2^32, by multiply and shift (no division in the timed loop). */
static inline uint32_t bench_rand_below(uint64_t *state, uint32_t n)
{
    return (uint32_t)(((bench_rand(state) >> 32) * n) >> 32);
}

/* ---- sampled calls ------------------------------------------------------------------------------
 * One thread's latency sampling: about one call in rate is timed (jittered, so the sampling cannot
 * beat with a ring, a queue or a batch) and recorded less the timing's own cost. */
typedef struct {
    uint64_t rs;        /* random state for the jitter */
    unsigned countdown; /* calls until the next timed one */
    unsigned rate;      /* one call in this many is timed */
    uint64_t overhead;  /* cycles of an empty timing pair (bench_tsc_overhead) */
    bench_counter *to;  /* where the samples go */
} bench_sampler;

static inline void bench_sampler_rearm(bench_sampler *s)
{
    s->countdown = s->rate <= 1 ? 1 : s->rate / 2 + 1 + (unsigned)(bench_rand(&s->rs) % s->rate);
}

static inline bench_sampler bench_sampler_make(uint64_t seed, unsigned rate, uint64_t overhead,
                                               bench_counter *to)
{
    bench_sampler s = {bench_seed(seed), 0, rate, overhead, to};
    bench_sampler_rearm(&s);
    return s;
}

/* No more samples: for calls after the measured period, which must not reach the histogram. */
static inline void bench_sampler_silence(bench_sampler *s)
{
    s->countdown = UINT32_MAX;
}

static inline void *bench_sampled_malloc(size_t size, bench_sampler *s)
{
    void *p;
    if (__builtin_expect(--s->countdown == 0, 0)) {
        bench_sampler_rearm(s);
        uint64_t t0 = bench_tsc_start();
        p = malloc(size);
        uint64_t t1 = bench_tsc_stop();
        bench_hist_add(&s->to->malloc_hist, t1 - t0 > s->overhead ? t1 - t0 - s->overhead : 0);
    } else {
        p = malloc(size);
    }
    if (!p) {
        fprintf(stderr, "bench: malloc(%zu) returned NULL\n", size);
        exit(3);
    }
    return p;
}

static inline void bench_sampled_free(void *p, bench_sampler *s)
{
    if (__builtin_expect(--s->countdown == 0, 0)) {
        bench_sampler_rearm(s);
        uint64_t t0 = bench_tsc_start();
        free(p);
        uint64_t t1 = bench_tsc_stop();
        bench_hist_add(&s->to->free_hist, t1 - t0 > s->overhead ? t1 - t0 - s->overhead : 0);
    } else {
        free(p);
    }
}

/* ---- slots: live blocks a workload replaces at random
 * -------------------------------------------- Each slot holds a block (or NULL) and the size it
 * was asked for; blocks are written with bench_touch when allocated and checked when freed, so a
 * block handed out twice or written after its free stops the program (exit 3) instead of skewing a
 * figure. The arrays come from mmap and belong to no thread: they can be handed from thread to
 * thread. */
typedef struct {
    void **block;   /* the live block, or NULL */
    uint32_t *size; /* the size block[j] was allocated with */
    uint32_t n;     /* number of slots */
} bench_slots;

static inline bench_slots bench_slots_map(uint32_t n)
{
    bench_slots s = {bench_map(n * sizeof(void *)), bench_map(n * sizeof(uint32_t)), n};
    return s;
}

/* Allocates size bytes into the empty slot j and writes them. */
static inline void bench_slot_alloc(bench_slots *s, uint32_t j, uint32_t size, bench_sampler *smp)
{
    s->block[j] = bench_sampled_malloc(size, smp);
    s->size[j] = size;
    bench_touch(s->block[j], size);
}

/* Checks what bench_touch wrote into slot j's block (first byte the size's low byte, last byte 2),
 * frees it and empties the slot. */
static inline void bench_slot_free(bench_slots *s, uint32_t j, bench_sampler *smp)
{
    const volatile unsigned char *c = s->block[j];
    uint32_t n = s->size[j];
    if (c[n - 1] != 2 || (n > 1 && c[0] != (unsigned char)n)) {
        fprintf(stderr, "bench: block %p of %u bytes was overwritten while live\n", (void *)c, n);
        exit(3);
    }
    bench_sampled_free(s->block[j], smp);
    s->block[j] = NULL;
}

/* ---- the options every newer program takes -----------------------------------------------------
 */

typedef struct {
    int threads;          /* --threads: worker threads (or lanes, or producer/consumer pairs) */
    double warmup_s;      /* --warmup: seconds run before measuring */
    double seconds;       /* --seconds: seconds measured */
    unsigned sample_rate; /* --sample-rate: one call in this many is timed */
    uint64_t seed;        /* --seed: every random stream derives from it */
    const char *label;    /* --label: the workload name in the RESULT line */
} bench_common;

/* A program's own options: whole numbers (K/M/G suffixes allowed) with their accepted range. */
typedef struct {
    const char *name;         /* "--window" */
    uint64_t *value;          /* where it goes (holds the default) */
    uint64_t min, max;        /* accepted range, inclusive */
    const uint64_t *at_least; /* another option's value this one must not be below, or NULL */
} bench_option;

/* Takes argv[*i] as one of the program's own options if it names one (advancing *i past its
 * value): 1 when taken, 0 when it names none, -1 when its value is out of range (said). */
static inline int bench_take_own(int argc, char **argv, int *i, const bench_option *opts,
                                 int nopts)
{
    const char *v = NULL;
    int k = 0;
    while (k < nopts && !(v = bench_opt(argc, argv, i, opts[k].name)))
        k++;
    if (k == nopts)
        return 0;
    double x = bench_parse_num(opts[k].name, v);
    if (x < (double)opts[k].min || x > (double)opts[k].max) {
        fprintf(stderr, "%s wants a number from %llu to %llu\n", opts[k].name,
                (unsigned long long)opts[k].min, (unsigned long long)opts[k].max);
        return -1;
    }
    *opts[k].value = (uint64_t)x;
    return 1;
}

/* Whether every own option is at least the one it names in at_least (else said). */
static inline bool bench_own_ordered(const bench_option *opts, int nopts)
{
    for (int k = 0; k < nopts; k++) {
        if (opts[k].at_least && *opts[k].value < *opts[k].at_least) {
            fprintf(stderr, "%s must not be below %llu\n", opts[k].name,
                    (unsigned long long)*opts[k].at_least);
            return false;
        }
    }
    return true;
}

/* Parses the program's own options only (a program that times no calls); prints usage and
 * exits 2 on anything else or out of range. */
static inline void bench_parse_own_args(int argc, char **argv, const bench_option *opts,
                                        int nopts, const char *usage)
{
    int i = 1;
    while (i < argc && bench_take_own(argc, argv, &i, opts, nopts) == 1)
        i++;
    if (i == argc && bench_own_ordered(opts, nopts))
        return;
    fputs(usage, stderr);
    exit(2);
}

/* Parses the common options and the program's own; prints usage (the program's line, then the
 * common options) and exits 2 on anything else or out of range. */
static inline void bench_parse_args(int argc, char **argv, bench_common *c,
                                    const bench_option *opts, int nopts, const char *usage)
{
    for (int i = 1; i < argc; i++) {
        const char *v;
        if ((v = bench_opt(argc, argv, &i, "--threads")))
            c->threads = (int)bench_parse_num("--threads", v);
        else if ((v = bench_opt(argc, argv, &i, "--warmup")))
            c->warmup_s = bench_parse_num("--warmup", v);
        else if ((v = bench_opt(argc, argv, &i, "--seconds")))
            c->seconds = bench_parse_num("--seconds", v);
        else if ((v = bench_opt(argc, argv, &i, "--sample-rate")))
            c->sample_rate = (unsigned)bench_parse_num("--sample-rate", v);
        else if ((v = bench_opt(argc, argv, &i, "--seed")))
            c->seed = (uint64_t)bench_parse_num("--seed", v);
        else if ((v = bench_opt(argc, argv, &i, "--label")))
            c->label = v;
        else if (bench_take_own(argc, argv, &i, opts, nopts) != 1)
            goto bad;
    }
    if (bench_own_ordered(opts, nopts) && c->threads >= 1 && c->threads <= 1024 &&
        c->seconds > 0 && c->sample_rate >= 1)
        return;
bad:
    fprintf(stderr,
            "%s  [--threads N] [--warmup S] [--seconds S] [--sample-rate N] [--seed N]"
            " [--label NAME]\n",
            usage);
    exit(2);
}

/* ---- reports --------------------------------------------------------------------------------- */

/* The human lines for per-call latencies (the merged samples of every counter of n), peak RSS,
 * then the RESULT line, whose latencies are those of either call. */
static inline void bench_report(bench_result *r, const bench_counter *const *counters, int n,
                                double cycles_per_ns)
{
    static bench_hist hm, hf, all;
    for (int i = 0; i < n; i++) {
        bench_hist_merge(&hm, &counters[i]->malloc_hist);
        bench_hist_merge(&hf, &counters[i]->free_hist);
    }
    bench_hist_merge(&all, &hm);
    bench_hist_merge(&all, &hf);
    r->have_latency = 1;
    r->lat = bench_hist_summary(&all, cycles_per_ns);
    bench_print_lat("malloc", bench_hist_summary(&hm, cycles_per_ns));
    bench_print_lat("free", bench_hist_summary(&hf, cycles_per_ns));
    bench_print_lat("either call", r->lat);
    printf("  peak RSS       %ld KiB\n", bench_peak_rss_kib());
    bench_print_result(r);
}

/* ---- lanes: relays of short-lived threads -------------------------------------------------------
 * A lane works on one thread at a time. Each thread runs the workload's leg on the lane's slots,
 * joins its predecessor (long gone by then), and, unless the phase is BENCH_STOP, starts its
 * successor and exits. The successor starts at once, while the predecessor's exit (and the
 * allocator's teardown of its per-thread state) runs beside it, as in servers that replace their
 * threads, and frees memory of a thread that is exiting or gone. Joining at the start instead
 * made every hand-off wait for the predecessor's exit, and on the loaded 2-core machine whole runs
 * then went at one thread per 3.7 ms (a scheduler tick?) instead of one per 0.3 ms, under every
 * allocator alike, which swamped what the allocator does.
 * Thread creation and exit are part of what is measured; they cost the same under every
 * allocator apart from the allocator's own per-thread setup and teardown.
 * The main thread makes them with bench_lanes_map and runs them with bench_lanes_run. */
typedef struct bench_lane bench_lane;
struct bench_lane {
    /* one thread's share of the work, on the lane's slots, with this thread's random state and
     * latency sampler (by value: the leg's own locals, kept in registers in its loop) */
    void (*leg)(bench_lane *lane, bench_slots *s, uint64_t rs, bench_sampler smp);
    bench_slots slots;             /* the live blocks, handed from thread to thread */
    int id;                        /* which lane, from 0 */
    uint64_t generation;           /* threads this lane has run to completion */
    uint64_t generations_measured; /* of those, finished in the measured period */
    _Atomic int *phase;            /* the timeline */
    sem_t *finished;               /* posted once by the lane's last thread */
    pthread_t prev;                /* the thread that started this one, joined after the leg */
    int have_prev;                 /* 0 for the lane's first thread, started by main */
    pthread_t last;                /* the lane's last thread, joined by bench_lanes_run */
    bench_counter count;           /* the lane's operations and sampled latencies */
    const bench_common *common;    /* the program's options */
    uint64_t tsc_overhead;         /* cycles of an empty timing pair */
};

static inline bench_lane *
bench_lanes_map(int n, void (*leg)(bench_lane *, bench_slots *, uint64_t, bench_sampler),
                uint32_t slots)
{
    bench_lane *lanes = bench_map((size_t)n * sizeof(bench_lane));
    for (int i = 0; i < n; i++) {
        lanes[i].leg = leg;
        lanes[i].slots = bench_slots_map(slots);
        lanes[i].id = i;
    }
    return lanes;
}

static inline void bench_lane_spawn(bench_lane *l, void *(*body)(void *))
{
    pthread_t t;
    int rc = pthread_create(&t, NULL, body, l);
    if (rc) {
        fprintf(stderr, "bench: pthread_create: %s\n", strerror(rc));
        exit(1);
    }
}

static inline void *bench_lane_thread(void *arg)
{
    bench_lane *l = arg;
    /* every thread of every lane draws its own stream, the same on every run with this --seed */
    uint64_t seed = (l->common->seed << 40) ^ ((uint64_t)l->id << 28) ^ l->generation;
    l->leg(l, &l->slots, bench_seed(seed),
           bench_sampler_make(seed, l->common->sample_rate, l->tsc_overhead, &l->count));
    l->generation++;
    if (l->have_prev)
        pthread_join(l->prev, NULL);
    if (bench_counter_check(&l->count, l->phase)) {
        if (l->count.seen == BENCH_MEASURE)
            l->generations_measured++;
        l->prev = pthread_self();
        l->have_prev = 1;
        bench_lane_spawn(l, bench_lane_thread);
        return NULL;
    }
    l->last = pthread_self();
    sem_post(l->finished);
    return NULL;
}

/* Runs the lanes through the timeline; returns once every lane's last thread has been joined,
 * the slots then being the main thread's to check and free. */
static inline bench_period bench_lanes_run(bench_lane *lanes, int n, _Atomic int *phase,
                                           const bench_common *c)
{
    static sem_t finished;
    sem_init(&finished, 0, 0);
    uint64_t overhead = bench_tsc_overhead();
    for (int i = 0; i < n; i++) {
        lanes[i].common = c;
        lanes[i].tsc_overhead = overhead;
        lanes[i].phase = phase;
        lanes[i].finished = &finished;
        bench_lane_spawn(&lanes[i], bench_lane_thread);
    }
    bench_period p = bench_timeline(phase, c->warmup_s, c->seconds);
    for (int i = 0; i < n; i++)
        while (sem_wait(&finished) != 0 && errno == EINTR) {
        }
    for (int i = 0; i < n; i++)
        pthread_join(lanes[i].last, NULL);
    sem_destroy(&finished);
    return p;
}

/* The report of a lanes program: its header line, ops/s in unit and threads/s, latencies, peak
 * RSS and the RESULT line; then every lane's remaining blocks are checked and freed (untimed). */
static inline void bench_lanes_report(bench_lane *lanes, const bench_common *c, bench_period t,
                                      const char *program, const char *params, const char *unit)
{
    const bench_counter *counters[1024]; /* c->threads <= 1024 */
    uint64_t ops = 0, generations = 0;
    for (int i = 0; i < c->threads; i++) {
        ops += lanes[i].count.ops;
        generations += lanes[i].generations_measured;
        counters[i] = &lanes[i].count;
    }
    double wall = bench_period_s(t);
    bench_result r = {.workload = c->label,
                      .threads = c->threads,
                      .params = params,
                      .ops_per_sec = (double)ops / wall,
                      .wall_s = wall};
    printf("%s: %s threads=%d (lanes) seconds=%.2f warmup=%.2f sample-rate=1/%u\n", program, params,
           c->threads, c->seconds, c->warmup_s, c->sample_rate);
    printf("  throughput     %.0f %s/s (%.0f threads/s)\n", r.ops_per_sec, unit,
           (double)generations / wall);
    bench_report(&r, counters, c->threads, bench_cycles_per_ns(t.begin, t.end));

    static bench_counter discard;
    bench_sampler none = bench_sampler_make(0, 1, 0, &discard);
    bench_sampler_silence(&none);
    for (int i = 0; i < c->threads; i++)
        for (uint32_t j = 0; j < lanes[i].slots.n; j++)
            if (lanes[i].slots.block[j])
                bench_slot_free(&lanes[i].slots, j, &none);
}

#endif /* BENCH_UTIL_H */
