/* book.h - the order-book engine: a price-time-priority limit order book, its message format,
 * the trade ring, the parser, the stream generator and the replay runner.
 *
 * One header for the whole driver (book.c parse.c gen.c latency.c replay.c); main.c is the CLI
 * and tests/test_orderbook.c links the same objects.
 *
 *   message ──parse──> ob_msg[] ──ob_book_apply──> book (ladders + id map) ──> ob_trade ring
 *                                                                               │ drained between
 *                                                                               ▼ messages
 *                                                                   checksum / --trades file
 */
#ifndef OB_BOOK_H
#define OB_BOOK_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cmalloc.h"

/* Prices are integer ticks in [1, OB_PRICE_MAX]; a price above it is rejected like one <= 0
 * (the ladders are tick-indexed, so the bound keeps their directory small in the worst case). */
#define OB_PRICE_MAX INT64_C(2147483647)

/* ---- messages -------------------------------------------------------------------------- */

enum ob_type { OB_ADD = 'A', OB_MARKET = 'M', OB_CANCEL = 'C', OB_REPLACE = 'R' };
enum ob_side { OB_BUY = 0, OB_SELL = 1 };

typedef struct ob_msg {
    int64_t id;    /* order id: A and M create it, C and R name a resting one */
    int64_t price; /* ticks; A and R only (0 otherwise) */
    int64_t qty;   /* A, M and R (0 for C) */
    uint8_t type;  /* enum ob_type */
    uint8_t side;  /* enum ob_side; A and M only */
    uint32_t line; /* line in the source file, for messages about it */
} ob_msg;

/* What ob_book_apply says about one message: OB_OK or the reason it was rejected. A rejected
 * message leaves the book unchanged and does not use up its id. */
enum ob_result {
    OB_OK = 0,
    OB_REJECT_DUPLICATE_ID, /* A or M whose id an accepted A or M already used */
    OB_REJECT_BAD_ID,       /* A or M with a negative id */
    OB_REJECT_BAD_QTY,      /* qty <= 0 (A, M, R) */
    OB_REJECT_BAD_PRICE,    /* price <= 0 or > OB_PRICE_MAX (A, R) */
    OB_REJECT_NOT_RESTING,  /* C or R of an id that is not resting */
    OB_RESULT_COUNT
};
const char *ob_result_name(int result); /* "ok", "duplicate_id", ... (used as summary keys) */

/* ---- trades: a ring written by the matcher, drained between messages ------------------- */

typedef struct ob_trade {
    int64_t taker; /* id of the incoming order */
    int64_t maker; /* id of the resting order */
    int64_t price; /* the resting order's price */
    int64_t qty;
} ob_trade;

/* A single-thread FIFO: ob_book pushes at tail, the replay loop pops at head between
 * messages. It doubles when a single message fills it, so no trade is ever lost.
 * Invariant: tail - head <= mask + 1. */
typedef struct ob_trades {
    ob_trade *slots; /* mask + 1 slots */
    size_t mask;     /* capacity - 1, capacity a power of two */
    size_t head;     /* next to pop (free-running) */
    size_t tail;     /* next to push (free-running) */
} ob_trades;

void ob_trades_init(ob_trades *ring, size_t capacity);
void ob_trades_destroy(ob_trades *ring);
void ob_trades_grow_slow(ob_trades *ring);
static inline size_t ob_trades_count(const ob_trades *ring)
{
    return ring->tail - ring->head;
}
static inline void ob_trades_push(ob_trades *ring, int64_t taker, int64_t maker, int64_t price,
                                  int64_t qty)
{
    if (__builtin_expect(ring->tail - ring->head > ring->mask, 0))
        ob_trades_grow_slow(ring);
    ob_trade *t = &ring->slots[ring->tail++ & ring->mask];
    t->taker = taker;
    t->maker = maker;
    t->price = price;
    t->qty = qty;
}
static inline const ob_trade *ob_trades_pop(ob_trades *ring)
{
    if (ring->head == ring->tail)
        return NULL;
    return &ring->slots[ring->head++ & ring->mask];
}

/* The trade checksum: FNV-1a over 64-bit words, each trade folding taker, maker, price, qty in
 * that order: h = (h ^ word) * 0x100000001b3, starting from 0xcbf29ce484222325. */
#define OB_CHECKSUM_INIT UINT64_C(0xcbf29ce484222325)
static inline uint64_t ob_checksum_trade(uint64_t h, const ob_trade *t)
{
    const uint64_t prime = UINT64_C(0x100000001b3);
    h = (h ^ (uint64_t)t->taker) * prime;
    h = (h ^ (uint64_t)t->maker) * prime;
    h = (h ^ (uint64_t)t->price) * prime;
    h = (h ^ (uint64_t)t->qty) * prime;
    return h;
}

/* ---- the book -------------------------------------------------------------------------- */

/* A resting order: one allocation, linked into its price level's FIFO. */
typedef struct ob_order {
    struct ob_order *next; /* toward the back of the level (later arrivals) */
    struct ob_order *prev; /* toward the front */
    int64_t id;
    int64_t price;
    int64_t qty;  /* remaining; > 0 while resting */
    uint8_t side; /* enum ob_side */
} ob_order;

/* Where orders come from: malloc/free, or (pool not NULL) cmalloc's object pool through
 * cmalloc.h's inline paths, as a program linked with cmalloc calls them. The engine is not
 * linked with cmalloc (it runs under any allocator), so the library functions those paths
 * fall back on are weak references, resolved when libcmalloc is loaded (LD_PRELOAD) and
 * never called otherwise. */
#pragma weak cmalloc_pool_alloc
#pragma weak cmalloc_pool_free
typedef struct ob_allocator {
    cmalloc_pool *pool;
} ob_allocator;

