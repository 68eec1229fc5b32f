/* book.c - the matching engine: two price ladders, an id map, a set of used ids.
 *
 * Owns every resting order of one book. Called by one thread at a time (the replay worker or
 * the pipeline's matching thread, or a test); no locks.
 *
 * A ladder (one per side) is a tick-indexed array of price levels, grown on demand, split into
 * chunks of 1024 levels so a sparse range of prices costs only the chunks it touches:
 *
 *   chunks[]  (index = price / 1024 - first_chunk, first_chunk a multiple of 64)
 *     │
 *     ├─> ob_chunk { summary: bit w set <=> words[w] != 0
 *     │              words[16]: bit i set <=> levels[64 w + i] has an order
 *     │              levels[1024]: { head, tail } FIFO of ob_order, oldest at head }
 *     └─> NULL (never touched)
 *   chunk_bits[]: bit c set <=> chunks[c]->summary != 0
 *
 * best is the best occupied price (highest bid, lowest ask), or the side's empty value (0 for
 * bids, INT64_MAX for asks), so "best crosses limit" needs no emptiness test. When the best
 * level empties, the next one is found through the bitmaps: a few word scans, amortised O(1)
 * as orders cluster near the touch.
 *
 * Invariants (checked by ob_book_valid):
 *   level bit set <=> level head != NULL;  every resting order is in the id map and in exactly
 *   one level of its side at its price;  best bid < best ask when both sides are non-empty;
 *   resting == number of map entries.
 *
 * The id map (resting orders) is open addressing with linear probing and backward-shift
 * deletion, at most half full. Used ids (every accepted A or M) live in a bitmap for ids that
 * come densely from 0 and in a hash set for the others.
 */
#include "book.h"

#include <stdlib.h>
#include <string.h>

#define CHUNK_BITS   10
#define CHUNK_LEVELS (1 << CHUNK_BITS)
#define CHUNK_WORDS  (CHUNK_LEVELS / 64)

#define ASK_EMPTY INT64_MAX
#define BID_EMPTY INT64_C(0)

typedef struct ob_level {
    ob_order *head; /* oldest, matched first */
    ob_order *tail; /* newest */
} ob_level;

typedef struct ob_chunk {
    uint64_t summary;            /* bit w set <=> words[w] != 0 */
    uint64_t words[CHUNK_WORDS]; /* bit i of words[w] set <=> levels[64 w + i].head != NULL */
    ob_level levels[CHUNK_LEVELS];
} ob_chunk;

typedef struct ob_ladder {
    ob_chunk **chunks;    /* chunk_count entries, NULL until first used */
    uint64_t *chunk_bits; /* chunk_count bits: chunk non-empty */
    int64_t first_chunk;  /* price / CHUNK_LEVELS of chunks[0]; a multiple of 64 */
    size_t chunk_count;   /* a multiple of 64 (0 before the first order) */
    int64_t best;         /* best occupied price or BID_EMPTY / ASK_EMPTY */
} ob_ladder;

typedef struct map_slot {
    int64_t id; /* -1: empty */
    ob_order *order;
} map_slot;

typedef struct ob_map {
    map_slot *slots;
    size_t mask;    /* capacity - 1 */
    size_t count;   /* count * 2 <= capacity */
    unsigned shift; /* 64 - log2(capacity) */
} ob_map;

typedef struct ob_idset {
    uint64_t *dense;     /* bit id set for used ids < dense_bits */
    uint64_t dense_bits; /* a multiple of 64 */
    int64_t *sparse;     /* open addressing, -1 empty: used ids that were >= dense_bits */
    size_t sparse_mask;
    size_t sparse_count;
} ob_idset;

struct ob_book {
    ob_ladder sides[2]; /* [OB_BUY] bids, [OB_SELL] asks */
    ob_map map;         /* resting orders by id */
    ob_idset used;      /* ids of accepted A and M messages */
    ob_trades *trades;
    ob_allocator allocator; /* pool == NULL: malloc/free */
    size_t resting;
};

static void out_of_memory(void) __attribute__((noreturn, cold));
static void out_of_memory(void)
{
    fputs("orderbook: out of memory\n", stderr);
    abort();
}

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n, size);
    if (!p)
        out_of_memory();
    return p;
}

