/* pool.c - object pools (cmalloc_pool_*): objects of one size in chunks taken from the page
 * heap, allocated and freed one at a time in O(1), all freed at once by cmalloc_pool_destroy.
 *
 *   chunk: chunk_bytes, a power of two, aligned to itself: one LARGE span of the page heap
 *   +-------------------------------+----------------+--------------+----------+-----+------+
 *   | span, pool, check word, lists | summary words  | free words   | object 0 | ... | tail |
 *   +-------------------------------+----------------+--------------+----------+-----+------+
 *   ^ object & chunk_mask            bit w: free     bit i: object   ^ first_offset
 *                                    word w may be   i is free         (a multiple of 64)
 *                                    non-zero
 *
 * Free objects are bits, not a linked list: a free sets the object's bit (and its word's
 * summary bit), an allocation clears the lowest set bit of the word it is working on. So a
 * free never writes to the object, a double free is a bit already set, and allocation walks
 * a chunk in address order however the objects were freed: a pool whose objects were freed at
 * random hands them out again sequentially, without chasing cold pointers. The word being
 * worked on is cached in the pool (word, word_base): the fast path is a load, a test, a
 * count-trailing-zeros, a store and a multiply-add. When the word runs dry, the slow path scans
 * the chunk's summary words (at most 16) for the next word (the first with FULL_ENOUGH free
 * objects, else the fullest: find_word), then takes a chunk from the partial
 * stack (chunks that got frees while not current; the reserved chunks start there) or, for a
 * GROW pool, a new chunk from the page heap. Summary bits may be stale-set (the allocator
 * clears them lazily when it finds the word empty), never stale-clear.
 * A free finds the chunk by masking the address and its index by an exact division (multiply
 * by the inverse of the stride's odd part, rotate by its power of two: an index below
 * per_chunk iff the offset is a multiple of the stride inside the objects). The header is
 * trusted once the pagemap says a LARGE span starts there and the header names this pool
 * (check word: address ^ pool ^ the process's random key): a foreign pointer is never
 * dereferenced blindly. Verified chunks are remembered (KNOWN_SLOTS, direct-mapped by address:
 * head.known_*, which cmalloc.h's inline free reads, or shared_known in a THREAD_SAFE pool),
 * so most frees skip the pagemap: random-order frees over a few chunks otherwise pay a pagemap
 * and span miss each (measured: 3x slower over 16 chunks). Object 0's address, the free words
 * and the objects of each verified chunk are in the table itself, so the free fast path needs
 * no chunk address: the exact division from the slot's object 0 is below the slot's objects
 * only for an object of that chunk (any other address, NULL included, divides to more).
 * The fast paths are inline in cmalloc.h (the call cost more than the work: 6.3 against
 * 3.4 ns an object allocated and freed, build/bench/pool_bench --calls): they read and write
 * struct cmalloc_pool_head, the first member of the pool (word, word_base, stride, in_use, the
 * division and the known table), and call the exported functions for everything else; those
 * start with the same paths. That struct is ABI: a new layout is a new soname. A THREAD_SAFE
 * pool's head says "empty" (word: no_objects; no known chunk), so its inline paths always call
 * the library, whose locked and atomic paths keep their own word and table (shared_word,
 * shared_known).
 * THREAD_SAFE: allocations take the pool's lock; frees take none: the bits are set with atomic
 * read-modify-writes (the one that finds the bit set reports the double free), and a chunk is
 * pushed onto the partial stack lock-free (only lock holders pop, so no ABA). The allocator
 * leaves a chunk only when every word of it is empty, so the first free into a left chunk finds
 * its word empty; only such a free sets the summary bit and lists the chunk (release_rare).
 * It reads `current` after setting its bits, and the allocator re-reads the summary of the
 * chunk it leaves after publishing the new current one (all sequentially consistent), so a
 * chunk with free objects is always current, listed, or about to be listed by one of them.
 * Without the flag one thread at a time uses the pool and nothing is atomic.
 * Destroyed pools: a pool's struct is never freed. Destroy leaves it saying "destroyed" with an
 * empty head, so a call through the stale handle (the inline paths too) reaches the library,
 * which reports it instead of setting a bit in a chunk that malloc may have handed out again;
 * the struct goes on retired_pools and a later create reuses it (a stale handle then names
 * that newer pool, whose checks refuse objects that are not its own).
 * Lock order: pools_lock (the list of THREAD_SAFE pools), then a pool's lock, then the page
 * heap's (chunk allocation). fork takes them all, in that order, before the allocator's
 * locks (pool_fork, the fork hook every create adds: init.c's cm_fork_hook_add): a child may
 * use a THREAD_SAFE pool another thread was allocating from.
 *
 * Invariants (cm_pool_valid checks them, with the pool quiescent):
 *   capacity == in_use + free bits set, over all chunks
 *   summary bit w clear  =>  free word w == 0;   bits past a chunk's objects are clear
 */
