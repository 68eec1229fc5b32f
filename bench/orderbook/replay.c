/* replay.c - the replay runner: books on threads, the optional pipeline, the summary.
 *
 * The stream is already parsed (ob_msg[]). Each book gets a worker; with --pipeline each book
 * gets a gateway thread too:
 *
 *   gateway: for each msg, allocate an order for A/M ──SPSC queue──> matcher: ob_book_apply,
 *            (malloc or pool)                          {msg, order}     frees filled, cancelled
 *                                                                       and unused orders
 *
 * so orders are allocated on one thread and freed on another. The queue is a bounded ring with
 * one writer and one reader: the writer owns tail, the reader owns head, each keeps a stale
 * copy of the other's index and reloads it (acquire) only when the ring looks full or empty.
 *
 * Timing: the matcher reads the cheap clock once per message; the difference between two reads
 * is that message's latency (apply plus the histogram record), recorded in a per-book
 * histogram. Trades are drained from the ring (checksummed, and written by book 0 when --trades
 * is given) between messages once 4096 have piled up, outside the timed part, and at the end.
 *
 * The pool's create and destroy are looked up with dlsym and its allocations take cmalloc.h's
 * inline paths (book.h), so the binary runs under any allocator (LD_PRELOAD); cmalloc's pool
 * is used when libcmalloc is loaded.
 */
#define _GNU_SOURCE
#include "bench_util.h" /* bench_pin_thread (--pin) */
#include "book.h"
#include "cmalloc.h"

#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DRAIN_AT     4096
#define QUEUE_SLOTS  4096 /* a power of two */
#define POOL_RESERVE 4096 /* orders a book's pool holds before it first grows */

typedef struct pool_api {
    cmalloc_pool *(*create)(size_t object_size, size_t capacity, unsigned flags);
    void (*destroy)(cmalloc_pool *pool);
} pool_api;

static pool_api pool_fns;

static int pool_lookup(void)
{
    /* cmalloc_pool_in_use came with the (size, capacity, flags) create: without it the loaded
     * cmalloc has the older two-argument create, which must not be called with three. */
    if (dlsym(RTLD_DEFAULT, "cmalloc_pool_in_use") == NULL)
        return -1;
    pool_fns.create =
        (cmalloc_pool * (*)(size_t, size_t, unsigned)) dlsym(RTLD_DEFAULT, "cmalloc_pool_create");
    pool_fns.destroy = (void (*)(cmalloc_pool *))dlsym(RTLD_DEFAULT, "cmalloc_pool_destroy");
    return pool_fns.create && pool_fns.destroy ? 0 : -1;
}

typedef struct handoff {
    const ob_msg *msg;
    ob_order *order; /* allocated by the gateway for A and M, else NULL */
} handoff;

typedef struct spsc_queue {
    _Alignas(64) _Atomic size_t tail; /* written by the gateway */
    size_t cached_head;               /* gateway's stale copy of head */
    _Alignas(64) _Atomic size_t head; /* written by the matcher */
    size_t cached_tail;               /* matcher's stale copy of tail */
    _Alignas(64) handoff slots[QUEUE_SLOTS];
} spsc_queue;

static inline void spin_pause(unsigned *spins)
{
    if (++*spins < 256) {
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
    } else {
        *spins = 0;
        sched_yield(); /* other threads share the cores: do not starve them */
    }
}

typedef struct worker {
    int index;
    const ob_stream *stream;
    const ob_replay_options *options;
    pthread_barrier_t *start;
    ob_allocator allocator;
    cmalloc_pool *pool;
    spsc_queue *queue; /* --pipeline only */
    FILE *trades_out;  /* book 0 with --trades only */
    /* results */
    ob_histogram histogram;
    uint64_t trades, checksum, resting; /* trades and checksum: of the pass under way */
    uint64_t results[OB_RESULT_COUNT];  /* of the pass under way */
    uint64_t first_trades, first_checksum, first_results[OB_RESULT_COUNT]; /* the first pass's */
    uint64_t start_ns, end_ns;
    int failed; /* the first pass that disagreed with the first one, else 0 */
} worker;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static unsigned passes_of(const ob_replay_options *options)
{
    return options->passes < 1 ? 1 : (unsigned)options->passes;
}