/* ---- trades ring --------------------------------------------------------------------- */

void ob_trades_init(ob_trades *ring, size_t capacity)
{
    size_t cap = 64;
    while (cap < capacity)
        cap <<= 1;
    ring->slots = xcalloc(cap, sizeof(ob_trade));
    ring->mask = cap - 1;
    ring->head = ring->tail = 0;
}

void ob_trades_destroy(ob_trades *ring)
{
    free(ring->slots);
    ring->slots = NULL;
}

void ob_trades_grow_slow(ob_trades *ring)
{
    size_t old_cap = ring->mask + 1, n = ring->tail - ring->head;
    ob_trade *slots = xcalloc(old_cap * 2, sizeof(ob_trade));
    for (size_t i = 0; i < n; i++)
        slots[i] = ring->slots[(ring->head + i) & ring->mask];
    free(ring->slots);
    ring->slots = slots;
    ring->mask = old_cap * 2 - 1;
    ring->head = 0;
    ring->tail = n;
}

const char *ob_result_name(int result)
{
    static const char *const names[OB_RESULT_COUNT] = {
        "ok", "duplicate_id", "bad_id", "bad_qty", "bad_price", "not_resting",
    };
    return result >= 0 && result < OB_RESULT_COUNT ? names[result] : "unknown";
}

/* ---- order allocation ---------------------------------------------------------------- */

static inline ob_order *order_alloc(ob_book *b)
{
    ob_order *p = ob_order_alloc(&b->allocator);
    if (__builtin_expect(p == NULL, 0))
        out_of_memory();
    return p;
}

static inline void order_free(ob_book *b, ob_order *o)
{
    ob_order_free(&b->allocator, o);
}

/* ---- id map -------------------------------------------------------------------------- */

static inline size_t hash_id(int64_t id, unsigned shift)
{
    return (size_t)(((uint64_t)id * UINT64_C(0x9E3779B97F4A7C15)) >> shift);
}

static void map_init(ob_map *m, size_t capacity)
{
    m->slots = malloc(capacity * sizeof(map_slot));
    if (!m->slots)
        out_of_memory();
    for (size_t i = 0; i < capacity; i++)
        m->slots[i].id = -1;
    m->mask = capacity - 1;
    m->count = 0;
    m->shift = 64u - (unsigned)__builtin_ctzll(capacity);
}

static inline ob_order *map_find(const ob_map *m, int64_t id)
{
    size_t i = hash_id(id, m->shift);
    for (;;) {
        const map_slot *s = &m->slots[i];
        if (s->id == id)
            return s->order;
        if (s->id < 0)
            return NULL;
        i = (i + 1) & m->mask;
    }
}

static void map_insert_slot(ob_map *m, int64_t id, ob_order *o)
{
    size_t i = hash_id(id, m->shift);
    while (m->slots[i].id >= 0)
        i = (i + 1) & m->mask;
    m->slots[i].id = id;
    m->slots[i].order = o;
    m->count++;
}

static void map_grow_slow(ob_map *m) __attribute__((noinline, cold));
static void map_grow_slow(ob_map *m)
{
    ob_map old = *m;
    map_init(m, (old.mask + 1) * 2);
    for (size_t i = 0; i <= old.mask; i++)
        if (old.slots[i].id >= 0)
            map_insert_slot(m, old.slots[i].id, old.slots[i].order);
    free(old.slots);
}

static inline void map_insert(ob_map *m, int64_t id, ob_order *o)
{
    if (__builtin_expect((m->count + 1) * 2 > m->mask + 1, 0))
        map_grow_slow(m);
    map_insert_slot(m, id, o);
}

/* Removes id (which must be present); backward shift keeps every probe chain unbroken. */
static inline void map_remove(ob_map *m, int64_t id)
{
    size_t i = hash_id(id, m->shift);
    while (m->slots[i].id != id)
        i = (i + 1) & m->mask;
    size_t j = i;
    for (;;) {
        j = (j + 1) & m->mask;
        if (m->slots[j].id < 0)
            break;
        size_t home = hash_id(m->slots[j].id, m->shift);
        /* slot j may move to i when its home is not in the cyclic range (i, j] */
        if (((j - home) & m->mask) >= ((j - i) & m->mask)) {
            m->slots[i] = m->slots[j];
            i = j;
        }
    }
    m->slots[i].id = -1;
    m->count--;
}

