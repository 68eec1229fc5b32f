/* pool.c - object pools (cmalloc_pool_*): objects of one size in chunks taken from the page
 * heap, allocated and freed one at a time in O(1), all freed at once by cmalloc_pool_destroy.
 *
 *   chunk: chunk_bytes, a power of two, aligned to itself: one LARGE span of the page heap
 *   +-------------------------------+---------------------+----------+-----+--------+------+
 *   | span, pool, check word, next  | live bits, 1 / 16 B | object 0 | ... | obj n-1| tail |
 *   +-------------------------------+---------------------+----------+-----+--------+------+
 *   ^ object & chunk_mask                                 ^ first_offset (a multiple of 64)
 *
 * An allocation pops the free list of returned objects, or takes the next never-used object
 * at the bump pointer, or (slow path) moves the bump range to the next chunk: a reserved one,
 * or for a GROW pool a new one from the page heap. Objects never move.
 * A free finds the chunk header by masking the address, and trusts it only after the pagemap
 * says a LARGE span starts there and the header names this pool (check word: address ^ pool ^
 * the process's random key), so a foreign pointer is never dereferenced blindly. The object's
 * live bit (one bit per 16-byte granule of the chunk, set at alloc, cleared at free) tells a
 * double free in O(1). Free-list links are encoded like the allocator's own (cm_link_set).
 * THREAD_SAFE: allocations take the pool's lock; frees are lock-free (an atomic clear of the
 * live bit, then a push onto remote_free, a stack that an allocation takes whole when its own
 * list runs dry: no ABA, since nothing pops it one by one). in_use and the live bits are then
 * updated atomically. Without the flag one thread at a time uses the pool, and nothing is atomic.
 * Lock order: a pool's lock is taken before the page heap's (chunk allocation).
 *
 * Invariants (cm_pool_valid checks them, with the pool quiescent):
 *   capacity == in_use + |free_objects| + |remote_free| + (limit - bump) / stride + uncarved
 *   in_use   == live bits set, over all chunks;  every listed object's live bit is clear
 */
#include "internal.h"
#include "cmalloc.h"

#include <errno.h>
#include <stdatomic.h>
#include <string.h>

#define GRANULE_SHIFT 4                          /* live bits: one per 16 bytes of a chunk */
#define MAX_OBJECT ((size_t)1 << 30)
#define CHUNK_MIN_FIXED CM_PAGE_SIZE             /* a small FIXED pool takes one page */
#define CHUNK_MIN_GROW ((size_t)64 << 10)        /* growth steps of a GROW pool at least */
#define CHUNK_MAX ((size_t)1 << 20)              /* unless one object needs more */
#define CHECK_TAG ((uintptr_t)0x706f6f6c63686b31u)  /* "poolchk1" */

typedef struct pool_chunk {
    cm_span *span;                 /* the page-heap span this chunk is */
    const cmalloc_pool *pool;      /* owner */
    uintptr_t check;               /* chunk ^ pool ^ cm_list_key ^ CHECK_TAG */
    struct pool_chunk *next;       /* carved chunks, or the reserve */
    uint64_t live[];               /* bit g: an allocated object starts at granule g */
} pool_chunk;

struct cmalloc_pool {
    /* hot: every alloc and free */
    void *free_objects;            /* freed objects, links encoded (cm_link_set) */
    char *bump, *limit;            /* never-used objects of the chunk being carved */
    size_t in_use;                 /* atomic (__atomic_*) when THREAD_SAFE */
    uintptr_t chunk_mask;          /* ~(chunk_bytes - 1) */
    size_t stride;                 /* object size rounded up to its alignment */
    uint64_t stride_magic;         /* UINT64_MAX / stride + 1: divisibility test, as cm_classes */
    size_t first_offset;           /* objects lie in [first_offset, end_offset) of a chunk */
    size_t end_offset;
    unsigned flags;
    /* THREAD_SAFE */
    void *_Atomic remote_free;     /* freed since the last take: a stack, links encoded */
    cm_lock lock;                  /* guards every field but remote_free and the live bits */
    /* cold */
    pool_chunk *chunks;            /* carved from, newest first */
    pool_chunk *reserve;           /* taken at create, not carved yet */
    size_t chunk_bytes;
    size_t per_chunk;              /* objects in one chunk */
    size_t object_size;            /* as asked for */
    size_t capacity;               /* FIXED: the limit; GROW: objects of every chunk */
    size_t uncarved;               /* objects of the capacity not yet in a bump range */
};

