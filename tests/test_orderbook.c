/* test_orderbook.c - the order-book driver's engine, parser and replay runner (cmocka).
 *
 * Links the engine objects only (bench/orderbook/orderbook.mk), not the allocator:
 *   - matching semantics one by one: priority within and across levels, partial fills, replace
 *     keeping and losing priority, market orders sweeping levels, every reject case;
 *   - the parser's errors, with their exact "name:line: expected ..." text;
 *   - generated streams (and a random stream over far-apart prices) replayed through the
 *     engine and through a slow, obviously-correct reference written here, message by message:
 *     same accept/reject, same trades, same resting orders at the end;
 *   - the replay runner: threads, the pipeline and the pool (under LD_PRELOAD of cmalloc) give
 *     the same trades; --trades output;
 *   - build/orderbook's exit statuses and parse-error line (skipped when it is not built).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "book.h"

/* ---- fixture: a book, its trade ring, and helpers that speak the message format ------- */

typedef struct fixture {
    ob_trades ring;
    ob_book *book;
    char trades[4096]; /* drained trades as "T,..;" text */
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof(*f));
    ob_trades_init(&f->ring, 64);
    f->book = ob_book_create(&f->ring, NULL);
    *state = f;
    return f->book ? 0 : -1;
}

static int teardown(void **state)
{
    fixture *f = *state;
    ob_book_destroy(f->book);
    ob_trades_destroy(&f->ring);
    free(f);
    return 0;
}

/* Parses one line, applies it, checks the book, returns the result. */
static int apply(fixture *f, const char *line)
{
    ob_stream s = {0};
    char err[256] = "";
    if (ob_parse_text("t", line, strlen(line), &s, err, sizeof(err)) != 0 || s.count != 1)
        fail_msg("cannot parse '%s': %s", line, err);
    int r = ob_book_apply(f->book, &s.msgs[0], NULL);
    ob_stream_free(&s);
    assert_int_equal(ob_book_valid(f->book), 0);
    return r;
}

#define OK(f, line)          assert_int_equal(apply(f, line), OB_OK)
#define REJECT(f, line, why) assert_int_equal(apply(f, line), why)

/* Drains the ring and compares its trades with want ("T,a,b,c,d;T,...;" or ""). */
static void expect_trades(fixture *f, const char *want)
{
    char got[4096] = "";
    size_t n = 0;
    const ob_trade *t;
    while ((t = ob_trades_pop(&f->ring)) != NULL)
        n += (size_t)snprintf(got + n, sizeof(got) - n, "T,%lld,%lld,%lld,%lld;",
                              (long long)t->taker, (long long)t->maker, (long long)t->price,
                              (long long)t->qty);
    assert_string_equal(got, want);
}

static void expect_order(fixture *f, int64_t id, int64_t price, int64_t qty)
{
    const ob_order *o = ob_book_find(f->book, id);
    if (!o)
        fail_msg("order %lld is not resting", (long long)id);
    assert_int_equal(o->price, price);
    assert_int_equal(o->qty, qty);
}

static void expect_gone(fixture *f, int64_t id)
{
    assert_null(ob_book_find(f->book, id));
}

/* ---- matching semantics ----------------------------------------------------------------- */

static void priority_within_level(void **state)
{
    fixture *f = *state;
    OK(f, "A,1,S,100,10");
    OK(f, "A,2,S,100,10");
    OK(f, "A,3,S,100,10");
    expect_trades(f, "");
    OK(f, "A,4,B,100,15");
    expect_trades(f, "T,4,1,100,10;T,4,2,100,5;");
    expect_gone(f, 1);
    expect_order(f, 2, 100, 5);
    expect_order(f, 3, 100, 10);
    expect_gone(f, 4);
    OK(f, "A,5,B,100,6"); /* 2 is still first despite its partial fill */
    expect_trades(f, "T,5,2,100,5;T,5,3,100,1;");
    assert_int_equal(ob_book_resting(f->book), 1);
}

static void priority_across_levels(void **state)
{
    fixture *f = *state;
    OK(f, "A,1,S,102,10");
    OK(f, "A,2,S,101,10");
    OK(f, "A,3,S,100,10");
    OK(f, "A,4,B,99,10");
    assert_int_equal(ob_book_best(f->book, OB_SELL), 100);
    assert_int_equal(ob_book_best(f->book, OB_BUY), 99);
    OK(f, "A,5,B,101,25"); /* best price first, each at the resting order's price */
    expect_trades(f, "T,5,3,100,10;T,5,2,101,10;");
    expect_order(f, 5, 101, 5); /* the rest rests at its limit */
    assert_int_equal(ob_book_best(f->book, OB_BUY), 101);
    assert_int_equal(ob_book_best(f->book, OB_SELL), 102);
    OK(f, "A,6,S,90,20"); /* sells match bids highest first */
    expect_trades(f, "T,6,5,101,5;T,6,4,99,10;");
    expect_order(f, 6, 90, 5);
    assert_int_equal(ob_book_best(f->book, OB_BUY), 0);
    assert_int_equal(ob_book_best(f->book, OB_SELL), 90);
}

