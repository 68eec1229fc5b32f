/* latency.c - the cheap clock and the latency histogram's slow parts.
 *
 * The replay loop reads the clock once per message (the end of one message is the start of
 * the next) and records the difference with ob_histogram_record (book.h): an index computed
 * from the leading bit, one increment, one compare. Ticks become nanoseconds only when the
 * summary is printed. On x86-64 a tick is one TSC cycle, calibrated here once against
 * CLOCK_MONOTONIC; elsewhere a tick is a nanosecond of CLOCK_MONOTONIC.
 */
#include "book.h"

#include <time.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

static uint64_t monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t ob_clock_ticks(void)
{
#if defined(__x86_64__)
    return __rdtsc();
#else
    return monotonic_ns();
#endif
}

double ob_clock_ns_per_tick(void)
{
#if defined(__x86_64__)
    static double ns_per_tick; /* set once, from the main thread before any worker starts */
    if (ns_per_tick == 0) {
        uint64_t n0 = monotonic_ns(), t0 = __rdtsc(), n1;
        do
            n1 = monotonic_ns();
        while (n1 - n0 < 20000000u);
        uint64_t t1 = __rdtsc();
        ns_per_tick = (double)(n1 - n0) / (double)(t1 - t0);
    }
    return ns_per_tick;
#else
    return 1.0;
#endif
}

void ob_histogram_merge(ob_histogram *into, const ob_histogram *from)
{
    for (unsigned i = 0; i < OB_HISTOGRAM_BUCKETS; i++)
        into->counts[i] += from->counts[i];
    if (from->max > into->max)
        into->max = from->max;
}

/* The smallest value of bucket i and the bucket's width. */
static void bucket_range(unsigned i, uint64_t *low, uint64_t *width)
{
    if (i < 64) {
        *low = i;
        *width = 1;
        return;
    }
    unsigned shift = i / 32u - 1u; /* e - 5 */
    *low = (uint64_t)(i % 32u + 32u) << shift;
    *width = UINT64_C(1) << shift;
}

uint64_t ob_histogram_quantile(const ob_histogram *h, double q)
{
    uint64_t total = 0;
    for (unsigned i = 0; i < OB_HISTOGRAM_BUCKETS; i++)
        total += h->counts[i];
    if (total == 0)
        return 0;
    uint64_t rank = (uint64_t)(q * (double)total + 0.999999); /* ceil, at least 1 */
    if (rank < 1)
        rank = 1;
    if (rank > total)
        rank = total;
    uint64_t seen = 0;
    for (unsigned i = 0; i < OB_HISTOGRAM_BUCKETS; i++) {
        seen += h->counts[i];
        if (seen >= rank) {
            uint64_t low, width;
            bucket_range(i, &low, &width);
            uint64_t mid = low + width / 2;
            return mid > h->max ? h->max : mid;
        }
    }
    return h->max;
}