static inline ob_order *ob_order_alloc(const ob_allocator *a)
{
    return a->pool ? cmalloc_pool_alloc(a->pool) : malloc(sizeof(ob_order));
}

static inline void ob_order_free(const ob_allocator *a, ob_order *order)
{
    if (a->pool)
        cmalloc_pool_free(a->pool, order);
    else
        free(order);
}

typedef struct ob_book ob_book;

/* Creates an empty book that pushes its trades to *trades (owned by the caller). allocator may
 * be NULL (malloc/free). Returns NULL when out of memory. */
ob_book *ob_book_create(ob_trades *trades, const ob_allocator *allocator);
/* Frees every resting order and the book. */
void ob_book_destroy(ob_book *book);

/* Applies one message; returns OB_OK or a reject reason. given, when not NULL, is an order
 * object the caller already allocated from the book's allocator for an A or M message (the
 * --pipeline gateway does this): the book rests it or frees it, so the caller never frees it. */
int ob_book_apply(ob_book *book, const ob_msg *msg, ob_order *given);

/* Counters and inspection (for the summary and the tests). */
size_t ob_book_resting(const ob_book *book);                   /* orders resting now */
const ob_order *ob_book_find(const ob_book *book, int64_t id); /* resting order or NULL */
int64_t ob_book_best(const ob_book *book, int side); /* best price, 0 if that side is empty */
/* Calls fn for each resting order of side, best price first, FIFO within a level. */
void ob_book_each(const ob_book *book, int side, void (*fn)(const ob_order *, void *), void *arg);
/* Checks the book's invariants (links, bitmaps, best prices, map); returns 0 when they hold. */
int ob_book_valid(const ob_book *book);

/* ---- parsing (parse.c) ----------------------------------------------------------------- */

typedef struct ob_stream {
    ob_msg *msgs;
    size_t count;
    size_t capacity;
} ob_stream;

/* Parses text (len bytes, need not be NUL-terminated) into out, appending. On a parse error
 * returns -1 and writes "name:line: expected ..." into err. Returns 0 on success. */
int ob_parse_text(const char *name, const char *text, size_t len, ob_stream *out, char *err,
                  size_t err_size);
/* Reads the whole file, then parses it. "-" is standard input. */
int ob_parse_file(const char *path, ob_stream *out, char *err, size_t err_size);
void ob_stream_free(ob_stream *stream);

/* ---- generator (gen.c) ----------------------------------------------------------------- */

/* Writes `messages` message lines (after one comment line) to out, deterministic for seed.
 * depth: how many ticks from the mid price passive orders spread over. Returns 0, or -1 on a
 * write error. */
int ob_generate(FILE *out, uint64_t messages, uint64_t seed, int depth);

/* ---- latency (latency.c) --------------------------------------------------------------- */

/* Log-linear histogram of cycle counts: exact below 64, then 32 buckets per power of two
 * (about 3% wide). Recording is an index computation and an increment. */
#define OB_HISTOGRAM_BUCKETS 1920
typedef struct ob_histogram {
    uint64_t counts[OB_HISTOGRAM_BUCKETS];
    uint64_t max;
} ob_histogram;

static inline unsigned ob_histogram_bucket(uint64_t v)
{
    if (v < 64)
        return (unsigned)v;
    unsigned e = 63u - (unsigned)__builtin_clzll(v); /* >= 6 */
    return (e - 5u) * 32u + (unsigned)(v >> (e - 5u));
}
static inline void ob_histogram_record(ob_histogram *h, uint64_t v)
{
    h->counts[ob_histogram_bucket(v)]++;
    if (v > h->max)
        h->max = v;
}
void ob_histogram_merge(ob_histogram *into, const ob_histogram *from);
/* Value (in ticks) at quantile q in [0,1]: the middle of the bucket holding that rank. */
uint64_t ob_histogram_quantile(const ob_histogram *h, double q);

/* The cheap clock: rdtsc on x86-64 (calibrated once), clock_gettime elsewhere. */
uint64_t ob_clock_ticks(void);
double ob_clock_ns_per_tick(void); /* calibrates on the first call (about 20 ms) */

/* ---- replay (replay.c) ----------------------------------------------------------------- */

typedef struct ob_replay_options {
    const char *trades_path; /* NULL: no trade file; "-" standard output */
    int threads;             /* independent books, one thread each (or one pipeline each) */
    int pipeline;            /* gateway thread + matching thread per book */
    int pin;                 /* thread i (book b's matcher 2b, its gateway 2b+1) runs only on
                                the i-th CPU the process may use, modulo their number */
    int use_pool;            /* orders from the cmalloc object pool */
    int passes;              /* times each book replays the stream, a fresh book each time
                                (0 or 1: once) */
} ob_replay_options;

typedef struct ob_replay_result {
    uint64_t messages; /* per book */
    uint64_t trades;   /* per book */
    uint64_t rejects;  /* per book */
    uint64_t rejects_by_reason[OB_RESULT_COUNT];
    uint64_t resting;           /* per book, at the end */
    uint64_t checksum;          /* of book 0's trades (every book must agree) */
    double seconds;             /* wall time of the replay, all books in parallel */
    double messages_per_second; /* messages * books * passes / seconds */
    double ns_p50, ns_p90, ns_p99, ns_p999, ns_max; /* per message, all books merged */
} ob_replay_result;

/* Replays stream; returns 0, or 2 with a message on stderr (pool missing, books disagree, I/O). */
int ob_replay(const ob_stream *stream, const ob_replay_options *options, ob_replay_result *result);
/* Writes the summary as "key: value" lines. */
void ob_replay_print(FILE *out, const ob_replay_options *options, const ob_replay_result *result);

#endif /* OB_BOOK_H */