#include "fastpath.h"
#define CMALLOC_BUILDING /* the exported functions, not the header's inline copies */
#include "cmalloc.h"

#include <errno.h>
#include <string.h>

#define MAX_OBJECT      ((size_t)1 << 30)
#define CHUNK_MIN_FIXED CM_PAGE_SIZE       /* a small FIXED pool takes one page */
#define CHUNK_MIN_GROW  ((size_t)64 << 10) /* growth steps of a GROW pool at least */
#define CHUNK_MAX       ((size_t)1 << 20)  /* unless one object needs more */
/* `shared` must fold to a constant in each copy of the paths that take it */
#define ALWAYS_INLINE   inline __attribute__((always_inline))
#define KNOWN_SLOTS     CMALLOC_POOL_KNOWN /* verified chunks remembered per pool */
#define NOT_CHUNK       ((pool_chunk *)1)  /* an empty shared_known slot: no chunk, no NULL */
#define CHECK_TAG       ((uintptr_t)0x706f6f6c63686b31u) /* "poolchk1" */

typedef struct pool_chunk {
    cm_span *span;                   /* the page-heap span this chunk is */
    const cmalloc_pool *pool;        /* owner */
    uintptr_t check;                 /* chunk ^ pool ^ cm_list_key ^ CHECK_TAG */
    struct pool_chunk *next;         /* every chunk of the pool, for destroy */
    struct pool_chunk *next_partial; /* on the partial stack */
    uint32_t objects;                /* object slots in use by the pool: <= per_chunk */
    uint32_t listed;                 /* on the partial stack (atomic when THREAD_SAFE) */
    uint64_t bits[];                 /* summary_words summary words, then the free words */
} pool_chunk;

struct cmalloc_pool {
    /* hot: every alloc and free. head (cmalloc.h, read and written by the inline fast paths
     * too; the exported functions start with the same paths):
     *   word        the free word being allocated from; no_objects if none, and always in a
     *               THREAD_SAFE pool (whose word is shared_word), so no unlocked path takes
     *               from one
     *   word_base   the object of that word's bit 0;  stride  object size rounded up to its
     *               alignment;  in_use  the count without THREAD_SAFE (with it: allocated
     *               and freed below)
     *   stride_inverse, stride_shift  the exact division (index_of);  chunk_shift
     *               log2(chunk_bytes)
     *   known_*     chunks checked as this pool's (see release_unknown), by address bits:
     *               object 0, free words, objects; all empty in a THREAD_SAFE pool */
    struct cmalloc_pool_head head;
    uintptr_t chunk_mask; /* ~(chunk_bytes - 1) */
    size_t first_offset;  /* object 0 of a chunk */
    unsigned flags;
    pool_chunk *short_chunk; /* FIXED: the last chunk, cut to the capacity, or NULL */
    size_t short_objects;    /* its objects */
    pool_chunk *current;     /* allocated from; read by THREAD_SAFE frees */
    uint64_t *shared_word;   /* THREAD_SAFE: the word allocated from (head.word's role) */
    /* THREAD_SAFE: chunks verified as this pool's, by address bits (head.known's role) */
    pool_chunk *shared_known[KNOWN_SLOTS];
    pool_chunk *partial; /* chunks with free objects that are not current */
    /* THREAD_SAFE: the allocations' line and the frees' line. An allocation and a free on two
     * threads, each counting into one shared in_use, moved that line between their cores at
     * every call: the order book's pipeline (a gateway thread allocating, the matcher freeing)
     * ran 5.3M messages/s so, 8.7M with two counts (docs/PERFORMANCE.md, "Pools"). */
    _Alignas(CM_CACHE_LINE) cm_lock lock; /* taken by alloc (frees take none) */
    size_t allocated;                     /* objects allocated, under the lock */
    _Alignas(CM_CACHE_LINE) size_t freed; /* objects freed, atomic */
    /* cold */
    _Alignas(CM_CACHE_LINE) cmalloc_pool *next_shared, *prev_shared; /* the list fork walks */
    pool_chunk *chunks;                      /* all of them */
    size_t chunk_bytes;
    size_t per_chunk; /* object slots in one chunk */
    size_t summary_words, free_words;
    size_t capacity; /* FIXED: the limit; GROW: object slots of every chunk */
    bool destroyed;  /* retired by cmalloc_pool_destroy, not yet reused */
};

