/* cmalloc.h - the public API of cmalloc, beyond the standard malloc family.
 *
 * Link with -lcmalloc (or preload libcmalloc.so) and every malloc, free, new and delete in the
 * process is served by cmalloc. This header adds what the standard family lacks: statistics,
 * releasing memory to the OS on demand, and object pools.
 */
#ifndef CMALLOC_H
#define CMALLOC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CMALLOC_VERSION "0.1.0"

/* Process-wide counters, read without stopping other threads (so a snapshot, not a fence). */
typedef struct cmalloc_stats {
    size_t bytes_in_use;       /* handed to the program and not yet freed (object-size granularity) */
    size_t bytes_mapped;       /* obtained from the OS and not yet unmapped */
    size_t bytes_released;     /* mapped, but given back with madvise: not resident */
    size_t bytes_page_heap_free; /* in free spans of the page heap, still resident */
    size_t bytes_central_cache; /* in central transfer caches, ready for any thread */
    size_t bytes_thread_caches; /* in per-thread caches */
    size_t bytes_metadata;     /* spans, thread caches and pagemap nodes */
    size_t large_allocations;  /* live allocations served by whole spans or mmap */
    size_t thread_caches;      /* live thread caches */
} cmalloc_stats;

/* Fills *stats. Returns 0. */
int cmalloc_stats_get(cmalloc_stats *stats);

/* Writes a human-readable report (totals and one line per used size class) to file descriptor
 * fd. Never allocates. */
void cmalloc_stats_print(int fd);

/* Writes the same numbers for programs, as one JSON object on one line followed by a newline:
 * version, totals, bytes per layer, large and mapped blocks, one entry per size class in use
 * (objects out, in the central cache, in the calling thread's cache, in use, spans) and the
 * options in force. The fields are described in docs/DESIGN.md ("Statistics"). Never
 * allocates. */
void cmalloc_stats_print_json(int fd);

/* Returns free memory to the OS now: the calling thread's cache, every central cache's spare
 * batches and every idle free span. Returns the number of bytes released. */
size_t cmalloc_release(void);

/* Object pools: fixed-size objects carved from large slabs, freed all at once by
 * cmalloc_pool_destroy. A pool made without CMALLOC_POOL_THREAD_SAFE must be used by one thread
 * at a time; with it, any thread may allocate and free. Objects are 16-byte aligned. */
typedef struct cmalloc_pool cmalloc_pool;
#define CMALLOC_POOL_THREAD_SAFE 1u
cmalloc_pool *cmalloc_pool_create(size_t object_size, unsigned flags); /* NULL + errno on error */
void *cmalloc_pool_alloc(cmalloc_pool *pool);                           /* NULL + ENOMEM when out */
void cmalloc_pool_free(cmalloc_pool *pool, void *object);               /* object from this pool */
void cmalloc_pool_destroy(cmalloc_pool *pool);                          /* frees every object */

#ifdef __cplusplus
}
#endif
#endif /* CMALLOC_H */