static void partial_fills(void **state)
{
    fixture *f = *state;
    OK(f, "A,1,B,100,10");
    OK(f, "A,2,S,100,3"); /* taker filled, maker partially */
    expect_trades(f, "T,2,1,100,3;");
    expect_order(f, 1, 100, 7);
    expect_gone(f, 2);
    OK(f, "A,3,S,99,10"); /* maker filled, taker rests the rest */
    expect_trades(f, "T,3,1,100,7;");
    expect_gone(f, 1);
    expect_order(f, 3, 99, 3);
    OK(f, "A,4,S,100,1"); /* no cross: rests behind the better ask */
    expect_trades(f, "");
    OK(f, "A,5,B,98,1");
    expect_trades(f, "");
    assert_int_equal(ob_book_resting(f->book), 3);
}

static void replace_keeps_priority(void **state)
{
    fixture *f = *state;
    OK(f, "A,1,S,100,10");
    OK(f, "A,2,S,100,10");
    OK(f, "R,1,100,10"); /* same price, same qty: in place */
    OK(f, "R,1,100,4");  /* same price, smaller qty: in place */
    expect_order(f, 1, 100, 4);
    OK(f, "A,3,B,100,6");
    expect_trades(f, "T,3,1,100,4;T,3,2,100,2;");
    expect_order(f, 2, 100, 8);
}

static void replace_loses_priority(void **state)
{
    fixture *f = *state;
    OK(f, "A,1,S,100,10");
    OK(f, "A,2,S,100,10");
    OK(f, "A,3,S,100,10");
    OK(f, "R,1,100,11"); /* more qty: to the back */
    OK(f, "R,2,101,10"); /* new price ... */
    OK(f, "R,2,100,10"); /* ... and back: behind 1 */
    expect_order(f, 1, 100, 11);
    OK(f, "A,4,B,100,30");
    expect_trades(f, "T,4,3,100,10;T,4,1,100,11;T,4,2,100,9;");
    expect_order(f, 2, 100, 1);
}

static void replace_crosses(void **state)
{
    fixture *f = *state;
    OK(f, "A,1,B,99,10");
    OK(f, "A,2,B,98,10");
    OK(f, "A,3,S,101,25");
    OK(f, "R,3,99,15"); /* crosses at once: trades as taker 3, rests the rest at 99 */
    expect_trades(f, "T,3,1,99,10;");
    expect_order(f, 3, 99, 5);
    assert_int_equal(ob_book_best(f->book, OB_SELL), 99);
    OK(f, "R,3,98,4"); /* filled completely: gone */
    expect_trades(f, "T,3,2,98,4;");
    expect_gone(f, 3);
    REJECT(f, "R,3,98,4", OB_REJECT_NOT_RESTING);
    expect_order(f, 2, 98, 6);
    OK(f, "R,2,97,6"); /* a bid moving away keeps matching nothing */
    expect_trades(f, "");
    assert_int_equal(ob_book_best(f->book, OB_BUY), 97);
}

static void market_sweeps(void **state)
{
    fixture *f = *state;
    OK(f, "A,1,S,100,5");
    OK(f, "A,2,S,101,5");
    OK(f, "A,3,S,101,5");
    OK(f, "A,4,S,103,5");
    OK(f, "M,5,B,17");
    expect_trades(f, "T,5,1,100,5;T,5,2,101,5;T,5,3,101,5;T,5,4,103,2;");
    expect_gone(f, 5); /* never rests */
    expect_order(f, 4, 103, 3);
    OK(f, "M,6,B,10"); /* more than the book holds: the rest is dropped */
    expect_trades(f, "T,6,4,103,3;");
    assert_int_equal(ob_book_resting(f->book), 0);
    OK(f, "M,7,S,10"); /* empty book: accepted, no trade, the id is used */
    expect_trades(f, "");
    REJECT(f, "A,7,B,100,1", OB_REJECT_DUPLICATE_ID);
    OK(f, "A,8,B,100,1");
    OK(f, "A,9,B,90,1");
    OK(f, "M,10,S,5");
    expect_trades(f, "T,10,8,100,1;T,10,9,90,1;");
}

