/* arena.c - linear (bump) arenas with marks (cmalloc_arena_*): chunks from the page heap,
 * allocation by moving a cursor, freeing by moving it back.
 *
 *   current chunk                         older chunks (prev), each full up to its `filled`
 *   +--------+-------------------+------+      +--------+--------------+------+
 *   | header | allocated ...     | free | ---> | header | allocated    | tail | ---> ...
 *   +--------+-------------------+------+      +--------+--------------+------+
 *            ^ data              ^cursor ^end           ^ data         ^ filled
 *
 * A mark is the cursor's address, with the low 16 bits of the arena's epoch above its 48
 * address bits. Chunks are disjoint memory, so a mark names exactly one chunk and position, and
 * a mark of another arena is in none of this arena's chunks: rewind finds the mark's chunk by
 * walking back from the current one, gives back the chunks after it and moves the cursor. A mark
 * above the cursor of its chunk is a rewind forward (or a mark taken before a reset). The
 * common case, a mark of the arena's epoch in the current chunk, is two comparisons and, when
 * it frees something, a renewed epoch on the top step (55 instructions for a mark, an inline
 * allocation and its rewind, loop included, against 111 with every rewind on the general path:
 * tests/test_fastpath_budget.sh counts them).
 * Stale marks: a rewind that frees something begins a new epoch, and everything above its
 * position is born again in it; a reset begins one for the whole arena. A mark is valid while
 * the memory at its position was born no later than the mark's epoch, so one made invalid by a
 * rewind past it (or a reset) is caught even when the cursor has since passed it again. Where
 * memory was born is a staircase over offsets (`born`, rising in offset and in epoch); it keeps
 * the last BORN_STEPS steps, and a mark older than 65,536 epochs reads as the newest epoch with
 * its low bits: both only ever accept a stale mark, never refuse a valid one.
 * When the current chunk is full the arena takes a new one, twice as large as the last (at
 * most GROW_MAX unless one request needs more). The largest chunk a rewind gives back is kept
 * as a spare for the next growth, so a loop that rewinds across a chunk boundary does not
 * churn the page heap; reset keeps the largest chunk of all, so a workload repeated between
 * resets settles into a single chunk. Destroy gives every page back to the OS at once.
 * No locks: an arena is used by one thread at a time.
 * The bump is inline in cmalloc.h (a call costs more than twice the work: 2.8 against 0.8 ns
 * an allocation, its pointer stored, build/bench/pool_bench --alloc arena [--calls]): it reads
 * and writes struct cmalloc_arena_head (cursor, end), the first member of the arena and ABI (a
 * new layout is a new soname), and calls the exported cmalloc_arena_alloc for everything else:
 * a request that does not fit, an alignment above 4096 or not a power of two, size 0. So chunk
 * ends stay aligned to 4096 (whole pages).
 *
 * Invariants: data(current) <= cursor <= end == current + current->bytes;
 *   for every older chunk c: data(c) <= c->filled <= c + c->bytes;
 *   used == current->used_before + (cursor - data(current));
 *   born[i].above < born[i + 1].above and born[i].epoch < born[i + 1].epoch <= epoch.
 */
#include "fastpath.h"
#define CMALLOC_BUILDING /* the exported functions, not the header's inline copies */
#include "cmalloc.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define HEADER     64 /* chunk header, keeps data 64-byte aligned */
#define GROW_MAX   ((size_t)64 << 20)
#define BORN_STEPS 64
#define MARK_ADDRESS_BITS 48 /* the page heap's addresses fit (CM_ADDRESS_BITS) */
#define MARK_EPOCH_MASK   0xffffu
#define MARK_ADDRESS_MASK (((size_t)1 << MARK_ADDRESS_BITS) - 1)
_Static_assert(CM_ADDRESS_BITS <= MARK_ADDRESS_BITS, "a mark holds an address in 48 bits");
_Static_assert(CM_PAGE_SIZE >= 4096, "chunk ends must be aligned to 4096 (cmalloc.h)");

typedef struct arena_chunk {
    struct arena_chunk *prev; /* the chunk filled before this one */
    cm_span *span;            /* the page-heap span this chunk is */
    size_t bytes;             /* whole chunk, header included */
    char *filled;             /* the cursor when a newer chunk became current */
    size_t used_before;       /* bytes handed out in older chunks when this one began */
} arena_chunk;

