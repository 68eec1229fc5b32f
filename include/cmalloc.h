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
    size_t bytes_mapped;   /* obtained from the OS and not yet unmapped (the pagemap's tables,
                              reserved whole, count in bytes_metadata as written) */
    size_t bytes_released; /* mapped, but given back with madvise: not resident */
    size_t bytes_page_heap_free; /* in free spans of the page heap, still resident */
    size_t bytes_central_cache;  /* in central transfer caches, ready for any thread */
    size_t bytes_thread_caches;  /* in per-thread caches (and exited threads' kept lists) */
    size_t bytes_metadata;       /* spans, thread caches and the pagemap's written pages */
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

/* Returns free memory to the OS now: the calling thread's cache, the lists exited threads
 * left for the next ones, every central cache's spare batches, the profiler's kept sample
 * pages and every idle free span. Returns the number of bytes released. */
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

/* The current position, to pass to cmalloc_arena_rewind: an opaque value (an address and the
 * arena's epoch), not a pointer. O(1). A mark stays valid until the arena is rewound to an
 * earlier one, reset or destroyed; a rewind to it after that aborts, also once the arena has
 * grown past its position again (checked for the last 64 rewinds to rising positions). */
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
 * call on the pool may be running or follow; one that follows (a free, an allocation, a second
 * destroy) is reported as a use of a destroyed pool and touches no memory the pool had, until
 * a later cmalloc_pool_create reuses the pool's handle. */
void cmalloc_pool_destroy(cmalloc_pool *pool);

/* ---- the inline fast paths -------------------------------------------------------------------
 * cmalloc_pool_alloc, cmalloc_pool_free and cmalloc_arena_alloc are also defined here, inline,
 * for their common case (a pool word with a free object; a free into a chunk the library has
 * checked before; a request that fits the arena's chunk): a call costs more than their work.
 * Everything else, and every call through the function's address, goes to the exported
 * function of the same name (the name in parentheses calls it directly), which does the same
 * and more, with every check; the results are the same either way. Define CMALLOC_NO_INLINE
 * before including this header to call the library for everything.
 * The structs below are the first fields of every pool and arena, part of the library's ABI:
 * read and written only by this header's inline functions and by the library, never by a
 * program. A THREAD_SAFE pool's are set so that its inline paths always call the library. */
#define CMALLOC_POOL_KNOWN 64
struct cmalloc_pool_head {
    /* allocation */
    uint64_t *word;  /* free bits of the objects being handed out (a set bit: object i of
                        word_base is free); a word that is always 0 in a THREAD_SAFE pool */
    char *word_base; /* the object of the word's bit 0 */
    size_t stride;   /* object size, rounded up to its alignment */
    size_t in_use;   /* what cmalloc_pool_in_use returns (0 in a THREAD_SAFE pool, which
                        counts its allocations and frees apart, in the library) */
    /* free */
    uint64_t stride_inverse; /* inverse of the stride's odd part, modulo 2^64 */
    unsigned stride_shift;   /* the stride's power of two */
    unsigned chunk_shift;    /* log2 of the chunk size (chunks are aligned to it) */
    /* chunks the library checked as this pool's, slot (address >> chunk_shift) % 64: object
     * 0 (NULL when none), the free bits (bit i: object i) and the objects (0 when none) of
     * each; all empty in a THREAD_SAFE pool */
    char *known_base[CMALLOC_POOL_KNOWN];
    uint64_t *known_words[CMALLOC_POOL_KNOWN];
    size_t known_objects[CMALLOC_POOL_KNOWN];
};
struct cmalloc_arena_head {
    char *cursor; /* next free byte of the current chunk */
    char *end;    /* end of the current chunk, aligned to 4096 at least */
};

#ifdef __GNUC__
/* The free of object, when the known chunk of its address bits holds it as an allocated object
 * and its word keeps another free object (else the library has bookkeeping to do). The index
 * is an exact division: the offset from object 0 (mod 2^64) times the inverse of the stride's
 * odd part, rotated right by its power of two, is the quotient when the stride divides the
 * offset, and above UINT64_MAX / stride otherwise; so it is below the chunk's objects exactly
 * for the start of one of them, and nothing else (another chunk's, NULL, a pointer inside an
 * object) passes. 1 when done; 0: the library must do it (and reports a double free or a
 * foreign pointer). */
static inline __attribute__((always_inline)) int
cmalloc_pool_free_fast(struct cmalloc_pool_head *head, void *object)
{
    size_t slot = ((uintptr_t)object >> head->chunk_shift) % CMALLOC_POOL_KNOWN;
    uint64_t x =
        (uint64_t)((uintptr_t)object - (uintptr_t)head->known_base[slot]) * head->stride_inverse;
    unsigned k = head->stride_shift;
    size_t index = (size_t)((x >> k) | (x << ((64 - k) & 63)));
    if (__builtin_expect(index >= head->known_objects[slot], 0))
        return 0;
    uint64_t *word = head->known_words[slot] + index / 64, old = *word;
    if (__builtin_expect(((old >> (index % 64)) & 1) != 0 || old == 0, 0))
        return 0;
    *word = old | (uint64_t)1 << (index % 64);
    head->in_use--;
    return 1;
}
#endif

#if !defined(CMALLOC_NO_INLINE) && !defined(CMALLOC_BUILDING) && defined(__GNUC__)
/* The lowest free object of the pool's current word: a load, a test, a bit clear, a count of
 * trailing zeros and a multiply-add. */
static inline __attribute__((always_inline)) void *cmalloc_pool_alloc_inline(cmalloc_pool *pool)
{
    struct cmalloc_pool_head *head = (struct cmalloc_pool_head *)pool;
    uint64_t bits = *head->word;
    if (__builtin_expect(bits != 0, 1)) {
        *head->word = bits & (bits - 1);
        head->in_use++;
        return head->word_base + (size_t)(unsigned)__builtin_ctzll(bits) * head->stride;
    }
    return (cmalloc_pool_alloc)(pool);
}
#define cmalloc_pool_alloc(pool) cmalloc_pool_alloc_inline(pool)

static inline __attribute__((always_inline)) void cmalloc_pool_free_inline(cmalloc_pool *pool,
                                                                           void *object)
{
    if (!cmalloc_pool_free_fast((struct cmalloc_pool_head *)pool, object))
        (cmalloc_pool_free)(pool, object);
}
#define cmalloc_pool_free(pool, object) cmalloc_pool_free_inline(pool, object)

/* A bump: with a constant alignment up to 4096, an add, a mask (none for 1), a compare and
 * the store of the cursor. size 0 and bad alignments fail the test and get their EINVAL from
 * the library, as do requests that do not fit. */
static inline __attribute__((always_inline)) void *
cmalloc_arena_alloc_inline(cmalloc_arena *arena, size_t size, size_t align)
{
    struct cmalloc_arena_head *head = (struct cmalloc_arena_head *)arena;
    uintptr_t p = ((uintptr_t)head->cursor + align - 1) & ~(uintptr_t)(align - 1);
    /* align in 1..4096, a power of two: p cannot pass the end, which is aligned to 4096 */
    if (__builtin_expect(align - 1 < 4096 && (align & (align - 1)) == 0 &&
                             size - 1 < (uintptr_t)head->end - p,
                         1)) {
        head->cursor = (char *)p + size;
        return (void *)p;
    }
    return (cmalloc_arena_alloc)(arena, size, align);
}
#define cmalloc_arena_alloc(arena, size, align) cmalloc_arena_alloc_inline(arena, size, align)
#endif

#ifdef __cplusplus
}
#endif
#endif /* CMALLOC_H */
