/* gen.c - the stream generator: a realistic, seeded message stream for replay and tests.
 *
 * The generator runs a real book alongside what it writes, so cancels and replaces name orders
 * that are resting at that point (as a trading firm's would), and only the deliberate invalid
 * messages are rejected. The model, per message:
 *
 *   mid      random walk: moves one tick up or down on about 1 message in 8
 *   add      ~55%  (less when the book is deep): side at random; passive price mid -/+ (1 +
 *                  offset), offset skewed toward the touch within depth ticks; 1 in 8 adds is
 *                  aggressive (priced through the touch by 0..2 ticks) and trades at once
 *   cancel   ~30%  (more when the book is deep): a resting order picked at random
 *   replace  ~9%   half shrink in place (same price, smaller qty), half move 1..3 ticks
 *   market   ~3%
 *   invalid  ~0.5% duplicate id, zero qty, negative price, cancel or replace of an unknown id,
 *                  replace to a zero qty
 *
 * Quantities are 1..100, with one order in ten a round lot of 100..1000. Order ids count up
 * from 1. The target depth (about 40 resting orders per tick of depth) keeps the book's size
 * steady over long streams.
 */
#include "book.h"

#include <stdlib.h>

typedef struct rng {
    uint64_t state;
} rng;

static uint64_t next_u64(rng *r) /* splitmix64 */
{
    uint64_t z = (r->state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static uint64_t below(rng *r, uint64_t n)
{
    return n ? next_u64(r) % n : 0;
}

typedef struct generator {
    rng rng;
    ob_book *book;
    ob_trades trades;
    int64_t mid;
    int64_t next_id;
    int depth;
    int64_t *live; /* ids that rested when added; some may since have gone */
    size_t live_count;
    size_t live_capacity;
    FILE *out;
} generator;

static int64_t quantity(generator *g)
{
    if (below(&g->rng, 10) == 0)
        return 100 * (int64_t)(1 + below(&g->rng, 10));
    return 1 + (int64_t)below(&g->rng, 100);
}

/* A resting order picked at random, or NULL (dropping ids that are no longer resting). */
static const ob_order *pick_resting(generator *g)
{
    for (int tries = 0; tries < 8 && g->live_count; tries++) {
        size_t i = below(&g->rng, g->live_count);
        const ob_order *o = ob_book_find(g->book, g->live[i]);
        if (o)
            return o;
        g->live[i] = g->live[--g->live_count];
    }
    return NULL;
}

static void remember(generator *g, int64_t id)
{
    if (g->live_count == g->live_capacity) {
        size_t cap = g->live_capacity ? g->live_capacity * 2 : 1024;
        int64_t *live = realloc(g->live, cap * sizeof(int64_t));
        if (!live) {
            fputs("orderbook: out of memory\n", stderr);
            exit(2);
        }
        g->live = live;
        g->live_capacity = cap;
    }
    g->live[g->live_count++] = id;
}

/* Applies m to the generator's book and writes it. */
static void emit(generator *g, const ob_msg *m)
{
    int r = ob_book_apply(g->book, m, NULL);
    g->trades.head = g->trades.tail; /* the generator has no use for its trades */
    if (r == OB_OK && m->type == OB_ADD && ob_book_find(g->book, m->id))
        remember(g, m->id);
    switch (m->type) {
    case OB_ADD:
        fprintf(g->out, "A,%lld,%c,%lld,%lld\n", (long long)m->id, m->side == OB_BUY ? 'B' : 'S',
                (long long)m->price, (long long)m->qty);
        break;
    case OB_MARKET:
        fprintf(g->out, "M,%lld,%c,%lld\n", (long long)m->id, m->side == OB_BUY ? 'B' : 'S',
                (long long)m->qty);
        break;
    case OB_CANCEL: fprintf(g->out, "C,%lld\n", (long long)m->id); break;
    default:
        fprintf(g->out, "R,%lld,%lld,%lld\n", (long long)m->id, (long long)m->price,
                (long long)m->qty);
        break;
    }
}

static void add(generator *g)
{
    ob_msg m = {.type = OB_ADD, .id = g->next_id++, .qty = quantity(g)};
    m.side = (uint8_t)below(&g->rng, 2);
    if (below(&g->rng, 8) == 0) { /* aggressive: through the opposite touch */
        int64_t touch = ob_book_best(g->book, m.side ^ 1);
        if (!touch)
            touch = g->mid;
        int64_t through = (int64_t)below(&g->rng, 3);
        m.price = m.side == OB_BUY ? touch + through : touch - through;
    } else { /* passive, skewed toward the touch */
        uint64_t a = below(&g->rng, (uint64_t)g->depth), b = below(&g->rng, (uint64_t)g->depth);
        int64_t offset = (int64_t)(a * b / (uint64_t)g->depth);
        m.price = m.side == OB_BUY ? g->mid - 1 - offset : g->mid + 1 + offset;
    }
    emit(g, &m);
}

static void invalid(generator *g)
{
    ob_msg m = {.type = OB_ADD, .side = (uint8_t)below(&g->rng, 2), .price = g->mid, .qty = 10};
    const ob_order *o;
    switch (below(&g->rng, 6)) {
    case 0: /* duplicate id */
        m.id = g->next_id > 1 ? 1 + (int64_t)below(&g->rng, (uint64_t)g->next_id - 1) : 1;
        if (g->next_id == 1)
            g->next_id++;
        break;
    case 1:
        m.id = g->next_id;
        m.qty = 0;
        break;
    case 2:
        m.id = g->next_id;
        m.price = -(int64_t)(1 + below(&g->rng, 100));
        break;
    case 3: /* ids above every generated one are never used */
        m.type = OB_CANCEL;
        m.id = INT64_C(1) << 40 | (int64_t)below(&g->rng, 1000000);
        break;
    case 4:
        m.type = OB_REPLACE;
        m.id = INT64_C(1) << 40 | (int64_t)below(&g->rng, 1000000);
        break;
    default:
        o = pick_resting(g);
        m.type = OB_REPLACE;
        m.id = o ? o->id : g->next_id + 1000000000;
        m.price = o ? o->price : g->mid;
        m.qty = 0;
        break;
    }
    emit(g, &m);
}

int ob_generate(FILE *out, uint64_t messages, uint64_t seed, int depth)
{
    generator g = {.rng = {seed}, .mid = 100000, .next_id = 1, .out = out};
    g.depth = depth < 1 ? 1 : depth;
    if (g.mid < 4 * (int64_t)g.depth + 1000) /* deep books start high enough for every price */
        g.mid = 4 * (int64_t)g.depth + 1000;
    ob_trades_init(&g.trades, 1024);
    g.book = ob_book_create(&g.trades, NULL);
    if (!g.book) {
        fputs("orderbook: out of memory\n", stderr);
        exit(2);
    }
    size_t target = (size_t)g.depth * 40;
    fprintf(out, "# orderbook gen --messages %llu --seed %llu --depth %d\n",
            (unsigned long long)messages, (unsigned long long)seed, g.depth);
    for (uint64_t n = 0; n < messages; n++) {
        uint64_t step = below(&g.rng, 16);
        if (step == 0)
            g.mid++;
        else if (step == 1 && g.mid > 4 * (int64_t)g.depth + 10)
            g.mid--;

        uint64_t roll = below(&g.rng, 1000);
        int deep = ob_book_resting(g.book) > target;
        const ob_order *o;
        if (roll < 5) {
            invalid(&g);
        } else if (roll < 35) {
            ob_msg m = {.type = OB_MARKET, .id = g.next_id++, .qty = quantity(&g)};
            m.side = (uint8_t)below(&g.rng, 2);
            emit(&g, &m);
        } else if (roll < 125 && (o = pick_resting(&g)) != NULL) {
            ob_msg m = {.type = OB_REPLACE, .id = o->id, .price = o->price};
            if (below(&g.rng, 2) && o->qty > 1) {
                m.qty = 1 + (int64_t)below(&g.rng, (uint64_t)o->qty - 1);
            } else {
                int64_t move = 1 + (int64_t)below(&g.rng, 3);
                m.price += below(&g.rng, 2) ? move : -move;
                if (m.price < 1)
                    m.price = 1;
                m.qty = quantity(&g);
            }
            emit(&g, &m);
        } else if (roll < (deep ? 600u : 425u) && (o = pick_resting(&g)) != NULL) {
            ob_msg m = {.type = OB_CANCEL, .id = o->id};
            emit(&g, &m);
        } else {
            add(&g);
        }
    }
    ob_book_destroy(g.book);
    ob_trades_destroy(&g.trades);
    free(g.live);
    fflush(out);
    return ferror(out) ? -1 : 0;
}