struct cmalloc_arena {
    struct cmalloc_arena_head head; /* cursor: next free byte of the current chunk; end: its end
                                       (cmalloc.h: the inline cmalloc_arena_alloc bumps cursor) */
    arena_chunk *current;           /* newest chunk; ->prev the older ones */
    arena_chunk *spare;             /* given back by a rewind, kept for the next growth */
    uint64_t epoch;                 /* rewinds that freed something, and resets, so far */
    uint64_t base_epoch;            /* when offsets below every step were born: the last reset */
    struct {
        size_t above;   /* offsets (used() values) above this one ... */
        uint64_t epoch; /* ... were born in this epoch */
    } born[BORN_STEPS];
    size_t steps;
};

static char *data(arena_chunk *chunk)
{
    return (char *)chunk + HEADER;
}

static void *fail(int error)
{
    errno = error;
    return NULL;
}

/* A chunk of at least bytes (rounded up to pages), or NULL. */
static arena_chunk *chunk_new(size_t bytes)
{
    size_t pages = (bytes + CM_PAGE_SIZE - 1) >> CM_PAGE_SHIFT;
    cm_span *span = cm_page_heap_alloc(pages, 1, 0);
    if (span == NULL && cm_page_heap_unmap_free() > 0)
        span = cm_page_heap_alloc(pages, 1, 0);
    if (span == NULL)
        return NULL;
    arena_chunk *chunk = cm_span_start(span);
    *chunk = (arena_chunk){.span = span, .bytes = pages << CM_PAGE_SHIFT};
    return chunk;
}

static void use(cmalloc_arena *arena, arena_chunk *chunk)
{
    arena->current = chunk;
    arena->head.cursor = data(chunk);
    arena->head.end = (char *)chunk + chunk->bytes;
}

CM_EXPORT cmalloc_arena *cmalloc_arena_create(size_t initial_bytes)
{
    if (initial_bytes == 0)
        return fail(EINVAL);
    if (initial_bytes > PTRDIFF_MAX / 2)
        return fail(ENOMEM);
    if (CM_UNLIKELY(!cm_is_initialized()))
        cm_init();
    cmalloc_arena *arena = cm_alloc(sizeof *arena);
    arena_chunk *chunk = arena ? chunk_new(initial_bytes + HEADER) : NULL;
    if (chunk == NULL) {
        cm_free(arena);
        return fail(ENOMEM);
    }
    *arena = (cmalloc_arena){.spare = NULL};
    use(arena, chunk);
    return arena;
}

/* Everything but a fitting request with an alignment up to 4096: bad input, an alignment
 * above 4096 (which may still fit), a new chunk. */
static CM_NOINLINE void *alloc_slow(cmalloc_arena *arena, size_t size, size_t align)
{
    if (size == 0 || align == 0 || (align & (align - 1)))
        return fail(EINVAL);
    uintptr_t fit = ((uintptr_t)arena->head.cursor + align - 1) & ~(uintptr_t)(align - 1);
    if (fit <= (uintptr_t)arena->head.end && size <= (uintptr_t)arena->head.end - fit) {
        arena->head.cursor = (char *)fit + size;
        return (void *)fit;
    }
    if (size > PTRDIFF_MAX / 2 || align > PTRDIFF_MAX / 4)
        return fail(ENOMEM);
    size_t need = HEADER + align - 1 + size;
    size_t grown = arena->current->bytes < GROW_MAX / 2 ? arena->current->bytes * 2 : GROW_MAX;
    arena_chunk *chunk = arena->spare;
    if (chunk != NULL && chunk->bytes >= need) {
        arena->spare = NULL;
    } else if ((chunk = chunk_new(need > grown ? need : grown)) == NULL) {
        return fail(ENOMEM);
    }
    arena_chunk *old = arena->current;
    old->filled = arena->head.cursor;
    chunk->prev = old;
    chunk->used_before = old->used_before + (size_t)(arena->head.cursor - data(old));
    use(arena, chunk);
    char *p = (char *)(((uintptr_t)arena->head.cursor + align - 1) & ~(uintptr_t)(align - 1));
    arena->head.cursor = p + size;
    return p;
}