static uintptr_t check_word(const pool_chunk *chunk, const cmalloc_pool *pool)
{
    return (uintptr_t)chunk ^ (uintptr_t)pool ^ cm_list_key ^ CHECK_TAG;
}

static size_t header_bytes(size_t chunk_bytes)
{
    size_t bits = (chunk_bytes >> GRANULE_SHIFT) / 8;
    return (sizeof(pool_chunk) + bits + 63) & ~(size_t)63;
}

static void *fail(int error)
{
    errno = error;
    return NULL;
}

/* A fresh chunk with every live bit clear, or NULL. Page-heap memory may be reused: the
 * header is written whole. */
static pool_chunk *chunk_new(cmalloc_pool *pool)
{
    size_t pages = pool->chunk_bytes >> CM_PAGE_SHIFT;
    cm_span *span = cm_page_heap_alloc(pages, pages, 0);
    if (span == NULL && cm_page_heap_unmap_free() > 0)
        span = cm_page_heap_alloc(pages, pages, 0);
    if (span == NULL)
        return NULL;
    pool_chunk *chunk = cm_span_start(span);
    chunk->span = span;
    chunk->pool = pool;
    chunk->check = check_word(chunk, pool);
    chunk->next = NULL;
    memset(chunk->live, 0, pool->first_offset - sizeof *chunk);
    return chunk;
}

static void chunks_free(pool_chunk *chunk)
{
    for (pool_chunk *next; chunk != NULL; chunk = next) {
        next = chunk->next;
        cm_page_heap_free_released(chunk->span);
    }
}

/* Chooses the layout: the smallest power-of-two chunk that holds capacity objects, at least
 * CHUNK_MIN_* and at most CHUNK_MAX, but always at least one object. */
static void layout(cmalloc_pool *pool, size_t capacity)
{
    size_t low = pool->object_size & -pool->object_size;
    size_t align = low < CM_ALIGNMENT ? CM_ALIGNMENT : low > 64 ? 64 : low;
    pool->stride = (pool->object_size + align - 1) & ~(align - 1);
    pool->stride_magic = UINT64_MAX / pool->stride + 1;
    size_t bytes = pool->flags & CMALLOC_POOL_GROW ? CHUNK_MIN_GROW : CHUNK_MIN_FIXED;
    for (;; bytes <<= 1) {
        size_t per = (bytes - header_bytes(bytes)) / pool->stride;
        if (per >= 1 && (per >= capacity || bytes >= CHUNK_MAX))
            break;
    }
    pool->chunk_bytes = bytes;
    pool->chunk_mask = ~(uintptr_t)(bytes - 1);
    pool->first_offset = header_bytes(bytes);
    pool->per_chunk = (bytes - pool->first_offset) / pool->stride;
    pool->end_offset = pool->first_offset + pool->per_chunk * pool->stride;
}

CM_EXPORT cmalloc_pool *cmalloc_pool_create(size_t object_size, size_t capacity, unsigned flags)
{
    if (object_size == 0 || object_size > MAX_OBJECT ||
        (flags & ~(CMALLOC_POOL_GROW | CMALLOC_POOL_THREAD_SAFE)) ||
        (capacity == 0 && !(flags & CMALLOC_POOL_GROW)))
        return fail(EINVAL);
    if (capacity > PTRDIFF_MAX / 2 / object_size)
        return fail(ENOMEM);
    if (CM_UNLIKELY(!cm_is_initialized()))
        cm_init();
    cmalloc_pool *pool = cm_alloc(sizeof *pool);
    if (pool == NULL)
        return fail(ENOMEM);
    *pool = (cmalloc_pool){.lock = CM_LOCK_INIT, .flags = flags, .object_size = object_size};
    layout(pool, capacity);
    size_t chunks = (capacity + pool->per_chunk - 1) / pool->per_chunk;
    for (size_t i = 0; i < chunks; i++) {
        pool_chunk *chunk = chunk_new(pool);
        if (chunk == NULL) {
            chunks_free(pool->reserve);
            cm_free(pool);
            return fail(ENOMEM);
        }
        chunk->next = pool->reserve;
        pool->reserve = chunk;
    }
    pool->capacity = flags & CMALLOC_POOL_GROW ? chunks * pool->per_chunk : capacity;
    pool->uncarved = pool->capacity;
    pool->bump = pool->limit = NULL;
    return pool;
}

