/* stress_tsan.c - many threads through cmalloc's internals, for ThreadSanitizer.
 *
 * Built by `make sanitize` against a prefixed copy of cmalloc compiled with -fsanitize=thread
 * (-DCM_PREFIX=cmtsan_, objects in build/tsan/obj): this program calls cmtsan_malloc,
 * cmtsan_free, ... while TSan keeps its own malloc, so TSan sees every access cmalloc makes
 * to its caches, spans, pagemap and counters, and every access the program makes to the blocks
 * cmalloc hands out (a block given to two threads at once shows up as a race on its bytes).
 *
 * Workers (8 by default, replaced by fresh threads every few thousand operations, so thread
 * caches are created, flushed at exit and recycled) allocate random sizes (mostly small, some
 * page-heap blocks, a few above the mmap threshold) with malloc, calloc, realloc,
 * posix_memalign, aligned_alloc and memalign; write a tag at both ends of every block and check
 * it before freeing; and pass about half of their blocks through a shared array of slots
 * (atomic exchange), so most frees are cross-thread. Now and then a worker calls malloc_trim.
 *
 *   stress_tsan [SECONDS]            the allocation paths only (default 3 s)
 *   stress_tsan --stats [SECONDS]    plus a thread reading cmalloc_stats_get in a loop, as a
 *                                    monitoring thread of a real program would
 *   stress_tsan --init-race          the workers are released together before the program has
 *                                    called the allocator: their first calls (thread cache
 *                                    creation, registry, and lazy initialization when no
 *                                    constructor ran it first) race with each other
 *
 * Exits 1 if a block's tag was damaged; TSan makes the exit status 66 when it reported races.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cmalloc.h"
#include "rng.h"

void *cmtsan_malloc(size_t size);
void cmtsan_free(void *p);
void *cmtsan_calloc(size_t count, size_t size);
void *cmtsan_realloc(void *p, size_t size);
int cmtsan_posix_memalign(void **out, size_t alignment, size_t size);
void *cmtsan_aligned_alloc(size_t alignment, size_t size);
void *cmtsan_memalign(size_t alignment, size_t size);
size_t cmtsan_malloc_usable_size(void *p);
int cmtsan_malloc_trim(size_t pad);

#define KiB ((size_t)1024)
#define MiB (KiB * 1024)

enum { WORKERS = 8, SLOTS = 512, OPS_PER_GENERATION = 1500, OWN = 32 };

static _Atomic(uintptr_t) slots[SLOTS];
static atomic_int stop, damaged, start_gate;
static atomic_long operations, generations;
static bool init_race;

/* Every block: its size in the first word, a tag after it and in its last byte. */
typedef struct header {
    size_t size;
    uint64_t tag;
} header;

static uint64_t tag_of(size_t size)
{
    return size * 0x9E3779B97F4A7C15ULL + 0x5bd1e995;
}

static void stamp(void *p, size_t size)
{
    header *h = p;
    h->size = size;
    h->tag = tag_of(size);
    ((unsigned char *)p)[size - 1] = (unsigned char)h->tag;
}

static void check_and_free(void *p)
{
    header *h = p;
    if (h->tag != tag_of(h->size) || ((unsigned char *)p)[h->size - 1] != (unsigned char)h->tag ||
        cmtsan_malloc_usable_size(p) < h->size) {
        atomic_fetch_add(&damaged, 1);
        fprintf(stderr, "stress_tsan: block %p damaged\n", p);
    }
    cmtsan_free(p);
}

static size_t random_size(uint64_t *rng)
{
    uint64_t r = rng_next(rng);
    size_t size;
    switch (r % 128) {
    case 0:
        size = 8 * MiB + (r >> 24) % (2 * MiB); /* its own mmap */
        break;
    case 1:
    case 2:
    case 3:
    case 4:
        size = 256 * KiB + (r >> 24) % (2 * MiB); /* a page-heap span */
        break;
    default: size = 1 + (r >> 24) % ((r >> 8) & 1 ? 2048 : 256); break;
    }
    return size < sizeof(header) + 1 ? sizeof(header) + 1 : size;
}

static void *allocate(uint64_t *rng, size_t size)
{
    uint64_t r = rng_next(rng);
    void *p = NULL;
    switch (r % 8) {
    case 0:
        p = cmtsan_calloc(1, size);
        if (p && ((unsigned char *)p)[size / 2] != 0)
            atomic_fetch_add(&damaged, 1);
        break;
    case 1:
        if (cmtsan_posix_memalign(&p, (size_t)16 << ((r >> 8) % 8), size) != 0)
            p = NULL;
        break;
    case 2: p = cmtsan_aligned_alloc((size_t)32 << ((r >> 8) % 6), size); break;
    case 3: p = cmtsan_memalign(4096, size); break;
    default: p = cmtsan_malloc(size); break;
    }
    if (p)
        stamp(p, size);
    return p;
}