/* The fast path, as cmalloc.h's inline copy: an add, a mask, two tests (alignments up to
 * 4096 cannot take p past the page-aligned end; size - 1 wraps for 0) and the store. */
CM_EXPORT void *cmalloc_arena_alloc(cmalloc_arena *arena, size_t size, size_t align)
{
    uintptr_t p = ((uintptr_t)arena->head.cursor + align - 1) & ~(uintptr_t)(align - 1);
    if (CM_LIKELY(align - 1 < 4096 && (align & (align - 1)) == 0 &&
                  size - 1 < (uintptr_t)arena->head.end - p)) {
        arena->head.cursor = (char *)p + size;
        return (void *)p;
    }
    return alloc_slow(arena, size, align);
}

CM_EXPORT size_t cmalloc_arena_mark(const cmalloc_arena *arena)
{
    return (size_t)(uintptr_t)arena->head.cursor |
           (size_t)(arena->epoch & MARK_EPOCH_MASK) << MARK_ADDRESS_BITS;
}

CM_EXPORT size_t cmalloc_arena_used(const cmalloc_arena *arena)
{
    return arena->current->used_before + (size_t)(arena->head.cursor - data(arena->current));
}

/* Gives a chunk back: the largest so far is kept as the spare, the other goes to the page
 * heap (not to the OS: rewinds are frequent, the page heap releases by age). */
static void give_back(cmalloc_arena *arena, arena_chunk *chunk)
{
    if (arena->spare != NULL && arena->spare->bytes >= chunk->bytes) {
        cm_page_heap_free(chunk->span);
        return;
    }
    if (arena->spare != NULL)
        cm_page_heap_free(arena->spare->span);
    arena->spare = chunk;
}

enum bad_mark { MARK_AHEAD, MARK_ELSEWHERE, MARK_STALE };

static CM_COLD __attribute__((noreturn)) void report_mark(const cmalloc_arena *arena, size_t mark,
                                                          enum bad_mark why)
{
    static const char *const reasons[] = {
        [MARK_AHEAD] = " (a rewind forward, or a mark from before a reset)",
        [MARK_ELSEWHERE] = " (another arena's mark, or one freed by a rewind or reset)",
        [MARK_STALE] = " (made invalid by an earlier rewind past it, or by a reset; the memory "
                       "there has been handed out again)",
    };
    cm_message m = {.length = 0};
    cm_message_str(&m, "cmalloc: cmalloc_arena_rewind(): mark ");
    cm_message_hex(&m, mark);
    cm_message_str(&m, why == MARK_AHEAD ? " is ahead of the arena's position "
                                         : " is not a position of arena ");
    cm_message_hex(&m, why == MARK_AHEAD ? cmalloc_arena_mark(arena) : (uintptr_t)arena);
    cm_message_str(&m, reasons[why]);
    cm_message_str(&m, "; aborting\n");
    cm_message_write(&m, 2);
    abort();
}

/* The epoch at which the memory at offset was born. */
static uint64_t born_at(const cmalloc_arena *arena, size_t offset)
{
    uint64_t epoch = arena->base_epoch;
    for (size_t i = 0; i < arena->steps && arena->born[i].above < offset; i++)
        epoch = arena->born[i].epoch;
    return epoch;
}

/* A new step at offset, on top of those below it: a rebirth that does not renew the top one. */
static CM_NOINLINE void step_at(cmalloc_arena *arena, size_t offset)
{
    while (arena->steps > 0 && arena->born[arena->steps - 1].above >= offset)
        arena->steps--;
    if (arena->steps == BORN_STEPS) { /* forget the oldest step: its marks may go unchecked */
        memmove(&arena->born[0], &arena->born[1], sizeof arena->born[0] * (BORN_STEPS - 1));
        arena->steps--;
    }
    arena->born[arena->steps].above = offset;
    arena->born[arena->steps].epoch = arena->epoch;
    arena->steps++;
}

/* A rewind to offset that frees something: a new epoch, in which all above it is born again.
 * A loop rewinding to the same mark again and again finds its step on top (those below are all
 * below offset): only that step's epoch changes. */