static void drain(worker *w, ob_trades *ring)
{
    const ob_trade *t;
    uint64_t h = w->checksum;
    while ((t = ob_trades_pop(ring)) != NULL) {
        h = ob_checksum_trade(h, t);
        w->trades++;
        if (w->trades_out)
            fprintf(w->trades_out, "T,%lld,%lld,%lld,%lld\n", (long long)t->taker,
                    (long long)t->maker, (long long)t->price, (long long)t->qty);
    }
    w->checksum = h;
}

/* Reads one byte of every page of the stream before the clock starts: on some systems (this
 * project's VMs among them) pages of a large array that realloc moved fault again on first
 * touch, which would put page faults into every 128th message's latency. */
static void touch_stream(const ob_stream *stream)
{
    const volatile uint8_t *p = (const volatile uint8_t *)stream->msgs;
    size_t bytes = stream->count * sizeof(ob_msg);
    uint8_t sink = 0;
    for (size_t i = 0; i < bytes; i += 4096)
        sink ^= p[i];
    (void)sink;
}

static void *gateway_main(void *arg)
{
    worker *w = arg;
    if (w->options->pin)
        bench_pin_thread(2 * w->index + 1);
    spsc_queue *q = w->queue;
    const ob_msg *msgs = w->stream->msgs;
    size_t n = w->stream->count, tail = 0;
    unsigned spins = 0;
    touch_stream(w->stream);
    pthread_barrier_wait(w->start);
    for (size_t k = 0, total = n * passes_of(w->options); k < total; k++) {
        size_t i = k % n;
        while (tail - q->cached_head == QUEUE_SLOTS) {
            q->cached_head = atomic_load_explicit(&q->head, memory_order_acquire);
            if (tail - q->cached_head == QUEUE_SLOTS)
                spin_pause(&spins);
        }
        handoff *h = &q->slots[tail & (QUEUE_SLOTS - 1)];
        h->msg = &msgs[i];
        h->order = NULL;
        if (msgs[i].type == OB_ADD || msgs[i].type == OB_MARKET) {
            h->order = ob_order_alloc(&w->allocator);
            if (!h->order) {
                fputs("orderbook: out of memory\n", stderr);
                abort();
            }
        }
        atomic_store_explicit(&q->tail, ++tail, memory_order_release);
    }
    return NULL;
}

/* After a pass over the stream: the first pass's figures are the book's (and only its trades
 * go to the trade file); every later one must repeat them exactly, as it replays the same
 * stream into a fresh book, and starts its own count. */
static void pass_done(worker *w, unsigned pass, uint64_t resting)
{
    if (pass == 0) {
        w->resting = resting;
        memcpy(w->first_results, w->results, sizeof(w->results));
        w->first_trades = w->trades;
        w->first_checksum = w->checksum;
        w->trades_out = NULL;
    } else if (w->trades != w->first_trades || w->checksum != w->first_checksum ||
               resting != w->resting ||
               memcmp(w->results, w->first_results, sizeof(w->results)) != 0) {
        w->failed = (int)pass;
    }
    memset(w->results, 0, sizeof(w->results));
    w->trades = 0;
    w->checksum = OB_CHECKSUM_INIT;
}

/* After each message: records its latency (since t0), drains the trade ring off the clock
 * when it fills, and returns the start time of the next message. */
static inline uint64_t message_done(worker *w, ob_trades *ring, ob_histogram *hist, uint64_t t0)
{
    uint64_t t1 = ob_clock_ticks();
    ob_histogram_record(hist, t1 - t0);
    if (__builtin_expect(ob_trades_count(ring) >= DRAIN_AT, 0)) {
        drain(w, ring);
        t1 = ob_clock_ticks();
    }
    return t1;
}