static void rejects(void **state)
{
    fixture *f = *state;
    OK(f, "A,1,B,100,10");
    OK(f, "A,2,S,105,10");
    /* duplicate ids: of a resting order, of a market order, of filled and cancelled ones */
    REJECT(f, "A,1,B,99,10", OB_REJECT_DUPLICATE_ID);
    REJECT(f, "M,1,S,1", OB_REJECT_DUPLICATE_ID);
    OK(f, "M,3,S,1");
    expect_trades(f, "T,3,1,100,1;");
    REJECT(f, "A,3,S,200,1", OB_REJECT_DUPLICATE_ID);
    OK(f, "C,2");
    REJECT(f, "A,2,S,105,10", OB_REJECT_DUPLICATE_ID);
    /* quantities and prices */
    REJECT(f, "A,4,B,100,0", OB_REJECT_BAD_QTY);
    REJECT(f, "A,4,B,100,-5", OB_REJECT_BAD_QTY);
    REJECT(f, "M,4,B,0", OB_REJECT_BAD_QTY);
    REJECT(f, "M,4,S,-1", OB_REJECT_BAD_QTY);
    REJECT(f, "A,4,S,0,5", OB_REJECT_BAD_PRICE);
    REJECT(f, "A,4,S,-100,5", OB_REJECT_BAD_PRICE);
    REJECT(f, "A,4,S,2147483648,5", OB_REJECT_BAD_PRICE);
    REJECT(f, "A,-4,S,100,5", OB_REJECT_BAD_ID);
    /* cancels and replaces of what is not resting: never seen, cancelled, filled */
    REJECT(f, "C,99", OB_REJECT_NOT_RESTING);
    REJECT(f, "C,2", OB_REJECT_NOT_RESTING);
    REJECT(f, "C,3", OB_REJECT_NOT_RESTING);
    REJECT(f, "C,-1", OB_REJECT_NOT_RESTING);
    REJECT(f, "R,99,100,1", OB_REJECT_NOT_RESTING);
    REJECT(f, "R,2,105,1", OB_REJECT_NOT_RESTING);
    /* bad replaces leave the order as it was, in its place */
    OK(f, "A,5,B,100,3");
    REJECT(f, "R,1,100,0", OB_REJECT_BAD_QTY);
    REJECT(f, "R,1,100,-2", OB_REJECT_BAD_QTY);
    REJECT(f, "R,1,0,5", OB_REJECT_BAD_PRICE);
    REJECT(f, "R,1,-7,5", OB_REJECT_BAD_PRICE);
    expect_order(f, 1, 100, 9);
    OK(f, "M,6,S,10");
    expect_trades(f, "T,6,1,100,9;T,6,5,100,1;");
    /* a rejected message does not use up its id */
    OK(f, "A,4,S,300,1");
    OK(f, "C,4");
    REJECT(f, "C,4", OB_REJECT_NOT_RESTING);
    assert_int_equal(ob_book_resting(f->book), 1);
    expect_trades(f, "");
}

static void far_prices_and_sparse_ids(void **state)
{
    fixture *f = *state;
    OK(f, "A,1,B,1,1");
    OK(f, "A,2,S,2147483647,1");
    OK(f, "A,3,B,5000000,1");
    OK(f, "A,1099511627776,B,70000,1"); /* ids far beyond the dense range */
    REJECT(f, "A,1099511627776,B,70000,1", OB_REJECT_DUPLICATE_ID);
    OK(f, "A,4,S,1000000000,2");
    assert_int_equal(ob_book_best(f->book, OB_BUY), 5000000);
    assert_int_equal(ob_book_best(f->book, OB_SELL), 1000000000);
    OK(f, "M,5,S,3");
    expect_trades(f, "T,5,3,5000000,1;T,5,1099511627776,70000,1;T,5,1,1,1;");
    assert_int_equal(ob_book_best(f->book, OB_BUY), 0);
    OK(f, "M,6,B,3");
    expect_trades(f, "T,6,4,1000000000,2;T,6,2,2147483647,1;");
    assert_int_equal(ob_book_resting(f->book), 0);
}

/* ---- the parser -------------------------------------------------------------------------- */

static void parse_expect_error(const char *text, const char *want)
{
    ob_stream s = {0};
    char err[256] = "";
    assert_int_equal(ob_parse_text("in.txt", text, strlen(text), &s, err, sizeof(err)), -1);
    assert_string_equal(err, want);
    ob_stream_free(&s);
}

