/* bench_util.h - shared pieces of the benchmark programs (header-only, static inline).
 *
 * What lives here and why:
 *   - a cycle counter (rdtsc fenced on x86-64, clock_gettime elsewhere) and its calibration to ns;
 *   - a latency histogram, log-linear (32 sub-buckets per power of two, so each bucket is within
 *     about 3% of its value) plus an exact maximum, in cycles; merging and percentiles;
 *   - a small xorshift random generator and the size distributions (fixed, mixed, powerlaw);
 *   - peak RSS from getrusage, option parsing helpers, and the RESULT line every program prints.
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
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#define BENCH_HAVE_TSC 1
#else
#define BENCH_HAVE_TSC 0
#endif

#define BENCH_CACHELINE 64

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

/* ---- memory that is not the allocator's -------------------------------------------------------- */

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
#define BENCH_HIST_SUB (1u << BENCH_HIST_SUB_BITS)
#define BENCH_HIST_BUCKETS ((64 - BENCH_HIST_SUB_BITS + 1) * BENCH_HIST_SUB)

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

/* ---- random numbers and sizes ----------------------------------------------------------------- */

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

/* ---- process figures ------------------------------------------------------------------------ */

static inline long bench_peak_rss_kib(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return -1;
    return ru.ru_maxrss; /* Linux reports KiB */
}

/* ---- options ---------------------------------------------------------------------------------- */

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

/* ---- the RESULT line ---------------------------------------------------------------------------- */

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

#endif /* BENCH_UTIL_H */