static void *matcher_main(void *arg)
{
    worker *w = arg;
    if (w->options->pin)
        bench_pin_thread(2 * w->index);
    ob_trades ring;
    ob_trades_init(&ring, 2 * DRAIN_AT);
    ob_book *book = ob_book_create(&ring, &w->allocator);
    if (!book) {
        fputs("orderbook: out of memory\n", stderr);
        abort();
    }
    const ob_msg *msgs = w->stream->msgs;
    size_t n = w->stream->count;
    spsc_queue *q = w->queue;
    ob_histogram *hist = &w->histogram;
    uint64_t *results = w->results;

    touch_stream(w->stream);
    pthread_barrier_wait(w->start);
    w->start_ns = now_ns();
    const unsigned passes = passes_of(w->options);
    size_t head = 0;
    unsigned spins = 0;
    for (unsigned pass = 0; pass < passes; pass++) {
        if (pass > 0) { /* a fresh book; the last one's resting orders are freed on the clock */
            ob_book_destroy(book);
            if (!(book = ob_book_create(&ring, &w->allocator))) {
                fputs("orderbook: out of memory\n", stderr);
                abort();
            }
        }
        uint64_t t0 = ob_clock_ticks();
        if (!q) {
            for (size_t i = 0; i < n; i++) {
                results[ob_book_apply(book, &msgs[i], NULL)]++;
                t0 = message_done(w, &ring, hist, t0);
            }
        } else {
            for (size_t i = 0; i < n; i++) {
                if (head == q->cached_tail) {
                    while ((q->cached_tail =
                                atomic_load_explicit(&q->tail, memory_order_acquire)) == head)
                        spin_pause(&spins);
                    t0 = ob_clock_ticks(); /* waiting is not the message's latency */
                }
                handoff h = q->slots[head & (QUEUE_SLOTS - 1)];
                atomic_store_explicit(&q->head, ++head, memory_order_release);
                results[ob_book_apply(book, h.msg, h.order)]++;
                t0 = message_done(w, &ring, hist, t0);
            }
        }
        drain(w, &ring);
        pass_done(w, pass, ob_book_resting(book));
    }
    w->end_ns = now_ns();
    ob_book_destroy(book);
    ob_trades_destroy(&ring);
    return NULL;
}