static inline void rebirth_above(cmalloc_arena *arena, size_t offset)
{
    arena->epoch++;
    if (CM_LIKELY(arena->steps > 0 && arena->born[arena->steps - 1].above == offset))
        arena->born[arena->steps - 1].epoch = arena->epoch;
    else
        step_at(arena, offset);
}

/* Every rewind the common case below does not take: a mark in an older chunk, of an older epoch,
 * or a bad one. */
static CM_NOINLINE void rewind_slow(cmalloc_arena *arena, size_t mark)
{
    char *to = (char *)(uintptr_t)(mark & MARK_ADDRESS_MASK);
    uint64_t mark_epoch =
        arena->epoch - ((arena->epoch - (mark >> MARK_ADDRESS_BITS)) & MARK_EPOCH_MASK);
    arena_chunk *chunk = arena->current;
    size_t used = cmalloc_arena_used(arena);
    if (to > arena->head.cursor && to <= arena->head.end)
        report_mark(arena, mark, MARK_AHEAD);
    while (chunk != NULL && !(to >= data(chunk) && to <= (char *)chunk + chunk->bytes))
        chunk = chunk->prev;
    if (chunk == NULL)
        report_mark(arena, mark, MARK_ELSEWHERE);
    if (chunk != arena->current && to > chunk->filled)
        report_mark(arena, mark, MARK_AHEAD);
    size_t offset = chunk->used_before + (size_t)(to - data(chunk));
    /* in the mark's own epoch nothing was born since: it is valid */
    if (mark_epoch != arena->epoch && born_at(arena, offset) > mark_epoch)
        report_mark(arena, mark, MARK_STALE);
    while (arena->current != chunk) {
        arena_chunk *newer = arena->current;
        arena->current = newer->prev;
        give_back(arena, newer);
    }
    use(arena, chunk);
    arena->head.cursor = to;
    if (offset < used)
        rebirth_above(arena, offset);
}

/* The common case, two comparisons: a mark of the arena's epoch (valid, as nothing was born
 * since it was made) in the current chunk, at or below the cursor. rewind_slow would do the
 * same with it: move the cursor, and have what it frees born again. */
CM_EXPORT void cmalloc_arena_rewind(cmalloc_arena *arena, size_t mark)
{
    uintptr_t to = mark & MARK_ADDRESS_MASK, start = (uintptr_t)data(arena->current);
    uintptr_t cursor = (uintptr_t)arena->head.cursor;
    if (CM_UNLIKELY(mark >> MARK_ADDRESS_BITS != (arena->epoch & MARK_EPOCH_MASK) ||
                    to - start > cursor - start)) {
        rewind_slow(arena, mark);
        return;
    }
    if (to != cursor) {
        arena->head.cursor = (char *)to;
        rebirth_above(arena, arena->current->used_before + (to - start));
    }
}

CM_EXPORT void cmalloc_arena_reset(cmalloc_arena *arena)
{
    arena_chunk *keep = arena->spare;
    for (arena_chunk *chunk = arena->current; chunk != NULL; chunk = chunk->prev)
        if (keep == NULL || chunk->bytes > keep->bytes)
            keep = chunk;
    for (arena_chunk *chunk = arena->current, *prev; chunk != NULL; chunk = prev) {
        prev = chunk->prev;
        if (chunk != keep)
            cm_page_heap_free(chunk->span);
    }
    if (arena->spare != NULL && arena->spare != keep)
        cm_page_heap_free(arena->spare->span);
    arena->spare = NULL;
    keep->prev = NULL;
    keep->used_before = 0;
    use(arena, keep);
    arena->base_epoch = ++arena->epoch;
    arena->steps = 0;
}

CM_EXPORT void cmalloc_arena_destroy(cmalloc_arena *arena)
{
    if (arena == NULL)
        return;
    if (arena->spare != NULL)
        cm_page_heap_free_released(arena->spare->span);
    for (arena_chunk *chunk = arena->current, *prev; chunk != NULL; chunk = prev) {
        prev = chunk->prev;
        cm_page_heap_free_released(chunk->span);
    }
    cm_free(arena);
}