/* ---- used ids ------------------------------------------------------------------------ */

static int sparse_contains(const ob_idset *s, int64_t id)
{
    if (s->sparse_count == 0)
        return 0;
    unsigned shift = 64u - (unsigned)__builtin_ctzll(s->sparse_mask + 1);
    for (size_t i = hash_id(id, shift);; i = (i + 1) & s->sparse_mask) {
        if (s->sparse[i] == id)
            return 1;
        if (s->sparse[i] < 0)
            return 0;
    }
}

static void sparse_insert(ob_idset *s, int64_t id)
{
    if ((s->sparse_count + 1) * 2 > s->sparse_mask + 1) {
        size_t old_cap = s->sparse ? s->sparse_mask + 1 : 0, cap = old_cap ? old_cap * 2 : 64;
        int64_t *old = s->sparse;
        s->sparse = malloc(cap * sizeof(int64_t));
        if (!s->sparse)
            out_of_memory();
        memset(s->sparse, 0xff, cap * sizeof(int64_t));
        s->sparse_mask = cap - 1;
        s->sparse_count = 0;
        for (size_t i = 0; i < old_cap; i++)
            if (old[i] >= 0)
                sparse_insert(s, old[i]);
        free(old);
    }
    unsigned shift = 64u - (unsigned)__builtin_ctzll(s->sparse_mask + 1);
    size_t i = hash_id(id, shift);
    while (s->sparse[i] >= 0)
        i = (i + 1) & s->sparse_mask;
    s->sparse[i] = id;
    s->sparse_count++;
}

static inline int idset_contains(const ob_idset *s, int64_t id)
{
    if ((uint64_t)id < s->dense_bits && ((s->dense[id >> 6] >> (id & 63)) & 1))
        return 1;
    return __builtin_expect(s->sparse_count != 0, 0) && sparse_contains(s, id);
}

static void idset_insert_slow(ob_idset *s, int64_t id) __attribute__((noinline));
static void idset_insert_slow(ob_idset *s, int64_t id)
{
    /* Grow the bitmap when id is near it (ids that come roughly in order); else hash it. */
    uint64_t want = s->dense_bits ? s->dense_bits * 2 : 1u << 16;
    if ((uint64_t)id < want + (1u << 20)) {
        while (want <= (uint64_t)id)
            want *= 2;
        uint64_t *dense = realloc(s->dense, want / 8);
        if (!dense)
            out_of_memory();
        memset(dense + s->dense_bits / 64, 0, (want - s->dense_bits) / 8);
        s->dense = dense;
        s->dense_bits = want;
        s->dense[id >> 6] |= UINT64_C(1) << (id & 63);
    } else {
        sparse_insert(s, id);
    }
}

static inline void idset_insert(ob_idset *s, int64_t id)
{
    if (__builtin_expect((uint64_t)id < s->dense_bits, 1))
        s->dense[id >> 6] |= UINT64_C(1) << (id & 63);
    else
        idset_insert_slow(s, id);
}

/* ---- ladders ------------------------------------------------------------------------- */

static inline ob_chunk *chunk_of(const ob_ladder *l, int64_t price)
{
    return l->chunks[(price >> CHUNK_BITS) - l->first_chunk];
}

static inline ob_level *level_of(const ob_ladder *l, int64_t price)
{
    return &chunk_of(l, price)->levels[price & (CHUNK_LEVELS - 1)];
}