/* what a pool's word points at before its first chunk, and a THREAD_SAFE pool's head.word
 * always: 0, never written */
static uint64_t no_objects;

static cm_lock pools_lock = CM_LOCK_INIT;
static cmalloc_pool *shared_pools;  /* every THREAD_SAFE pool, for fork */
static cmalloc_pool *retired_pools; /* destroyed pools' structs, through next_shared */

static void shared_pools_add(cmalloc_pool *pool)
{
    cm_lock_acquire(&pools_lock);
    pool->next_shared = shared_pools;
    if (shared_pools)
        shared_pools->prev_shared = pool;
    shared_pools = pool;
    cm_lock_release(&pools_lock);
}

static void shared_pools_remove(cmalloc_pool *pool)
{
    cm_lock_acquire(&pools_lock);
    if (pool->prev_shared)
        pool->prev_shared->next_shared = pool->next_shared;
    else
        shared_pools = pool->next_shared;
    if (pool->next_shared)
        pool->next_shared->prev_shared = pool->prev_shared;
    cm_lock_release(&pools_lock);
}

/* The fork protocol for the THREAD_SAFE pools' locks (see os.c's cm_lock_fork). */
static void pool_fork(int phase)
{
    if (phase == CM_FORK_PREPARE)
        cm_lock_fork(&pools_lock, phase);
    for (cmalloc_pool *pool = shared_pools; pool; pool = pool->next_shared)
        cm_lock_fork(&pool->lock, phase);
    if (phase != CM_FORK_PREPARE)
        cm_lock_fork(&pools_lock, phase);
}

/* ---- operations that are atomic only in THREAD_SAFE pools: `shared` is a constant at each
 * call site, so each inlined copy has one kind or the other. */
static ALWAYS_INLINE uint64_t load(const uint64_t *p, bool shared)
{
    return shared ? __atomic_load_n(p, __ATOMIC_SEQ_CST) : *p;
}
static ALWAYS_INLINE uint64_t fetch_or(uint64_t *p, uint64_t bits, bool shared)
{
    uint64_t old = shared ? __atomic_fetch_or(p, bits, __ATOMIC_SEQ_CST) : *p;
    if (!shared)
        *p = old | bits;
    return old;
}
static ALWAYS_INLINE void clear_bits(uint64_t *p, uint64_t bits, bool shared)
{
    if (shared)
        __atomic_fetch_and(p, ~bits, __ATOMIC_SEQ_CST);
    else
        *p &= ~bits;
}
/* The free objects a word holds. __builtin_popcountll is a call into libgcc unless the build
 * targets a processor with POPCNT, which the x86-64 baseline does not: 21 instructions and
 * the call (`__popcountdi2` under `valgrind --tool=callgrind`); this is a dozen, inline. */
static ALWAYS_INLINE int count_free(uint64_t bits)
{
#ifdef __POPCNT__
    return __builtin_popcountll(bits);
#else
    bits -= (bits >> 1) & 0x5555555555555555u;
    bits = (bits & 0x3333333333333333u) + ((bits >> 2) & 0x3333333333333333u);
    bits = (bits + (bits >> 4)) & 0x0f0f0f0f0f0f0f0fu;
    return (int)((bits * 0x0101010101010101u) >> 56);
#endif
}
/* An allocation counted: under the lock when shared. */
static ALWAYS_INLINE void count_allocated(cmalloc_pool *pool, bool shared)
{
    if (shared)
        __atomic_store_n(&pool->allocated, pool->allocated + 1, __ATOMIC_RELAXED);
    else
        pool->head.in_use++;
}
/* A free counted: released, so that whoever reads this count sees the allocation of every
 * object it counts (in_use). */
static ALWAYS_INLINE void count_freed(cmalloc_pool *pool, bool shared)
{
    if (shared)
        __atomic_fetch_add(&pool->freed, 1, __ATOMIC_RELEASE);
    else
        pool->head.in_use--;
}