static void parser_accepts(void **state)
{
    (void)state;
    const char *text = "# a comment\n"
                       "\n"
                       "A,1,B,100,10\r\n"
                       "  M , 2 , S , 5  # trailing comment\n"
                       "C,1\n"
                       "R,3,-100,+7\n"
                       "A,4,S,-9223372036854775808,9223372036854775807"; /* no final newline */
    ob_stream s = {0};
    char err[256] = "";
    assert_int_equal(ob_parse_text("in.txt", text, strlen(text), &s, err, sizeof(err)), 0);
    assert_int_equal(s.count, 5);
    assert_int_equal(s.msgs[0].type, OB_ADD);
    assert_int_equal(s.msgs[0].side, OB_BUY);
    assert_int_equal(s.msgs[0].line, 3);
    assert_int_equal(s.msgs[1].type, OB_MARKET);
    assert_int_equal(s.msgs[1].side, OB_SELL);
    assert_int_equal(s.msgs[1].qty, 5);
    assert_int_equal(s.msgs[2].type, OB_CANCEL);
    assert_int_equal(s.msgs[3].price, -100);
    assert_int_equal(s.msgs[3].qty, 7);
    assert_true(s.msgs[4].price == INT64_MIN);
    assert_true(s.msgs[4].qty == INT64_MAX);
    ob_stream_free(&s);
}

static void parser_errors(void **state)
{
    (void)state;
    parse_expect_error("A,1,B,100,10\nA,2,B,100\n",
                       "in.txt:2: expected 5 fields (A,id,B|S,price,qty), got 4");
    parse_expect_error("A,1,B,100,10,5", "in.txt:1: expected 5 fields (A,id,B|S,price,qty), got 6");
    parse_expect_error("M,1,B", "in.txt:1: expected 4 fields (M,id,B|S,qty), got 3");
    parse_expect_error("C", "in.txt:1: expected 2 fields (C,id), got 1");
    parse_expect_error("C,1,2", "in.txt:1: expected 2 fields (C,id), got 3");
    parse_expect_error("R,1,100", "in.txt:1: expected 4 fields (R,id,price,qty), got 3");
    parse_expect_error("A,1,B,1,1,1,1,1,1",
                       "in.txt:1: expected 5 fields (A,id,B|S,price,qty), got more than 6");
    parse_expect_error("# ok\nX,1\n", "in.txt:2: expected message type A, M, C or R, got 'X'");
    parse_expect_error("a,1,B,100,10", "in.txt:1: expected message type A, M, C or R, got 'a'");
    parse_expect_error("AA,1,B,100,10", "in.txt:1: expected message type A, M, C or R, got 'AA'");
    parse_expect_error(",1", "in.txt:1: expected message type A, M, C or R, got ''");
    parse_expect_error("A,1,X,100,10", "in.txt:1: expected side B or S, got 'X'");
    parse_expect_error("M,1,buy,10", "in.txt:1: expected side B or S, got 'buy'");
    parse_expect_error("A,1,B,10.5,10", "in.txt:1: expected an integer for price, got '10.5'");
    parse_expect_error("A,x,B,10,10", "in.txt:1: expected an integer for id, got 'x'");
    parse_expect_error("A,1,B,10,", "in.txt:1: expected an integer for qty, got ''");
    parse_expect_error("A,1,B,10,-", "in.txt:1: expected an integer for qty, got '-'");
    parse_expect_error("C,1 2", "in.txt:1: expected an integer for id, got '1 2'");
    parse_expect_error("R,1,100,0x10", "in.txt:1: expected an integer for qty, got '0x10'");
    parse_expect_error("A,1,B,9223372036854775808,1",
                       "in.txt:1: expected price to fit in 64 bits, got '9223372036854775808'");
    parse_expect_error("\n\n\nM,1,S,1e3", "in.txt:4: expected an integer for qty, got '1e3'");
}

static void parse_file_reads_and_reports(void **state)
{
    (void)state;
    char path[] = "/tmp/test_orderbook_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *text = "A,1,B,100,10\nC,1\nQ,1\n";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    ob_stream s = {0};
    char err[512], want[512];
    assert_int_equal(ob_parse_file(path, &s, err, sizeof(err)), -1);
    snprintf(want, sizeof(want), "%s:3: expected message type A, M, C or R, got 'Q'", path);
    assert_string_equal(err, want);
    ob_stream_free(&s);
    unlink(path);
    assert_int_equal(ob_parse_file("/nonexistent/orderbook", &s, err, sizeof(err)), -1);
}

/* ---- the reference: slow and obviously correct ----------------------------------------- */

typedef struct ref_order {
    int64_t id, price, qty, seq;
    int side;
} ref_order;

typedef struct reference {
    ref_order *orders; /* resting, in no order */
    size_t count;
    int64_t *used; /* ids of accepted A and M, in no order */
    size_t used_count;
    int64_t seq;
    ob_trade *trades; /* of the current message */
    size_t trade_count;
} reference;