static void *worker(void *arg)
{
    uint64_t rng = (uintptr_t)arg * 0x9E3779B97F4A7C15ULL + 12345;
    if (init_race) /* everyone waits here, then all call the allocator for the first time */
        while (!atomic_load(&start_gate))
            ;
    void *own[OWN] = {0};
    long done = 0;
    for (; done < OPS_PER_GENERATION && !atomic_load_explicit(&stop, memory_order_relaxed);
         done++) {
        uint64_t r = rng_next(&rng);
        unsigned i = (unsigned)(r >> 16) % OWN;
        if (own[i] == NULL) {
            own[i] = allocate(&rng, random_size(&rng));
            continue;
        }
        switch (r % 16) {
        case 0:
        case 1:
        case 2:
        case 3:
        case 4:
        case 5: /* free our own */
            check_and_free(own[i]);
            own[i] = NULL;
            break;
        case 6:
        case 7:
        case 8:
        case 9:
        case 10:
        case 11: { /* hand it over; free what we get */
            uintptr_t got = atomic_exchange(&slots[(r >> 32) % SLOTS], (uintptr_t)own[i]);
            own[i] = NULL;
            if (got)
                check_and_free((void *)got);
            break;
        }
        case 12:
        case 13:
        case 14: { /* realloc to a new size; the header must move along */
            header *h = own[i];
            size_t old_size = h->size, size = random_size(&rng);
            if (h->tag != tag_of(old_size))
                atomic_fetch_add(&damaged, 1);
            void *q = cmtsan_realloc(own[i], size);
            if (q) {
                if (((header *)q)->size != old_size)
                    atomic_fetch_add(&damaged, 1);
                stamp(q, size);
                own[i] = q;
            }
            break;
        }
        default:
            if ((r >> 40) % 64 == 0)
                cmtsan_malloc_trim(0);
            break;
        }
    }
    for (int i = 0; i < OWN; i++)
        if (own[i])
            check_and_free(own[i]);
    atomic_fetch_add(&operations, done);
    return NULL;
}

static void *stats_reader(void *arg)
{
    (void)arg;
    size_t reads = 0;
    while (!atomic_load(&stop)) {
        cmalloc_stats s;
        cmalloc_stats_get(&s);
        reads += s.thread_caches != (size_t)-1;
        usleep(200);
    }
    return (void *)reads;
}

static double now_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    bool with_stats = false;
    double seconds = 3;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--stats") == 0)
            with_stats = true;
        else if (strcmp(argv[i], "--init-race") == 0)
            init_race = true;
        else
            seconds = atof(argv[i]);
    }
    pthread_t threads[WORKERS], reader;
    uint64_t seed = 1;
    if (init_race) {
        for (int i = 0; i < WORKERS; i++)
            pthread_create(&threads[i], NULL, worker, (void *)(uintptr_t)(i + 1));
        usleep(10000);
        atomic_store(&start_gate, 1);
        for (int i = 0; i < WORKERS; i++)
            pthread_join(threads[i], NULL);
        seconds = 0; /* one generation is the point */
    } else           /* the allocator starts here, before any other thread exists */
        cmtsan_free(cmtsan_malloc(1));
    if (with_stats)
        pthread_create(&reader, NULL, stats_reader, NULL);
    double start = now_seconds();
    while (now_seconds() - start < seconds) {
        /* A generation: WORKERS fresh threads; their caches are flushed as they exit. */
        for (int i = 0; i < WORKERS; i++)
            pthread_create(&threads[i], NULL, worker, (void *)(uintptr_t)(seed++));
        for (int i = 0; i < WORKERS; i++)
            pthread_join(threads[i], NULL);
        atomic_fetch_add(&generations, 1);
    }
    atomic_store(&stop, 1);
    if (with_stats)
        pthread_join(reader, NULL);
    for (int i = 0; i < SLOTS; i++) {
        uintptr_t p = atomic_exchange(&slots[i], 0);
        if (p)
            check_and_free((void *)p);
    }
    cmalloc_stats s;
    cmalloc_stats_get(&s);
    printf("stress_tsan%s%s: %ld generations of %d threads, %ld operations, %d damaged blocks; "
           "in use at the end %zu bytes\n",
           with_stats ? " --stats" : "", init_race ? " --init-race" : "", atomic_load(&generations),
           WORKERS, atomic_load(&operations), atomic_load(&damaged), s.bytes_in_use);
    return atomic_load(&damaged) ? 1 : 0;
}