static uintptr_t check_word(const pool_chunk *chunk, const cmalloc_pool *pool)
{
    return (uintptr_t)chunk ^ (uintptr_t)pool ^ cm_list_key ^ CHECK_TAG;
}

static uint64_t *summary_of(pool_chunk *chunk)
{
    return chunk->bits;
}
static uint64_t *free_words_of(const cmalloc_pool *pool, pool_chunk *chunk)
{
    return chunk->bits + pool->summary_words;
}

static void *fail(int error)
{
    errno = error;
    return NULL;
}

/* Sets the free bits (and summary bits) of objects [0, objects). */
static void mark_free(const cmalloc_pool *pool, pool_chunk *chunk, size_t objects)
{
    uint64_t *summary = summary_of(chunk), *words = free_words_of(pool, chunk);
    memset(chunk->bits, 0, (pool->summary_words + pool->free_words) * sizeof(uint64_t));
    for (size_t w = 0; w * 64 < objects; w++) {
        words[w] = objects - w * 64 >= 64 ? UINT64_MAX : ((uint64_t)1 << (objects - w * 64)) - 1;
        summary[w / 64] |= (uint64_t)1 << (w % 64);
    }
    chunk->objects = (uint32_t)objects;
}

/* A fresh chunk of `objects` free objects, or NULL. Page-heap memory may be reused: the
 * header is written whole. */
