/* fault_cost - what the kernel charges to bring a fresh page of anonymous memory in: by a
 * write that faults, and by MADV_POPULATE_WRITE (one call for a run of pages) before the write.
 * A measuring tool, not a workload of the matrix: it calls no allocator.
 *
 * What it measures
 *   For each --chunk size (KiB, a multiple of 4; default 4,16,64,256), --rounds times: maps
 *   64 MiB (--mib), writes one byte to each 4 KiB page in address order, and unmaps it; the
 *   pages are brought in either by the writes' faults ("fault") or by one MADV_POPULATE_WRITE
 *   call per chunk before its writes ("populate"). Reported: nanoseconds a page, the median
 *   round, for each. cmalloc's central cache populates the pages a fill carves in a span cut
 *   from pages given back to the OS (central_cache.c); this is the cost that trades.
 *
 * Example: build/bench/fault_cost --chunk 4,64
 */
#define _GNU_SOURCE
#include <errno.h>

#include "bench_util.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

enum { PAGE = 4096, MAX_ROUNDS = 99 };

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* ns a page of one round, or a negative value with a message when the kernel refused. */
static double one_round(size_t bytes, size_t chunk, int populate)
{
    char *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("fault_cost: mmap");
        return -1;
    }
    uint64_t start = bench_now_ns();
    for (size_t at = 0; at < bytes; at += chunk) {
        if (populate && madvise(p + at, chunk, MADV_POPULATE_WRITE) != 0) {
            fprintf(stderr, "fault_cost: MADV_POPULATE_WRITE: %s\n", strerror(errno));
            munmap(p, bytes);
            return -1;
        }
        for (size_t page = at; page < at + chunk; page += PAGE)
            p[page] = 1;
    }
    double ns = (double)(bench_now_ns() - start) / (double)(bytes / PAGE);
    munmap(p, bytes);
    return ns;
}

int main(int argc, char **argv)
{
    const char *chunks = "4,16,64,256";
    size_t mib = 64;
    int rounds = 5;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--chunk") == 0 && i + 1 < argc)
            chunks = argv[++i];
        else if (strcmp(argv[i], "--mib") == 0 && i + 1 < argc)
            mib = strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: fault_cost [--chunk KIB[,KIB...]] [--mib N] [--rounds N]\n");
            return 2;
        }
    }
    if (mib == 0 || rounds < 1 || rounds > MAX_ROUNDS) {
        fprintf(stderr, "fault_cost: --mib must be positive, --rounds 1 to %d\n", MAX_ROUNDS);
        return 2;
    }
    printf("%10s %14s %14s\n", "chunk KiB", "fault ns/page", "populate ns/page");
    for (const char *c = chunks; *c;) {
        char *end;
        size_t kib = strtoul(c, &end, 10);
        if (end == c || kib == 0 || kib % (PAGE / 1024) != 0 || (*end && *end != ',')) {
            fprintf(stderr, "fault_cost: --chunk takes multiples of 4 KiB, comma-separated\n");
            return 2;
        }
        c = *end ? end + 1 : end;
        size_t chunk = kib << 10, bytes = (mib << 20) / chunk * chunk;
        if (bytes == 0) {
            fprintf(stderr, "fault_cost: --chunk %zu KiB is more than --mib %zu MiB\n", kib, mib);
            return 2;
        }
        double ns[2][MAX_ROUNDS];
        for (int r = 0; r < rounds; r++)
            for (int populate = 0; populate < 2; populate++)
                if ((ns[populate][r] = one_round(bytes, chunk, populate)) < 0)
                    return 1;
        for (int populate = 0; populate < 2; populate++)
            qsort(ns[populate], (size_t)rounds, sizeof(double), by_value);
        printf("%10zu %14.0f %14.0f\n", kib, ns[0][rounds / 2], ns[1][rounds / 2]);
    }
    return 0;
}