static int ref_used(const reference *r, int64_t id)
{
    for (size_t i = 0; i < r->used_count; i++)
        if (r->used[i] == id)
            return 1;
    return 0;
}

static ref_order *ref_find(reference *r, int64_t id)
{
    for (size_t i = 0; i < r->count; i++)
        if (r->orders[i].id == id)
            return &r->orders[i];
    return NULL;
}

static void ref_remove(reference *r, ref_order *o)
{
    *o = r->orders[--r->count];
}

/* The best resting order of side that an order at limit may trade with: the best price, then
 * the lowest sequence number. */
static ref_order *ref_best(reference *r, int side, int market, int64_t limit)
{
    ref_order *best = NULL;
    for (size_t i = 0; i < r->count; i++) {
        ref_order *o = &r->orders[i];
        if (o->side != side)
            continue;
        if (!market && (side == OB_SELL ? o->price > limit : o->price < limit))
            continue;
        if (!best || (side == OB_SELL ? o->price < best->price : o->price > best->price) ||
            (o->price == best->price && o->seq < best->seq))
            best = o;
    }
    return best;
}

static int64_t ref_match(reference *r, int side, int64_t taker, int market, int64_t limit,
                         int64_t qty)
{
    ref_order *o;
    while (qty > 0 && (o = ref_best(r, !side, market, limit)) != NULL) {
        int64_t q = qty < o->qty ? qty : o->qty;
        r->trades[r->trade_count++] = (ob_trade){taker, o->id, o->price, q};
        qty -= q;
        o->qty -= q;
        if (o->qty == 0)
            ref_remove(r, o);
    }
    return qty;
}

static void ref_rest(reference *r, int64_t id, int side, int64_t price, int64_t qty)
{
    r->orders[r->count++] = (ref_order){id, price, qty, r->seq++, side};
}

/* Returns 1 when the message is accepted. */
static int ref_apply(reference *r, const ob_msg *m)
{
    r->trade_count = 0;
    ref_order *o;
    switch (m->type) {
    case OB_ADD:
    case OB_MARKET:
        if (m->id < 0 || ref_used(r, m->id) || m->qty <= 0)
            return 0;
        if (m->type == OB_ADD && (m->price <= 0 || m->price > OB_PRICE_MAX))
            return 0;
        r->used[r->used_count++] = m->id;
        int64_t left = ref_match(r, m->side, m->id, m->type == OB_MARKET, m->price, m->qty);
        if (left && m->type == OB_ADD)
            ref_rest(r, m->id, m->side, m->price, left);
        return 1;
    case OB_CANCEL:
        if (!(o = ref_find(r, m->id)))
            return 0;
        ref_remove(r, o);
        return 1;
    default:
        if (!(o = ref_find(r, m->id)) || m->qty <= 0 || m->price <= 0 || m->price > OB_PRICE_MAX)
            return 0;
        if (m->price == o->price && m->qty <= o->qty) {
            o->qty = m->qty;
            return 1;
        }
        ref_order old = *o;
        ref_remove(r, o);
        left = ref_match(r, old.side, old.id, 0, m->price, m->qty);
        if (left)
            ref_rest(r, old.id, old.side, m->price, left);
        return 1;
    }
}

static int ref_priority_cmp(const void *a, const void *b)
{
    const ref_order *x = a, *y = b;
    if (x->side != y->side)
        return x->side - y->side;
    if (x->price != y->price)
        return (x->side == OB_BUY ? x->price < y->price : x->price > y->price) ? 1 : -1;
    return x->seq < y->seq ? -1 : 1;
}

typedef struct collected {
    ob_order *orders;
    size_t count;
} collected;

static void collect(const ob_order *o, void *arg)
{
    collected *c = arg;
    c->orders[c->count++] = *o;
}

/* Replays msgs through the engine and the reference, comparing after every message; returns
 * the number of trades. */