/* The bump range is used up: carve the next chunk (a reserved one, or for a GROW pool a new
 * one) and return its first object; NULL with ENOMEM when there is none. Caller holds the lock
 * of a THREAD_SAFE pool. */
static CM_NOINLINE void *carve_slow(cmalloc_pool *pool)
{
    pool_chunk *chunk = pool->reserve;
    if (chunk != NULL) {
        pool->reserve = chunk->next;
    } else if ((pool->flags & CMALLOC_POOL_GROW) && (chunk = chunk_new(pool)) != NULL) {
        __atomic_store_n(&pool->capacity, pool->capacity + pool->per_chunk, __ATOMIC_RELAXED);
        pool->uncarved += pool->per_chunk;
    } else {
        return fail(ENOMEM);
    }
    chunk->next = pool->chunks;
    pool->chunks = chunk;
    size_t objects = pool->uncarved < pool->per_chunk ? pool->uncarved : pool->per_chunk;
    pool->uncarved -= objects;
    pool->bump = (char *)chunk + pool->first_offset + pool->stride;
    pool->limit = (char *)chunk + pool->first_offset + objects * pool->stride;
    return (char *)chunk + pool->first_offset;
}

/* The next object, not yet marked live; NULL with ENOMEM when the pool is exhausted. */
static inline void *take(cmalloc_pool *pool)
{
    void *object = pool->free_objects;
    if (CM_LIKELY(object != NULL)) {
        pool->free_objects = cm_link_next_checked(object);
        return object;
    }
    if (CM_LIKELY(pool->bump < pool->limit)) {
        object = pool->bump;
        pool->bump += pool->stride;
        return object;
    }
    return carve_slow(pool);
}

static inline uint64_t *live_word(const cmalloc_pool *pool, const void *object, uint64_t *bit)
{
    pool_chunk *chunk = (pool_chunk *)((uintptr_t)object & pool->chunk_mask);
    size_t granule = ((uintptr_t)object - (uintptr_t)chunk) >> GRANULE_SHIFT;
    *bit = (uint64_t)1 << (granule & 63);
    return &chunk->live[granule >> 6];
}

CM_EXPORT void *cmalloc_pool_alloc(cmalloc_pool *pool)
{
    uint64_t bit, old;
    bool shared = pool->flags & CMALLOC_POOL_THREAD_SAFE;
    if (shared) {
        cm_lock_acquire(&pool->lock);
        if (pool->free_objects == NULL)
            pool->free_objects = atomic_exchange_explicit(&pool->remote_free, NULL, memory_order_acquire);
    }
    void *object = take(pool);
    if (CM_LIKELY(object != NULL)) {
        uint64_t *word = live_word(pool, object, &bit);
        if (shared) {
            old = __atomic_fetch_or(word, bit, __ATOMIC_RELAXED);
            __atomic_fetch_add(&pool->in_use, 1, __ATOMIC_RELAXED);
        } else {
            old = *word;
            *word = old | bit;
            pool->in_use++;
        }
        /* A listed object is never live: if it is, the list was written through. */
        if (CM_UNLIKELY(old & bit))
            cm_report_corrupt_list(object);
    }
    if (shared)
        cm_lock_release(&pool->lock);
    return object;
}

/* The chunk whose object p is (an object start, inside the objects), or NULL. Never reads
 * memory the pagemap has not vouched for. */
static pool_chunk *chunk_of(const cmalloc_pool *pool, const void *p)
{
    uintptr_t base = (uintptr_t)p & pool->chunk_mask;
    uint64_t offset = (uintptr_t)p - base - pool->first_offset; /* wraps when below */
    if (offset >= pool->end_offset - pool->first_offset || offset * pool->stride_magic >= pool->stride_magic)
        return NULL;
    cm_span *span = cm_span_of((void *)base);
    if (span == NULL || span->state != CM_SPAN_LARGE || (uintptr_t)cm_span_start(span) != base)
        return NULL;
    pool_chunk *chunk = (pool_chunk *)base;
    return chunk->pool == pool && chunk->check == check_word(chunk, pool) ? chunk : NULL;
}