/* Makes sure the chunk holding price exists; grows the directory (doubling, word aligned). */
static void ladder_reserve_slow(ob_ladder *l, int64_t price) __attribute__((noinline));
static void ladder_reserve_slow(ob_ladder *l, int64_t price)
{
    int64_t c = price >> CHUNK_BITS;
    if (l->chunk_count == 0 || c < l->first_chunk ||
        c >= l->first_chunk + (int64_t)l->chunk_count) {
        int64_t lo = c & ~INT64_C(63), hi = lo + 64; /* new range [lo, hi) in chunks */
        if (l->chunk_count) {
            int64_t old_hi = l->first_chunk + (int64_t)l->chunk_count;
            size_t want = l->chunk_count * 2;
            if (lo > l->first_chunk)
                lo = l->first_chunk;
            if (hi < old_hi)
                hi = old_hi;
            if ((size_t)(hi - lo) < want) { /* double, growing toward the side that needed it */
                if (c < l->first_chunk)
                    lo = hi - (int64_t)want;
                else
                    hi = lo + (int64_t)want;
                if (lo < 0) {
                    hi -= lo;
                    lo = 0;
                }
            }
        }
        size_t count = (size_t)(hi - lo), shift = (size_t)(l->first_chunk - lo);
        ob_chunk **chunks = xcalloc(count, sizeof(ob_chunk *));
        uint64_t *bits = xcalloc(count / 64, sizeof(uint64_t));
        if (l->chunk_count) {
            memcpy(chunks + shift, l->chunks, l->chunk_count * sizeof(ob_chunk *));
            memcpy(bits + shift / 64, l->chunk_bits, l->chunk_count / 8);
        }
        free(l->chunks);
        free(l->chunk_bits);
        l->chunks = chunks;
        l->chunk_bits = bits;
        l->first_chunk = lo;
        l->chunk_count = count;
    }
    ob_chunk **slot = &l->chunks[c - l->first_chunk];
    if (!*slot)
        *slot = xcalloc(1, sizeof(ob_chunk));
}

static inline void ladder_reserve(ob_ladder *l, int64_t price)
{
    int64_t c = (price >> CHUNK_BITS) - l->first_chunk;
    if (__builtin_expect((uint64_t)c >= l->chunk_count || l->chunks[c] == NULL, 0))
        ladder_reserve_slow(l, price);
}

static inline void ladder_mark(ob_ladder *l, int64_t price)
{
    ob_chunk *ch = chunk_of(l, price);
    unsigned i = (unsigned)(price & (CHUNK_LEVELS - 1));
    if (ch->summary == 0) {
        size_t c = (size_t)((price >> CHUNK_BITS) - l->first_chunk);
        l->chunk_bits[c >> 6] |= UINT64_C(1) << (c & 63);
    }
    ch->words[i >> 6] |= UINT64_C(1) << (i & 63);
    ch->summary |= UINT64_C(1) << (i >> 6);
}

static inline void ladder_unmark(ob_ladder *l, int64_t price)
{
    ob_chunk *ch = chunk_of(l, price);
    unsigned i = (unsigned)(price & (CHUNK_LEVELS - 1));
    ch->words[i >> 6] &= ~(UINT64_C(1) << (i & 63));
    if (ch->words[i >> 6] == 0) {
        ch->summary &= ~(UINT64_C(1) << (i >> 6));
        if (ch->summary == 0) {
            size_t c = (size_t)((price >> CHUNK_BITS) - l->first_chunk);
            l->chunk_bits[c >> 6] &= ~(UINT64_C(1) << (c & 63));
        }
    }
}

static inline int64_t chunk_highest(const ob_ladder *l, size_t c)
{
    const ob_chunk *ch = l->chunks[c];
    unsigned w = 63u - (unsigned)__builtin_clzll(ch->summary);
    unsigned i = 63u - (unsigned)__builtin_clzll(ch->words[w]);
    return ((l->first_chunk + (int64_t)c) << CHUNK_BITS) + (int64_t)(w * 64 + i);
}

static inline int64_t chunk_lowest(const ob_ladder *l, size_t c)
{
    const ob_chunk *ch = l->chunks[c];
    unsigned w = (unsigned)__builtin_ctzll(ch->summary);
    unsigned i = (unsigned)__builtin_ctzll(ch->words[w]);
    return ((l->first_chunk + (int64_t)c) << CHUNK_BITS) + (int64_t)(w * 64 + i);
}