static size_t check_against_reference(const ob_msg *msgs, size_t n)
{
    reference r = {0};
    r.orders = calloc(n + 1, sizeof(ref_order));
    r.used = calloc(n + 1, sizeof(int64_t));
    r.trades = calloc(n + 1, sizeof(ob_trade));
    ob_trades ring;
    ob_trades_init(&ring, 64);
    ob_book *book = ob_book_create(&ring, NULL);
    size_t trades = 0;
    for (size_t i = 0; i < n; i++) {
        int accepted = ref_apply(&r, &msgs[i]);
        int result = ob_book_apply(book, &msgs[i], NULL);
        if (accepted != (result == OB_OK))
            fail_msg("message %zu (line %u): reference %s, engine %s", i, msgs[i].line,
                     accepted ? "accepts" : "rejects", ob_result_name(result));
        size_t k = 0;
        const ob_trade *t;
        while ((t = ob_trades_pop(&ring)) != NULL) {
            if (k >= r.trade_count || memcmp(t, &r.trades[k], sizeof(*t)) != 0)
                fail_msg("message %zu (line %u): trade %zu differs", i, msgs[i].line, k);
            k++;
        }
        assert_int_equal(k, r.trade_count);
        trades += k;
        assert_int_equal(ob_book_resting(book), r.count);
        if (i % 997 == 0)
            assert_int_equal(ob_book_valid(book), 0);
    }
    assert_int_equal(ob_book_valid(book), 0);
    /* the same resting orders, in the same priority order */
    qsort(r.orders, r.count, sizeof(ref_order), ref_priority_cmp);
    collected c = {calloc(r.count + 1, sizeof(ob_order)), 0};
    ob_book_each(book, OB_BUY, collect, &c);
    ob_book_each(book, OB_SELL, collect, &c);
    assert_int_equal(c.count, r.count);
    for (size_t i = 0; i < c.count; i++) {
        assert_int_equal(c.orders[i].id, r.orders[i].id);
        assert_int_equal(c.orders[i].price, r.orders[i].price);
        assert_int_equal(c.orders[i].qty, r.orders[i].qty);
        assert_int_equal(c.orders[i].side, r.orders[i].side);
    }
    free(c.orders);
    ob_book_destroy(book);
    ob_trades_destroy(&ring);
    free(r.orders);
    free(r.used);
    free(r.trades);
    return trades;
}

static void generate(ob_stream *s, uint64_t messages, uint64_t seed, int depth)
{
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    assert_non_null(out);
    assert_int_equal(ob_generate(out, messages, seed, depth), 0);
    fclose(out);
    char err[256] = "";
    if (ob_parse_text("gen", text, len, s, err, sizeof(err)))
        fail_msg("generated stream does not parse: %s", err);
    free(text);
    assert_int_equal(s->count, messages);
}

static void generated_streams_match_reference(void **state)
{
    (void)state;
    static const struct {
        uint64_t seed;
        int depth;
    } runs[] = {{1, 50}, {2, 5}, {3, 200}, {4, 1}};
    for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
        ob_stream s = {0};
        generate(&s, 12000, runs[i].seed, runs[i].depth);
        size_t trades = check_against_reference(s.msgs, s.count);
        assert_true(trades > 500); /* the stream really trades */
        ob_stream_free(&s);
    }
}

static void generator_is_deterministic(void **state)
{
    (void)state;
    char *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    FILE *fa = open_memstream(&a, &la), *fb = open_memstream(&b, &lb);
    ob_generate(fa, 5000, 42, 20);
    ob_generate(fb, 5000, 42, 20);
    fclose(fa);
    fclose(fb);
    assert_int_equal(la, lb);
    assert_memory_equal(a, b, la);
    /* every kind of message, invalid ones included */
    assert_non_null(strstr(a, "\nA,"));
    assert_non_null(strstr(a, "\nM,"));
    assert_non_null(strstr(a, "\nC,"));
    assert_non_null(strstr(a, "\nR,"));
    free(a);
    free(b);
}

typedef struct rng {
    uint64_t s;
} rng;
static uint64_t rnd(rng *r, uint64_t n)
{
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return r->s % n;
}

/* Random messages over clusters of far-apart prices (chunk and directory edges, growth in
 * both directions), random ids that repeat, every message type and every bad value. */
static void random_far_prices_match_reference(void **state)
{
    (void)state;
    static const int64_t centres[] = {1, 1023, 1024, 65535, 65536, 3000000, 900000000, 2147483647};
    rng g = {88172645463325252ull};
    size_t n = 30000;
    ob_msg *msgs = calloc(n, sizeof(ob_msg));
    for (size_t i = 0; i < n; i++) {
        ob_msg *m = &msgs[i];
        int64_t centre = centres[rnd(&g, sizeof(centres) / sizeof(centres[0]))];
        m->line = (uint32_t)i + 1;
        m->id = (int64_t)rnd(&g, 4000) - 2;
        if (rnd(&g, 50) == 0)
            m->id += INT64_C(1) << 45;
        m->price = centre + (int64_t)rnd(&g, 130) - 64;
        if (m->price > OB_PRICE_MAX + 1)
            m->price = OB_PRICE_MAX + 1;
        if (m->price < -1)
            m->price = -1;
        m->qty = (int64_t)rnd(&g, 60) - 1;
        m->side = (uint8_t)rnd(&g, 2);
        uint64_t kind = rnd(&g, 20);
        m->type = kind < 10 ? OB_ADD : kind < 11 ? OB_MARKET : kind < 16 ? OB_CANCEL : OB_REPLACE;
    }
    size_t trades = check_against_reference(msgs, n);
    assert_true(trades > 100);
    free(msgs);
}