static CM_COLD void report(const cmalloc_pool *pool, const void *object, bool twice)
{
    cm_message m = {.length = 0};
    cm_message_str(&m, "cmalloc: cmalloc_pool_free(): ");
    if (twice) {
        cm_message_str(&m, "double free ");
        cm_message_hex(&m, (uintptr_t)object);
    } else {
        cm_message_hex(&m, (uintptr_t)object);
        cm_message_str(&m, " is not an object of pool ");
        cm_message_hex(&m, (uintptr_t)pool);
    }
    cm_report_finish(&m);
}

CM_EXPORT void cmalloc_pool_free(cmalloc_pool *pool, void *object)
{
    if (object == NULL)
        return;
    if (CM_UNLIKELY(chunk_of(pool, object) == NULL)) {
        report(pool, object, false);
        return;
    }
    uint64_t bit, *word = live_word(pool, object, &bit);
    if (!(pool->flags & CMALLOC_POOL_THREAD_SAFE)) {
        if (CM_UNLIKELY(!(*word & bit))) {
            report(pool, object, true);
            return;
        }
        *word &= ~bit;
        cm_link_set(object, pool->free_objects);
        pool->free_objects = object;
        pool->in_use--;
        return;
    }
    /* The atomic clear decides between two racing frees of one object: one wins, one reports. */
    if (CM_UNLIKELY(!(__atomic_fetch_and(word, ~bit, __ATOMIC_RELAXED) & bit))) {
        report(pool, object, true);
        return;
    }
    void *head = atomic_load_explicit(&pool->remote_free, memory_order_relaxed);
    do
        cm_link_set(object, head);
    while (!atomic_compare_exchange_weak_explicit(&pool->remote_free, &head, object,
                                                  memory_order_release, memory_order_relaxed));
    __atomic_fetch_sub(&pool->in_use, 1, __ATOMIC_RELAXED);
}

CM_EXPORT size_t cmalloc_pool_capacity(const cmalloc_pool *pool)
{
    return __atomic_load_n(&pool->capacity, __ATOMIC_RELAXED);
}

CM_EXPORT size_t cmalloc_pool_in_use(const cmalloc_pool *pool)
{
    return __atomic_load_n(&pool->in_use, __ATOMIC_RELAXED);
}

CM_EXPORT size_t cmalloc_pool_object_size(const cmalloc_pool *pool)
{
    return pool->stride;
}

CM_EXPORT void cmalloc_pool_destroy(cmalloc_pool *pool)
{
    if (pool == NULL)
        return;
    chunks_free(pool->chunks);
    chunks_free(pool->reserve);
    cm_free(pool);
}

static size_t list_length(void *object)
{
    size_t length = 0;
    for (; object != NULL; object = cm_link_next_checked(object))
        length++;
    return length;
}

/* The invariants in the header comment; the pool must be quiescent. */
bool cm_pool_valid(const cmalloc_pool *pool)
{
    size_t live = 0, words = (pool->first_offset - sizeof(pool_chunk)) / sizeof(uint64_t);
    for (pool_chunk *chunk = pool->chunks; chunk != NULL; chunk = chunk->next)
        for (size_t i = 0; i < words; i++)
            live += (size_t)__builtin_popcountll(chunk->live[i]);
    for (pool_chunk *chunk = pool->reserve; chunk != NULL; chunk = chunk->next)
        for (size_t i = 0; i < words; i++)
            live += chunk->live[i] != 0; /* a reserved chunk has nothing live */
    bool listed_dead = true;
    void *lists[2] = {pool->free_objects, atomic_load_explicit(&pool->remote_free, memory_order_acquire)};
    for (int l = 0; l < 2; l++)
        for (void *object = lists[l]; object != NULL; object = cm_link_next_checked(object)) {
            uint64_t bit, *word = live_word(pool, object, &bit);
            listed_dead &= chunk_of(pool, object) != NULL && !(*word & bit);
        }
    size_t bump_left = pool->limit > pool->bump ? (size_t)(pool->limit - pool->bump) / pool->stride : 0;
    return listed_dead && live == pool->in_use &&
           pool->capacity == pool->in_use + list_length(lists[0]) + list_length(lists[1]) +
                                 bump_left + pool->uncarved;
}