/* Highest occupied price < price, or BID_EMPTY. */
static int64_t ladder_below(const ob_ladder *l, int64_t price)
{
    size_t c = (size_t)((price >> CHUNK_BITS) - l->first_chunk);
    const ob_chunk *ch = l->chunks[c];
    unsigned i = (unsigned)(price & (CHUNK_LEVELS - 1)), w = i >> 6, b = i & 63;
    uint64_t word = ch->words[w] & ((UINT64_C(1) << b) - 1);
    int64_t base = (l->first_chunk + (int64_t)c) << CHUNK_BITS;
    if (word)
        return base + (int64_t)(w * 64 + 63u - (unsigned)__builtin_clzll(word));
    uint64_t summary = ch->summary & ((UINT64_C(1) << w) - 1);
    if (summary) {
        w = 63u - (unsigned)__builtin_clzll(summary);
        return base + (int64_t)(w * 64 + 63u - (unsigned)__builtin_clzll(ch->words[w]));
    }
    /* chunks below c */
    size_t cw = c >> 6;
    uint64_t bits = l->chunk_bits[cw] & ((UINT64_C(1) << (c & 63)) - 1);
    for (;;) {
        if (bits)
            return chunk_highest(l, cw * 64 + 63u - (unsigned)__builtin_clzll(bits));
        if (cw == 0)
            return BID_EMPTY;
        bits = l->chunk_bits[--cw];
    }
}

/* Lowest occupied price > price, or ASK_EMPTY. */
static int64_t ladder_above(const ob_ladder *l, int64_t price)
{
    size_t c = (size_t)((price >> CHUNK_BITS) - l->first_chunk);
    const ob_chunk *ch = l->chunks[c];
    unsigned i = (unsigned)(price & (CHUNK_LEVELS - 1)), w = i >> 6, b = i & 63;
    uint64_t word = b == 63 ? 0 : ch->words[w] & ~((UINT64_C(2) << b) - 1);
    int64_t base = (l->first_chunk + (int64_t)c) << CHUNK_BITS;
    if (word)
        return base + (int64_t)(w * 64 + (unsigned)__builtin_ctzll(word));
    uint64_t summary = w == 63 ? 0 : ch->summary & ~((UINT64_C(2) << w) - 1);
    if (summary) {
        w = (unsigned)__builtin_ctzll(summary);
        return base + (int64_t)(w * 64 + (unsigned)__builtin_ctzll(ch->words[w]));
    }
    size_t cw = c >> 6, nwords = l->chunk_count / 64;
    uint64_t bits = (c & 63) == 63 ? 0 : l->chunk_bits[cw] & ~((UINT64_C(2) << (c & 63)) - 1);
    for (;;) {
        if (bits)
            return chunk_lowest(l, cw * 64 + (unsigned)__builtin_ctzll(bits));
        if (++cw == nwords)
            return ASK_EMPTY;
        bits = l->chunk_bits[cw];
    }
}

/* Appends o at the back of its level. */
static inline void rest_order(ob_book *b, ob_order *o)
{
    ob_ladder *l = &b->sides[o->side];
    ladder_reserve(l, o->price);
    ob_level *lv = level_of(l, o->price);
    o->next = NULL;
    o->prev = lv->tail;
    if (lv->tail) {
        lv->tail->next = o;
    } else {
        lv->head = o;
        ladder_mark(l, o->price);
        if (o->side == OB_BUY ? o->price > l->best : o->price < l->best)
            l->best = o->price;
    }
    lv->tail = o;
}

/* Takes o out of its level (not out of the map). */
static inline void unlink_order(ob_book *b, ob_order *o)
{
    ob_ladder *l = &b->sides[o->side];
    ob_level *lv = level_of(l, o->price);
    if (o->prev)
        o->prev->next = o->next;
    else
        lv->head = o->next;
    if (o->next)
        o->next->prev = o->prev;
    else
        lv->tail = o->prev;
    if (!lv->head) {
        ladder_unmark(l, o->price);
        if (o->price == l->best)
            l->best = o->side == OB_BUY ? ladder_below(l, o->price) : ladder_above(l, o->price);
    }
}

/* Matches an incoming order of side `side` for qty at limit (market: the side's widest limit)
 * against the other side, best level first, FIFO within a level. Returns the qty left. */