/* ---- the replay runner ----------------------------------------------------------------- */

static void replay_modes_agree(void **state)
{
    (void)state;
    ob_stream s = {0};
    generate(&s, 20000, 7, 30);
    /* the expected checksum, straight from the engine */
    ob_trades ring;
    ob_trades_init(&ring, 64);
    ob_book *book = ob_book_create(&ring, NULL);
    uint64_t checksum = OB_CHECKSUM_INIT, trades = 0, rejects = 0;
    for (size_t i = 0; i < s.count; i++) {
        rejects += ob_book_apply(book, &s.msgs[i], NULL) != OB_OK;
        const ob_trade *t;
        while ((t = ob_trades_pop(&ring)) != NULL) {
            checksum = ob_checksum_trade(checksum, t);
            trades++;
        }
    }
    size_t resting = ob_book_resting(book);
    ob_book_destroy(book);
    ob_trades_destroy(&ring);

    char path[] = "/tmp/test_orderbook_trades_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    static const ob_replay_options modes[] = {
        {.threads = 1},
        {.threads = 2},
        {.threads = 1, .pipeline = 1},
        {.threads = 2, .pipeline = 1},
        /* passes: the same figures as one, and the trade file holds the first pass's only */
        {.threads = 1, .passes = 3},
        {.threads = 2, .pipeline = 1, .passes = 2},
    };
    for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
        ob_replay_options o = modes[i];
        o.trades_path = path;
        ob_replay_result r;
        assert_int_equal(ob_replay(&s, &o, &r), 0);
        assert_int_equal(r.messages, s.count);
        assert_int_equal(r.trades, trades);
        assert_int_equal(r.rejects, rejects);
        assert_int_equal(r.resting, resting);
        assert_true(r.checksum == checksum);
        assert_true(r.messages_per_second > 0);
        assert_true(r.ns_p50 <= r.ns_p90 && r.ns_p90 <= r.ns_p99 && r.ns_p99 <= r.ns_p999 &&
                    r.ns_p999 <= r.ns_max);
        /* the trade file: one "T,..." line per trade, the same checksum */
        FILE *f = fopen(path, "r");
        assert_non_null(f);
        long long a, b, c, d;
        uint64_t lines = 0, h = OB_CHECKSUM_INIT;
        while (fscanf(f, "T,%lld,%lld,%lld,%lld\n", &a, &b, &c, &d) == 4) {
            ob_trade t = {a, b, c, d};
            h = ob_checksum_trade(h, &t);
            lines++;
        }
        assert_true(feof(f));
        fclose(f);
        assert_int_equal(lines, trades);
        assert_true(h == checksum);
    }
    unlink(path);
    ob_stream_free(&s);
}

static int have_pool(void)
{
    return dlsym(RTLD_DEFAULT, "cmalloc_pool_create") != NULL;
}

static void replay_pool(void **state)
{
    (void)state;
    /* this binary is not linked with cmalloc: the pool API is there only under
     * LD_PRELOAD=build/libcmalloc.so; without it --alloc pool is a clear error */
    ob_stream s = {0};
    generate(&s, 5000, 1, 10);
    ob_replay_options plain = {.threads = 1};
    ob_replay_result want, r;
    assert_int_equal(ob_replay(&s, &plain, &want), 0);
    static const ob_replay_options modes[] = {
        {.threads = 1, .use_pool = 1},
        {.threads = 2, .use_pool = 1},
        {.threads = 1, .pipeline = 1, .use_pool = 1},
        {.threads = 1, .pipeline = 1, .use_pool = 1, .passes = 3},
    };
    for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
        if (!have_pool()) {
            assert_int_equal(ob_replay(&s, &modes[i], &r), 2);
            continue;
        }
        assert_int_equal(ob_replay(&s, &modes[i], &r), 0);
        assert_true(r.checksum == want.checksum);
        assert_int_equal(r.trades, want.trades);
        assert_int_equal(r.resting, want.resting);
    }
    ob_stream_free(&s);
}