int ob_replay(const ob_stream *stream, const ob_replay_options *options, ob_replay_result *result)
{
    int books = options->threads < 1 ? 1 : options->threads;
    int per_book = options->pipeline ? 2 : 1;
    memset(result, 0, sizeof(*result));
    if (options->use_pool && pool_lookup()) {
        fputs("orderbook: --alloc pool needs cmalloc's pool API (cmalloc_pool_create ...), which "
              "is not loaded: run with LD_PRELOAD=build/libcmalloc.so\n",
              stderr);
        return 2;
    }
    FILE *trades_out = NULL;
    if (options->trades_path) {
        trades_out =
            strcmp(options->trades_path, "-") == 0 ? stdout : fopen(options->trades_path, "w");
        if (!trades_out) {
            perror(options->trades_path);
            return 2;
        }
    }
    ob_clock_ns_per_tick(); /* calibrate before the workers start */

    worker *workers = calloc((size_t)books, sizeof(worker));
    pthread_t *threads = calloc((size_t)(books * per_book), sizeof(pthread_t));
    pthread_barrier_t start;
    if (!workers || !threads) {
        fputs("orderbook: out of memory\n", stderr);
        return 2;
    }
    pthread_barrier_init(&start, NULL, (unsigned)(books * per_book));
    int status = 0;
    for (int b = 0; b < books; b++) {
        worker *w = &workers[b];
        w->index = b;
        w->stream = stream;
        w->options = options;
        w->start = &start;
        w->checksum = OB_CHECKSUM_INIT;
        w->trades_out = b == 0 ? trades_out : NULL;
        if (options->use_pool) {
            /* a growing pool: a book's resting orders have no fixed bound */
            w->pool = pool_fns.create(sizeof(ob_order), POOL_RESERVE,
                                      CMALLOC_POOL_GROW |
                                          (options->pipeline ? CMALLOC_POOL_THREAD_SAFE : 0));
            if (!w->pool) {
                perror("orderbook: cmalloc_pool_create");
                return 2;
            }
            w->allocator.pool = w->pool;
        }
        if (options->pipeline) {
            if (posix_memalign((void **)&w->queue, 64, sizeof(spsc_queue))) {
                fputs("orderbook: out of memory\n", stderr);
                return 2;
            }
            memset(w->queue, 0, sizeof(spsc_queue));
        }
    }
    for (int b = 0; b < books; b++) {
        worker *w = &workers[b];
        if (pthread_create(&threads[b * per_book], NULL, matcher_main, w) ||
            (options->pipeline &&
             pthread_create(&threads[b * per_book + 1], NULL, gateway_main, w))) {
            fputs("orderbook: cannot start threads\n", stderr);
            exit(2);
        }
    }
    for (int t = 0; t < books * per_book; t++)
        pthread_join(threads[t], NULL);
    pthread_barrier_destroy(&start);

    ob_histogram *all = calloc(1, sizeof(ob_histogram));
    uint64_t first = UINT64_MAX, last = 0;
    for (int b = 0; b < books; b++) {
        worker *w = &workers[b];
        if (w->failed) {
            fprintf(stderr, "orderbook: book %d: pass %d disagrees with its first pass\n", b,
                    w->failed + 1);
            status = 2;
        } else if (w->first_checksum != workers[0].first_checksum ||
                   w->first_trades != workers[0].first_trades || w->resting != workers[0].resting) {
            fprintf(stderr, "orderbook: book %d disagrees with book 0\n", b);
            status = 2;
        }
        ob_histogram_merge(all, &w->histogram);
        first = w->start_ns < first ? w->start_ns : first;
        last = w->end_ns > last ? w->end_ns : last;
        if (w->pool)
            pool_fns.destroy(w->pool);
        free(w->queue);
    }
    worker *w0 = &workers[0];
    result->messages = stream->count;
    result->trades = w0->first_trades;
    result->resting = w0->resting;
    result->checksum = w0->first_checksum;
    for (int r = 0; r < OB_RESULT_COUNT; r++) {
        result->rejects_by_reason[r] = w0->first_results[r];
        if (r != OB_OK)
            result->rejects += w0->first_results[r];
    }
    result->seconds = (double)(last - first) / 1e9;
    result->messages_per_second =
        result->seconds > 0 ? (double)stream->count * books * passes_of(options) / result->seconds
                            : 0;
    double k = ob_clock_ns_per_tick();
    result->ns_p50 = (double)ob_histogram_quantile(all, 0.50) * k;
    result->ns_p90 = (double)ob_histogram_quantile(all, 0.90) * k;
    result->ns_p99 = (double)ob_histogram_quantile(all, 0.99) * k;
    result->ns_p999 = (double)ob_histogram_quantile(all, 0.999) * k;
    result->ns_max = (double)all->max * k;
    free(all);
    free(workers);
    free(threads);
    if (trades_out && trades_out != stdout && fclose(trades_out)) {
        perror(options->trades_path);
        status = 2;
    } else if (trades_out == stdout) {
        fflush(stdout);
    }
    return status;
}

void ob_replay_print(FILE *out, const ob_replay_options *options, const ob_replay_result *r)
{
    fprintf(out, "messages: %llu\n", (unsigned long long)r->messages);
    fprintf(out, "trades: %llu\n", (unsigned long long)r->trades);
    fprintf(out, "rejects: %llu\n", (unsigned long long)r->rejects);
    for (int i = 1; i < OB_RESULT_COUNT; i++)
        fprintf(out, "rejects_%s: %llu\n", ob_result_name(i),
                (unsigned long long)r->rejects_by_reason[i]);
    fprintf(out, "resting: %llu\n", (unsigned long long)r->resting);
    fprintf(out, "threads: %d\n", options->threads < 1 ? 1 : options->threads);
    fprintf(out, "pipeline: %d\n", options->pipeline ? 1 : 0);
    fprintf(out, "alloc: %s\n", options->use_pool ? "pool" : "malloc");
    fprintf(out, "passes: %u\n", passes_of(options));
    fprintf(out, "seconds: %.6f\n", r->seconds);
    fprintf(out, "messages_per_second: %.0f\n", r->messages_per_second);
    fprintf(out, "latency_p50_ns: %.0f\n", r->ns_p50);
    fprintf(out, "latency_p90_ns: %.0f\n", r->ns_p90);
    fprintf(out, "latency_p99_ns: %.0f\n", r->ns_p99);
    fprintf(out, "latency_p999_ns: %.0f\n", r->ns_p999);
    fprintf(out, "latency_max_ns: %.0f\n", r->ns_max);
    fprintf(out, "checksum: %016llx\n", (unsigned long long)r->checksum);
}