static inline int64_t match(ob_book *b, int side, int64_t taker, int64_t limit, int64_t qty)
{
    ob_ladder *l = &b->sides[side ^ 1];
    ob_trades *trades = b->trades;
    while (side == OB_BUY ? l->best <= limit : l->best >= limit) {
        int64_t px = l->best;
        ob_level *lv = level_of(l, px);
        ob_order *o = lv->head;
        for (;;) {
            int64_t q = o->qty < qty ? o->qty : qty;
            ob_trades_push(trades, taker, o->id, px, q);
            qty -= q;
            o->qty -= q;
            if (o->qty)
                break; /* qty == 0: the taker is done, o keeps its place */
            ob_order *next = o->next;
            map_remove(&b->map, o->id);
            order_free(b, o);
            b->resting--;
            o = next;
            if (!o || !qty)
                break;
        }
        if (o) {
            lv->head = o;
            o->prev = NULL;
            return qty; /* the level still has orders, so the taker is done */
        }
        lv->head = lv->tail = NULL;
        ladder_unmark(l, px);
        l->best = side == OB_BUY ? ladder_above(l, px) : ladder_below(l, px);
        if (!qty)
            return 0;
    }
    return qty;
}

/* ---- messages ------------------------------------------------------------------------ */

static int apply_new(ob_book *b, const ob_msg *m, ob_order *given)
{
    int r = OB_OK;
    if (m->id < 0)
        r = OB_REJECT_BAD_ID;
    else if (idset_contains(&b->used, m->id))
        r = OB_REJECT_DUPLICATE_ID;
    else if (m->qty <= 0)
        r = OB_REJECT_BAD_QTY;
    else if (m->type == OB_ADD && (m->price <= 0 || m->price > OB_PRICE_MAX))
        r = OB_REJECT_BAD_PRICE;
    if (r != OB_OK) {
        if (given)
            order_free(b, given);
        return r;
    }
    idset_insert(&b->used, m->id);
    int64_t limit = m->type == OB_ADD ? m->price : m->side == OB_BUY ? OB_PRICE_MAX : 1;
    int64_t left = match(b, m->side, m->id, limit, m->qty);
    if (left == 0 || m->type == OB_MARKET) {
        if (given)
            order_free(b, given);
        return OB_OK;
    }
    ob_order *o = given ? given : order_alloc(b);
    o->id = m->id;
    o->price = m->price;
    o->qty = left;
    o->side = m->side;
    rest_order(b, o);
    map_insert(&b->map, o->id, o);
    b->resting++;
    return OB_OK;
}

static int apply_cancel(ob_book *b, const ob_msg *m)
{
    ob_order *o = m->id >= 0 ? map_find(&b->map, m->id) : NULL;
    if (!o)
        return OB_REJECT_NOT_RESTING;
    unlink_order(b, o);
    map_remove(&b->map, o->id);
    order_free(b, o);
    b->resting--;
    return OB_OK;
}

static int apply_replace(ob_book *b, const ob_msg *m)
{
    ob_order *o = m->id >= 0 ? map_find(&b->map, m->id) : NULL;
    if (!o)
        return OB_REJECT_NOT_RESTING;
    if (m->qty <= 0)
        return OB_REJECT_BAD_QTY;
    if (m->price <= 0 || m->price > OB_PRICE_MAX)
        return OB_REJECT_BAD_PRICE;
    if (m->price == o->price && m->qty <= o->qty) {
        o->qty = m->qty; /* shrink in place: time priority kept */
        return OB_OK;
    }
    unlink_order(b, o); /* cancel + add: loses priority, may trade at once */
    int64_t left = match(b, o->side, o->id, m->price, m->qty);
    if (left == 0) {
        map_remove(&b->map, o->id);
        order_free(b, o);
        b->resting--;
        return OB_OK;
    }
    o->price = m->price;
    o->qty = left;
    rest_order(b, o);
    return OB_OK;
}

int ob_book_apply(ob_book *b, const ob_msg *m, ob_order *given)
{
    switch (m->type) {
    case OB_ADD:
    case OB_MARKET: return apply_new(b, m, given);
    case OB_CANCEL: return apply_cancel(b, m);
    case OB_REPLACE: return apply_replace(b, m);
    default: abort(); /* the parser lets no other type through */
    }
}