static void histogram_quantiles(void **state)
{
    (void)state;
    ob_histogram *h = calloc(1, sizeof(*h));
    for (uint64_t v = 1; v <= 1000; v++)
        ob_histogram_record(h, v);
    ob_histogram_record(h, 1000000);
    assert_int_equal(ob_histogram_quantile(h, 0.0), 1);
    uint64_t p50 = ob_histogram_quantile(h, 0.5), p99 = ob_histogram_quantile(h, 0.99);
    assert_true(p50 >= 480 && p50 <= 520);
    assert_true(p99 >= 960 && p99 <= 1010);
    assert_int_equal(ob_histogram_quantile(h, 1.0), 1000000);
    for (uint64_t v = 0; v < 100000; v = v * 3 / 2 + 1) { /* buckets are ordered and tight */
        unsigned bucket = ob_histogram_bucket(v);
        assert_true(bucket < OB_HISTOGRAM_BUCKETS);
        assert_true(ob_histogram_bucket(v + v / 16 + 1) > bucket);
    }
    assert_true(ob_histogram_bucket(UINT64_MAX) < OB_HISTOGRAM_BUCKETS);
    free(h);
}

/* ---- the command line (build/orderbook, when this runs from the top directory) --------- */

/* Runs a shell command; returns its exit status and puts its stderr's first line in err. */
static int run_cli(const char *command, char *err, size_t err_size)
{
    char full[1024], err_path[64];
    snprintf(err_path, sizeof(err_path), "/tmp/test_orderbook_cli_%d.err", (int)getpid());
    snprintf(full, sizeof(full), "%s 2>%s >/dev/null", command, err_path);
    int status = system(full);
    err[0] = 0;
    FILE *f = fopen(err_path, "r");
    if (f) {
        if (fgets(err, (int)err_size, f))
            err[strcspn(err, "\n")] = 0;
        fclose(f);
    }
    unlink(err_path);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void cli_exit_status(void **state)
{
    (void)state;
    if (access("build/orderbook", X_OK) != 0)
        skip(); /* run from the top directory after make build/orderbook */
    char path[] = "/tmp/test_orderbook_cli_XXXXXX", cmd[512], err[512], want[512];
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *text = "# fine so far\nA,1,B,100,10\nA,2,B,100,ten\n";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    snprintf(cmd, sizeof(cmd), "build/orderbook replay %s", path);
    assert_int_equal(run_cli(cmd, err, sizeof(err)), 2);
    snprintf(want, sizeof(want), "%s:3: expected an integer for qty, got 'ten'", path);
    assert_string_equal(err, want);
    /* a stream with rejects only: replay goes on, exit status 0 */
    fd = open(path, O_WRONLY | O_TRUNC);
    text = "C,1\nA,1,B,0,1\nR,5,1,1\n";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    assert_int_equal(run_cli(cmd, err, sizeof(err)), 0);
    snprintf(cmd, sizeof(cmd), "build/orderbook replay %s --alloc pool", path);
    if (have_pool()) { /* under LD_PRELOAD=build/libcmalloc.so, inherited by the child */
        assert_int_equal(run_cli(cmd, err, sizeof(err)), 0);
    } else {
        assert_int_equal(run_cli(cmd, err, sizeof(err)), 2);
        assert_non_null(strstr(err, "cmalloc"));
    }
    assert_int_equal(run_cli("build/orderbook replay", err, sizeof(err)), 2);
    assert_int_equal(run_cli("build/orderbook gen --seed 1", err, sizeof(err)), 2);
    assert_int_equal(run_cli("build/orderbook gen --messages 10 --seed 1", err, sizeof(err)), 0);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(priority_within_level, setup, teardown),
        cmocka_unit_test_setup_teardown(priority_across_levels, setup, teardown),
        cmocka_unit_test_setup_teardown(partial_fills, setup, teardown),
        cmocka_unit_test_setup_teardown(replace_keeps_priority, setup, teardown),
        cmocka_unit_test_setup_teardown(replace_loses_priority, setup, teardown),
        cmocka_unit_test_setup_teardown(replace_crosses, setup, teardown),
        cmocka_unit_test_setup_teardown(market_sweeps, setup, teardown),
        cmocka_unit_test_setup_teardown(rejects, setup, teardown),
        cmocka_unit_test_setup_teardown(far_prices_and_sparse_ids, setup, teardown),
        cmocka_unit_test(parser_accepts),
        cmocka_unit_test(parser_errors),
        cmocka_unit_test(parse_file_reads_and_reports),
        cmocka_unit_test(generator_is_deterministic),
        cmocka_unit_test(generated_streams_match_reference),
        cmocka_unit_test(random_far_prices_match_reference),
        cmocka_unit_test(replay_modes_agree),
        cmocka_unit_test(replay_pool),
        cmocka_unit_test(histogram_quantiles),
        cmocka_unit_test(cli_exit_status),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