static pool_chunk *chunk_new(cmalloc_pool *pool, size_t objects)
{
    size_t pages = pool->chunk_bytes >> CM_PAGE_SHIFT;
    cm_span *span = cm_page_heap_alloc(pages, pages, 0);
    if (span == NULL && cm_page_heap_unmap_free() > 0)
        span = cm_page_heap_alloc(pages, pages, 0);
    if (span == NULL)
        return NULL;
    pool_chunk *chunk = cm_span_start(span);
    *chunk = (pool_chunk){
        .span = span, .pool = pool, .check = check_word(chunk, pool), .next = pool->chunks};
    mark_free(pool, chunk, objects);
    pool->chunks = chunk;
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
 * CHUNK_MIN_* and at most CHUNK_MAX, but always at least one object; the bitmaps are sized
 * for chunk_bytes / stride objects, a little more than fit beside them. */
static void layout(cmalloc_pool *pool, size_t object_size, size_t capacity)
{
    size_t low = object_size & -object_size;
    size_t align = low < CM_ALIGNMENT ? CM_ALIGNMENT : low > 64 ? 64 : low;
    size_t stride = pool->head.stride = (object_size + align - 1) & ~(align - 1);
    pool->head.stride_shift = (unsigned)__builtin_ctzll(stride);
    uint64_t odd = stride >> pool->head.stride_shift, inverse = odd; /* Newton: 3 bits, x2 */
    for (int i = 0; i < 5; i++)
        inverse *= 2 - odd * inverse;
    pool->head.stride_inverse = inverse;
    size_t bytes = pool->flags & CMALLOC_POOL_GROW ? CHUNK_MIN_GROW : CHUNK_MIN_FIXED;
    for (;; bytes <<= 1) {
        pool->free_words = (bytes / stride + 63) / 64;
        pool->summary_words = (pool->free_words + 63) / 64;
        pool->first_offset =
            (sizeof(pool_chunk) + (pool->summary_words + pool->free_words) * 8 + 63) & ~(size_t)63;
        pool->per_chunk = bytes > pool->first_offset ? (bytes - pool->first_offset) / stride : 0;
        if (pool->per_chunk >= 1 && (pool->per_chunk >= capacity || bytes >= CHUNK_MAX))
            break;
    }
    pool->chunk_bytes = bytes;
    pool->chunk_mask = ~(uintptr_t)(bytes - 1);
    pool->head.chunk_shift = (unsigned)__builtin_ctzll(bytes);
}

/* A pool with no chunk: what create starts from, and what destroy leaves behind. Its head
 * sends every inline path to the library: no object in the word, no known chunk. */
static void make_empty(cmalloc_pool *pool, unsigned flags, bool destroyed)
{
    *pool = (cmalloc_pool){.head.word = &no_objects,
                           .shared_word = &no_objects,
                           .lock = CM_LOCK_INIT,
                           .flags = flags,
                           .destroyed = destroyed};
    for (size_t i = 0; i < KNOWN_SLOTS; i++)
        pool->shared_known[i] = NOT_CHUNK;
}

/* Gives the chunks back and keeps the struct for a later create. */
static void retire(cmalloc_pool *pool)
{
    chunks_free(pool->chunks);
    make_empty(pool, 0, true);
    cm_lock_acquire(&pools_lock);
    pool->next_shared = retired_pools;
    retired_pools = pool;
    cm_lock_release(&pools_lock);
}

static CM_COLD void report_destroyed(const char *caller, const cmalloc_pool *pool)
{
    cm_message m = {.length = 0};
    cm_message_str(&m, "cmalloc: ");
    cm_message_str(&m, caller);
    cm_message_str(&m, ": pool ");
    cm_message_hex(&m, (uintptr_t)pool);
    cm_message_str(&m, " was destroyed");
    cm_report_finish(&m);
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
    cm_fork_hook_add(pool_fork); /* before the first use of pools_lock */
    cm_lock_acquire(&pools_lock);
    cmalloc_pool *pool = retired_pools;
    if (pool != NULL)
        retired_pools = pool->next_shared;
    cm_lock_release(&pools_lock);
    if (pool == NULL && (pool = cm_metadata_alloc(sizeof *pool)) == NULL)
        return fail(ENOMEM);
    make_empty(pool, flags, false);
    layout(pool, object_size, capacity);
    /* The reservation: whole chunks, the last one cut to the capacity of a FIXED pool. */
    for (size_t reserved = 0; reserved < capacity; reserved += pool->per_chunk) {
        size_t objects = capacity - reserved < pool->per_chunk && !(flags & CMALLOC_POOL_GROW)
                             ? capacity - reserved
                             : pool->per_chunk;
        pool_chunk *chunk = chunk_new(pool, objects);
        if (chunk == NULL) {
            retire(pool);
            return fail(ENOMEM);
        }
        if (objects < pool->per_chunk) {
            pool->short_chunk = chunk;
            pool->short_objects = objects;
        }
        chunk->listed = 1;
        chunk->next_partial = pool->partial;
        pool->partial = chunk;
        pool->capacity += objects;
    }
    if (flags & CMALLOC_POOL_THREAD_SAFE)
        shared_pools_add(pool);
    return pool;
}

/* Lists a chunk that has free objects and is not current, unless it is listed already. */
static ALWAYS_INLINE void list_partial(cmalloc_pool *pool, pool_chunk *chunk, bool shared)
{
    if (!shared) {
        if (!chunk->listed) {
            chunk->listed = 1;
            chunk->next_partial = pool->partial;
            pool->partial = chunk;
        }
        return;
    }
    if (__atomic_exchange_n(&chunk->listed, 1, __ATOMIC_SEQ_CST))
        return;
    pool_chunk *head = __atomic_load_n(&pool->partial, __ATOMIC_RELAXED);
    do
        chunk->next_partial = head;
    while (!__atomic_compare_exchange_n(&pool->partial, &head, chunk, true, __ATOMIC_RELEASE,
                                        __ATOMIC_RELAXED));
}

/* Where the word allocated from is kept: head.word, read by the inline fast path, or (shared)
 * shared_word, which only lock holders read. */
static ALWAYS_INLINE uint64_t **word_slot(cmalloc_pool *pool, bool shared)
{
    return shared ? &pool->shared_word : &pool->head.word;
}

/* Points the pool's word at a non-empty free word of the current chunk; false when it has none.
 * Of the words the summary marks, the first holding at least FULL_ENOUGH free objects is taken,
 * else the one holding most: the lowest marked word of a chunk whose objects live long and
 * die at random holds one or two free objects, and a pool that took it ran dry again at once
 * (the order book's replay refilled on a third of its allocations, each refill and the free
 * into the word it had emptied a library call). Three quarters of a word rather than a
 * quarter: the replay of 500,000 generated messages refilled 3,895 times against 9,677 and ran
 * 437.6M instructions against 439.7M, malloc's 442.1M (callgrind, `build/orderbook replay
 * <orders> --passes 1 --alloc pool`, <orders> from `build/orderbook gen --messages 500000
 * --seed 1`); 32: 5,414 and 438.0M. 64, the fullest always, scans every word: over the
 * stream's first 187,374 messages, `--passes 2`, 207.97M against 48's 206.65M. Clears the
 * summary bits of the empty words it passes (re-checking after the clear, against a racing
 * free). */
#define FULL_ENOUGH 48
static bool find_word(cmalloc_pool *pool, bool shared)
{
    pool_chunk *chunk = pool->current;
    if (chunk == NULL)
        return false;
    uint64_t *summary = summary_of(chunk), *words = free_words_of(pool, chunk);
    /* the scan goes on from the word that ran dry (when it is this chunk's), in address order */
    size_t best = SIZE_MAX, start = 0,
           at = ((uintptr_t)*word_slot(pool, shared) - (uintptr_t)words) / sizeof *words;
    if (at < pool->free_words)
        start = at / 64;
    int best_free = 0;
    for (size_t i = 0; i < pool->summary_words && best_free < FULL_ENOUGH; i++) {
        size_t s = start + i < pool->summary_words ? start + i : start + i - pool->summary_words;
        for (uint64_t pending = load(&summary[s], shared); pending && best_free < FULL_ENOUGH;
             pending &= pending - 1) {
            size_t w = s * 64 + (size_t)__builtin_ctzll(pending);
            uint64_t bit = pending & -pending;
            if (load(&words[w], shared) == 0) {
                clear_bits(&summary[s], bit, shared);
                if (load(&words[w], shared) == 0)
                    continue;
                fetch_or(&summary[s], bit, shared);
            }
            uint64_t free_bits = load(&words[w], shared);
            int free_objects = count_free(free_bits);
            if (free_objects > best_free) {
                best = w;
                best_free = free_objects;
            }
        }
    }
    if (best == SIZE_MAX)
        return false;
    *word_slot(pool, shared) = &words[best];
    pool->head.word_base = (char *)chunk + pool->first_offset + best * 64 * pool->head.stride;
    return true;
}

/* The current word is empty: find the next one, in this chunk, a partial chunk, or a new one
 * (GROW). False with errno ENOMEM when there is none. Caller holds the lock when shared. */
static CM_NOINLINE bool refill(cmalloc_pool *pool, bool shared)
{
    while (!find_word(pool, shared)) {
        pool_chunk *old = pool->current, *next;
        if (shared) {
            next = __atomic_load_n(&pool->partial, __ATOMIC_ACQUIRE);
            while (next != NULL &&
                   !__atomic_compare_exchange_n(&pool->partial, &next, next->next_partial, true,
                                                __ATOMIC_ACQUIRE, __ATOMIC_ACQUIRE))
                ;
        } else if ((next = pool->partial) != NULL) {
            pool->partial = next->next_partial;
        }
        if (next == NULL && (pool->flags & CMALLOC_POOL_GROW) &&
            (next = chunk_new(pool, pool->per_chunk)) != NULL)
            __atomic_store_n(&pool->capacity, pool->capacity + pool->per_chunk, __ATOMIC_RELAXED);
        if (next == NULL) {
            errno = ENOMEM;
            return false;
        }
        if (shared) {
            __atomic_store_n(&next->listed, 0, __ATOMIC_SEQ_CST);
            __atomic_store_n(&pool->current, next, __ATOMIC_SEQ_CST);
        } else {
            next->listed = 0;
            pool->current = next;
        }
        /* A free into the old chunk that saw it current did not list it: do it here. */
        for (size_t s = 0; old != NULL && s < pool->summary_words; s++)
            if (load(&summary_of(old)[s], shared)) {
                list_partial(pool, old, shared);
                break;
            }
    }
    return true;
}

/* The lowest free object of the current word, now allocated; NULL when the pool is out. */
static ALWAYS_INLINE void *take(cmalloc_pool *pool, bool shared)
{
    uint64_t *word = *word_slot(pool, shared);
    uint64_t bits = load(word, shared);
    if (CM_UNLIKELY(bits == 0)) {
        if (!refill(pool, shared))
            return NULL;
        word = *word_slot(pool, shared);
        bits = load(word, shared);
    }
    uint64_t bit = bits & -bits;
    clear_bits(word, bit, shared);
    count_allocated(pool, shared);
    return pool->head.word_base + (size_t)__builtin_ctzll(bit) * pool->head.stride;
}

static CM_NOINLINE void *alloc_slow(cmalloc_pool *pool)
{
    if (CM_UNLIKELY(pool->destroyed)) {
        report_destroyed("cmalloc_pool_alloc()", pool);
        errno = EINVAL;
        return NULL;
    }
    if (!(pool->flags & CMALLOC_POOL_THREAD_SAFE))
        return take(pool, false);
    cm_lock_acquire(&pool->lock);
    void *object = take(pool, true);
    cm_lock_release(&pool->lock);
    return object;
}

/* The fast path (one thread, a word with free objects), the same as cmalloc.h's inline copy:
 * a load, a test, a bit clear, a count of trailing zeros, a multiply-add; a leaf, everything
 * else in alloc_slow. A THREAD_SAFE pool's head.word is always 0. */
CM_EXPORT void *cmalloc_pool_alloc(cmalloc_pool *pool)
{
    uint64_t bits = *pool->head.word;
    if (CM_LIKELY(bits != 0)) {
        *pool->head.word = bits & (bits - 1);
        pool->head.in_use++;
        return pool->head.word_base + (size_t)(unsigned)__builtin_ctzll(bits) * pool->head.stride;
    }
    return alloc_slow(pool);
}

/* The index of object p in its chunk (masked from p): below per_chunk exactly when p is an
 * object start inside a chunk's objects (the short chunk of a FIXED pool has fewer; see
 * release). Exact division: the offset times the inverse of the stride's odd part, rotated
 * right by its power of two, is the quotient when the stride divides the offset and above
 * UINT64_MAX / stride otherwise. */
static ALWAYS_INLINE size_t index_of(const cmalloc_pool *pool, const void *p)
{
    uint64_t offset = (uintptr_t)p - ((uintptr_t)p & pool->chunk_mask) - pool->first_offset;
    uint64_t x = offset * pool->head.stride_inverse;
    unsigned k = pool->head.stride_shift;
    return (size_t)((x >> k) | (x << ((64 - k) & 63))); /* rotate right by k (k = 0: x | x) */
}

static ALWAYS_INLINE pool_chunk **shared_slot(cmalloc_pool *pool, const pool_chunk *chunk)
{
    return &pool->shared_known[((uintptr_t)chunk >> pool->head.chunk_shift) % KNOWN_SLOTS];
}

static ALWAYS_INLINE size_t known_slot(const cmalloc_pool *pool, const pool_chunk *chunk)
{
    return ((uintptr_t)chunk >> pool->head.chunk_shift) % KNOWN_SLOTS;
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

/* A free whose word was empty or had the bit set already: a double free, or a word whose
 * summary bit must be set again, in a chunk that may need listing (one the allocator left
 * when all its words were empty). */
static CM_NOINLINE void release_rare(cmalloc_pool *pool, pool_chunk *chunk, size_t index,
                                     uint64_t old, bool shared)
{
    uint64_t bit = (uint64_t)1 << (index % 64);
    if (old & bit) {
        report(pool, (char *)chunk + pool->first_offset + index * pool->head.stride, true);
        return;
    }
    fetch_or(&summary_of(chunk)[index / 4096], (uint64_t)1 << (index / 64 % 64), shared);
    count_freed(pool, shared);
    pool_chunk *current =
        shared ? __atomic_load_n(&pool->current, __ATOMIC_SEQ_CST) : pool->current;
    if (chunk != current)
        list_partial(pool, chunk, shared);
}

/* Frees object `index` of a chunk known to be this pool's. */
static ALWAYS_INLINE void release(cmalloc_pool *pool, pool_chunk *chunk, size_t index, void *object,
                                  bool shared)
{
    /* per_chunk and the short chunk are pool fields: the chunk header stays out of the way */
    if (CM_UNLIKELY(index >= pool->per_chunk ||
                    (chunk == pool->short_chunk && index >= pool->short_objects))) {
        report(pool, object, false);
        return;
    }
    uint64_t bit = (uint64_t)1 << (index % 64);
    uint64_t old = fetch_or(&free_words_of(pool, chunk)[index / 64], bit, shared);
    if (CM_UNLIKELY((old & bit) || old == 0))
        release_rare(pool, chunk, index, old, shared);
    else
        count_freed(pool, shared);
}

/* Remembers a checked chunk of a pool without THREAD_SAFE in head.known, where
 * cmalloc_pool_free_fast finds it. */
static ALWAYS_INLINE void remember(cmalloc_pool *pool, pool_chunk *chunk)
{
    size_t slot = known_slot(pool, chunk);
    pool->head.known_base[slot] = (char *)chunk + pool->first_offset;
    pool->head.known_words[slot] = free_words_of(pool, chunk);
    pool->head.known_objects[slot] =
        chunk == pool->short_chunk ? pool->short_objects : pool->per_chunk;
}

/* A free into a chunk not remembered as this pool's (or of NULL): the pagemap must say a LARGE
 * span starts there, and the header must name this pool, before anything in it is read. */
static CM_NOINLINE void release_unknown(cmalloc_pool *pool, void *object, bool shared)
{
    if (object == NULL)
        return;
    pool_chunk *chunk = (pool_chunk *)((uintptr_t)object & pool->chunk_mask);
    cm_span *span = cm_span_of(chunk);
    if (span == NULL || span->state != CM_SPAN_LARGE || cm_span_start(span) != (void *)chunk ||
        chunk->pool != pool || chunk->check != check_word(chunk, pool)) {
        report(pool, object, false);
        return;
    }
    if (shared)
        __atomic_store_n(shared_slot(pool, chunk), chunk, __ATOMIC_RELAXED);
    else
        remember(pool, chunk);
    release(pool, chunk, index_of(pool, object), object, shared);
}

/* Every free the fast path did not do. One thread: the chunk is remembered (the word was empty
 * or had the bit set, or the pointer is no object start: release sorts it out) or not (checked
 * first). THREAD_SAFE: the shared path, the same with atomic bits and its own known chunks. */
static CM_NOINLINE void release_other(cmalloc_pool *pool, void *object)
{
    if (CM_UNLIKELY(pool->destroyed)) {
        report_destroyed("cmalloc_pool_free()", pool);
        return;
    }
    pool_chunk *chunk = (pool_chunk *)((uintptr_t)object & pool->chunk_mask);
    bool shared = pool->flags & CMALLOC_POOL_THREAD_SAFE;
    if (shared
            ? chunk == __atomic_load_n(shared_slot(pool, chunk), __ATOMIC_RELAXED)
            : pool->head.known_base[known_slot(pool, chunk)] == (char *)chunk + pool->first_offset)
        release(pool, chunk, index_of(pool, object), object, shared);
    else
        release_unknown(pool, object, shared);
}

/* The fast path, cmalloc.h's inline one (one thread, a remembered chunk): a table entry, an
 * exact division, a bounds test, a bit test and set, a count. NULL, a THREAD_SAFE pool's
 * objects and everything else go to release_other. */
CM_EXPORT void cmalloc_pool_free(cmalloc_pool *pool, void *object)
{
    if (CM_LIKELY(cmalloc_pool_free_fast(&pool->head, object)))
        return;
    release_other(pool, object);
}

CM_EXPORT size_t cmalloc_pool_capacity(const cmalloc_pool *pool)
{
    return __atomic_load_n(&pool->capacity, __ATOMIC_RELAXED);
}

CM_EXPORT size_t cmalloc_pool_in_use(const cmalloc_pool *pool)
{
    if (!(pool->flags & CMALLOC_POOL_THREAD_SAFE))
        return pool->head.in_use;
    size_t freed = __atomic_load_n(&pool->freed, __ATOMIC_ACQUIRE); /* first: see count_freed */
    return __atomic_load_n(&pool->allocated, __ATOMIC_RELAXED) - freed;
}

CM_EXPORT size_t cmalloc_pool_object_size(const cmalloc_pool *pool)
{
    return pool->head.stride;
}

CM_EXPORT void cmalloc_pool_destroy(cmalloc_pool *pool)
{
    if (pool == NULL)
        return;
    if (pool->destroyed) {
        report_destroyed("cmalloc_pool_destroy()", pool);
        return;
    }
    if (pool->flags & CMALLOC_POOL_THREAD_SAFE)
        shared_pools_remove(pool);
    retire(pool);
}

/* The invariants in the header comment; the pool must be quiescent. */
bool cm_pool_valid(const cmalloc_pool *pool)
{
    size_t free_objects = 0, slots = 0;
    bool ok = true;
    for (pool_chunk *chunk = pool->chunks; chunk != NULL; chunk = chunk->next) {
        const uint64_t *summary = summary_of(chunk), *words = free_words_of(pool, chunk);
        for (size_t w = 0; w < pool->free_words; w++) {
            free_objects += (size_t)count_free(words[w]);
            ok &= words[w] == 0 || (summary[w / 64] >> (w % 64) & 1);
            size_t first = w * 64, past = chunk->objects; /* no bit at or past `objects` */
            ok &= past >= first + 64 || (words[w] >> (past > first ? past - first : 0)) == 0;
        }
        slots += chunk->objects;
    }
    return ok && slots == pool->capacity &&
           pool->capacity == cmalloc_pool_in_use(pool) + free_objects;
}