/* ---- life cycle and inspection ------------------------------------------------------- */

ob_book *ob_book_create(ob_trades *trades, const ob_allocator *allocator)
{
    ob_book *b = calloc(1, sizeof(*b));
    if (!b)
        return NULL;
    b->sides[OB_BUY].best = BID_EMPTY;
    b->sides[OB_SELL].best = ASK_EMPTY;
    map_init(&b->map, 1024);
    b->trades = trades;
    if (allocator)
        b->allocator = *allocator;
    return b;
}

void ob_book_destroy(ob_book *b)
{
    if (!b)
        return;
    for (size_t i = 0; i <= b->map.mask; i++)
        if (b->map.slots[i].id >= 0)
            order_free(b, b->map.slots[i].order);
    for (int s = 0; s < 2; s++) {
        for (size_t c = 0; c < b->sides[s].chunk_count; c++)
            free(b->sides[s].chunks[c]);
        free(b->sides[s].chunks);
        free(b->sides[s].chunk_bits);
    }
    free(b->map.slots);
    free(b->used.dense);
    free(b->used.sparse);
    free(b);
}

size_t ob_book_resting(const ob_book *b)
{
    return b->resting;
}

const ob_order *ob_book_find(const ob_book *b, int64_t id)
{
    return id >= 0 ? map_find(&b->map, id) : NULL;
}

int64_t ob_book_best(const ob_book *b, int side)
{
    int64_t best = b->sides[side].best;
    return best == ASK_EMPTY ? 0 : best;
}

void ob_book_each(const ob_book *b, int side, void (*fn)(const ob_order *, void *), void *arg)
{
    const ob_ladder *l = &b->sides[side];
    for (int64_t px = l->best; px != BID_EMPTY && px != ASK_EMPTY;
         px = side == OB_BUY ? ladder_below(l, px) : ladder_above(l, px))
        for (const ob_order *o = level_of(l, px)->head; o; o = o->next)
            fn(o, arg);
}

int ob_book_valid(const ob_book *b)
{
    size_t seen = 0;
    for (int s = 0; s < 2; s++) {
        const ob_ladder *l = &b->sides[s];
        int64_t best = s == OB_BUY ? BID_EMPTY : ASK_EMPTY;
        for (size_t c = 0; c < l->chunk_count; c++) {
            const ob_chunk *ch = l->chunks[c];
            int chunk_bit = (int)((l->chunk_bits[c >> 6] >> (c & 63)) & 1);
            if (!ch) {
                if (chunk_bit)
                    return 1;
                continue;
            }
            if (chunk_bit != (ch->summary != 0))
                return 2;
            for (unsigned w = 0; w < CHUNK_WORDS; w++)
                if (((ch->summary >> w) & 1) != (ch->words[w] != 0))
                    return 3;
            for (unsigned i = 0; i < CHUNK_LEVELS; i++) {
                const ob_level *lv = &ch->levels[i];
                int64_t px = ((l->first_chunk + (int64_t)c) << CHUNK_BITS) + i;
                if ((int)((ch->words[i >> 6] >> (i & 63)) & 1) != (lv->head != NULL))
                    return 4;
                if (!lv->head) {
                    if (lv->tail)
                        return 5;
                    continue;
                }
                if (s == OB_BUY ? px > best : px < best)
                    best = px;
                const ob_order *prev = NULL;
                for (const ob_order *o = lv->head; o; prev = o, o = o->next) {
                    if (o->prev != prev || o->price != px || o->side != s || o->qty <= 0)
                        return 6;
                    if (map_find(&b->map, o->id) != o)
                        return 7;
                    seen++;
                }
                if (lv->tail != prev)
                    return 8;
            }
        }
        if (best != l->best)
            return 9;
    }
    if (seen != b->resting || seen != b->map.count)
        return 10;
    if (b->sides[OB_BUY].best != BID_EMPTY && b->sides[OB_SELL].best != ASK_EMPTY &&
        b->sides[OB_BUY].best >= b->sides[OB_SELL].best)
        return 11;
    return 0;
}
