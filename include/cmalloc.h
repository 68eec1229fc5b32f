/* cmalloc.h - the public API of cmalloc, beyond the standard malloc family.
 *
 * Link with -lcmalloc (or preload libcmalloc.so) and every malloc, free, new and delete in the
 * process is served by cmalloc. This header adds what the standard family lacks: statistics,
 * releasing memory to the OS on demand, arenas and object pools (C++ front ends: cmalloc.hpp).
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
    size_t bytes_in_use;   /* handed to the program and not yet freed (object-size granularity) */
    size_t bytes_mapped;   /* obtained from the OS and not yet unmapped */
    size_t bytes_released; /* mapped, but given back with madvise: not resident */
    size_t bytes_page_heap_free; /* in free spans of the page heap, still resident */
    size_t bytes_central_cache;  /* in central transfer caches, ready for any thread */
    size_t bytes_thread_caches;  /* in per-thread caches */
    size_t bytes_metadata;       /* spans, thread caches and pagemap nodes */
    size_t large_allocations;    /* live allocations served by whole spans or mmap */
    size_t thread_caches;        /* live thread caches */
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

/* Heap profile (CMALLOC_PROF=1): writes the sampled live heap to path in the legacy heap-profile
 * text format that pprof (google-pprof) reads, estimates scaled to the whole heap, followed by
 * the process's mappings so symbols resolve. Returns 0, or -1 with errno set (EINVAL when the
 * profiler is off). Never allocates through malloc. */
int cmalloc_prof_dump(const char *path);

/* ---- arenas and pools ------------------------------------------------------------------------
 * Explicit allocators for code that knows its objects' lifetimes. Their memory comes from
 * cmalloc's page heap in chunks: it counts in cmalloc_stats_get's bytes_in_use while the arena or
 * pool holds it, and goes back to the OS when the arena or pool is destroyed. Neither ever calls
 * malloc for an object. Their objects must not be passed to free() or realloc() (cmalloc reports
 * that as an invalid pointer). Bad input is reported on stderr and the process aborts, as for a
 * bad free(): "cmalloc: cmalloc_pool_free(): ...". Zero sizes, a bad alignment or bad flags
 * return NULL with errno EINVAL; out of memory returns NULL with errno ENOMEM.
 *
 * Arena: a linear (bump) allocator. Objects are not freed one by one: a mark remembers a
 * position, and rewinding to it frees everything allocated after it (a stack, LIFO), reset frees
 * everything. When its chunk is full the arena takes a new one, twice as large as the last (or
 * large enough for the request), so objects never move. Every arena function: one thread at a
 * time per arena (no locks), as a stack would be used.
 */
typedef struct cmalloc_arena cmalloc_arena;

/* A new arena whose first chunk holds initial_bytes (rounded up to whole pages). O(1). */
cmalloc_arena *cmalloc_arena_create(size_t initial_bytes);

/* size bytes aligned to align (a power of two, any size: 16 for malloc-like objects, up to the
 * page size and beyond). O(1): a pointer bump, or a new chunk from the page heap when full. */
void *cmalloc_arena_alloc(cmalloc_arena *arena, size_t size, size_t align);

/* The current position, to pass to cmalloc_arena_rewind. O(1). A mark stays valid until the
 * arena is rewound to an earlier one, reset or destroyed. */
size_t cmalloc_arena_mark(const cmalloc_arena *arena);

/* Frees everything allocated after mark. O(1) plus one page-heap call per chunk given back
 * (the largest one is kept for reuse). A mark of another arena, a mark ahead of the current
 * position (rewinding forward) or one made invalid by an earlier rewind or reset: abort. */
void cmalloc_arena_rewind(cmalloc_arena *arena, size_t mark);

/* Frees everything; keeps the largest chunk, so an arena reset once per cycle of the same
 * work settles into a single chunk. O(chunks). */
void cmalloc_arena_reset(cmalloc_arena *arena);

/* Frees everything and the arena; its pages go back to the OS at once. O(chunks). NULL: no-op. */
void cmalloc_arena_destroy(cmalloc_arena *arena);

/* Bytes handed out since creation or the last reset (what a rewind to the first mark frees). */
size_t cmalloc_arena_used(const cmalloc_arena *arena);

/* Pool: objects of one size, allocated and freed one at a time in any order. Free objects are
 * bits in a bitmap per chunk: alloc takes the lowest free object of the 64-object word it is
 * working on, or scans at most 16 summary words for the next one (so O(1) with a small bound);
 * free sets a bit and never writes to the object. Objects are aligned to at least 16 bytes and
 * to their size's natural alignment up to 64 (a 64-byte object is 64-byte aligned, a 24-byte
 * one 16). cmalloc_pool_free checks in O(1) that the object is an allocated object of this
 * pool: freeing it twice, or freeing a pointer that is not one (another pool's, malloc's, an
 * address inside an object), is reported and aborts (with CMALLOC_ABORT_ON_ERROR=0: reported
 * and ignored).
 * Flags, ORed:
 *   CMALLOC_POOL_FIXED        capacity is a hard limit: the memory for all of it is taken at
 *                             create, and alloc returns NULL (errno ENOMEM) when capacity objects
 *                             are in use; never calls the page heap after create.
 *   CMALLOC_POOL_GROW         capacity objects are reserved at create (0 allowed); past them the
 *                             pool takes more chunks; objects never move.
 *   CMALLOC_POOL_THREAD_SAFE  any thread may alloc and free (alloc takes the pool's lock, free is
 *                             lock-free); without it one thread at a time uses the pool.
 *                             fork() takes the pool's lock as it takes the allocator's, so a
 *                             child may allocate from a pool other threads were using.
 * Thread-safety below: "pool's threads" means any thread with THREAD_SAFE, else one at a time.
 */
typedef struct cmalloc_pool cmalloc_pool;
#define CMALLOC_POOL_FIXED       0u /* capacity is a hard limit: alloc returns NULL when full */
#define CMALLOC_POOL_GROW        1u /* grows by chunks; objects never move */
#define CMALLOC_POOL_THREAD_SAFE 2u /* any thread may alloc and free */

/* A pool of objects of object_size bytes (1 B .. 1 GiB), room for capacity of them reserved.
 * EINVAL: object_size 0 or above 1 GiB, unknown flags, a FIXED pool of capacity 0.
 * ENOMEM: the reservation failed. O(capacity / objects per chunk). Any thread. */
cmalloc_pool *cmalloc_pool_create(size_t object_size, size_t capacity, unsigned flags);
/* O(1) (a GROW pool past its chunks: one page-heap call); NULL + ENOMEM when out. Pool's threads.
 */
void *cmalloc_pool_alloc(cmalloc_pool *pool);
/* O(1); NULL: no-op. Pool's threads (THREAD_SAFE: any thread, whichever allocated it). */
void cmalloc_pool_free(cmalloc_pool *pool, void *object);
/* O(1), any thread (a snapshot while others allocate and free). */
size_t cmalloc_pool_capacity(const cmalloc_pool *pool);    /* objects it holds without growing */
size_t cmalloc_pool_in_use(const cmalloc_pool *pool);      /* allocated and not freed */
size_t cmalloc_pool_object_size(const cmalloc_pool *pool); /* usable bytes of each object */
/* Frees every object at once; the pages go back to the OS. O(chunks). NULL: no-op. No other
 * call on the pool may be running or follow. */
void cmalloc_pool_destroy(cmalloc_pool *pool);

#ifdef __cplusplus
}
#endif
#endif /* CMALLOC_H */
