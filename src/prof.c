/* prof.c - the sampling heap profiler (CMALLOC_PROF and friends) and the sampling decision it
 * shares with guard.c (CMALLOC_GUARD_RATE). Everything here is off unless asked for.
 *
 * Where samples are taken. The inline fast paths have no test for sampling (their instruction
 * count is guarded by tests/test_fastpath_budget.sh), so every decision is made on slow paths,
 * and sampling makes sure that every object a fast path hands out has passed one first:
 *   - while sampling, a thread's lists show max_length 0, so every free fails the fast path's
 *     length test and comes to cm_sample_free (the real max_length is parked in the thread's
 *     sampler and handed back around each call into thread_cache.c, which grows and shrinks it);
 *   - so an object reaches a list only through a slow path here (a free, or a refill by the
 *     allocation slow path, cm_sample_alloc), and is charged to the thread's countdowns as it
 *     does, as if allocated already; one that leaves a list unallocated (flushed) is refunded;
 *   - fast-path pops then need no counting, and the list may hold only objects charged before
 *     the next sample point: the object on which a countdown runs out is not put on the list (a
 *     freed one goes to the central cache, a refill is cut short), and its class is marked
 *     pending, so that the class's next allocation finds its list empty, comes here, and is the
 *     sample:
 *
 *     bytes left: |----- three objects fit -----|x
 *     list after a refill  [a][b][c][d][e]  ->  [a][b][c]      [d][e] to the central cache;
 *                                                the fourth allocation is a slow one: sampled
 *
 * Two countdowns per thread: bytes to the next profile sample, drawn from an exponential
 * distribution of mean CMALLOC_PROF_RATE (the points are a Poisson process over the bytes
 * allocated, so a periodic pattern cannot line up with them), and small allocations to the next
 * guarded one (geometric, mean CMALLOC_GUARD_RATE). The price is that with either feature on
 * every free takes the slow path (README: "Profiling and debugging in production" measures it);
 * with both off nothing changes. CMALLOC_SAMPLE_EXACT=0 leaves the lists' max_length alone:
 * frees stay fast, and a block freed into a thread's cache and allocated again from it is not
 * counted (the sampler sees only what passes the central cache). Aligned allocations above 16
 * bytes (cm_alloc_aligned) bypass the sampler.
 *
 * A sampled allocation gets whole pages of its own from the page heap (a LARGE span even for a
 * small size), so its free cannot take the fast path and cm_sample_free drops it from the table.
 * It weighs 1 / (1 - e^(-charge/rate)) allocations, the inverse of its chance to be sampled, so
 * sums over the samples estimate the real heap.
 *
 * Tables, never from malloc (one block of metadata memory taken at init; fixed size, shown in
 * the stats):
 *   samples  open addressing by address, SAMPLE_SLOTS, at most SAMPLE_MAX used (more samples are
 *            counted as dropped); deletion shifts entries back, so there are no tombstones
 *   stacks   open addressing by a hash of the frames, STACK_SLOTS of up to STACK_DEPTH return
 *            addresses, never removed (guard.c keeps their ids); when full, new stacks share
 *            stack 1, which has no frames
 * Lock: prof_lock guards both tables. It is taken alone: unwinding, allocation and guard.c's
 * lock all happen outside it, so fork may take it first.
 * Output: the profile (cmalloc_prof_dump, CMALLOC_PROF_DUMP at exit, CMALLOC_PROF_SIGNAL) is
 * pprof's legacy heap-profile text followed by /proc/self/maps; the leak report
 * (CMALLOC_PROF_LEAKS) is text symbolised with dladdr. The signal handler only sets a flag; the
 * next sampling slow path writes the file. Output is formatted on the stack, written through os.c.
 */
#define _GNU_SOURCE
#include "internal.h"
#include "cmalloc.h"

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unwind.h>

#define STACK_DEPTH       32
#define STACK_SLOTS       2048                   /* a power of two */
#define SAMPLE_SLOTS      16384                  /* a power of two */
#define SAMPLE_MAX        (SAMPLE_SLOTS / 4 * 3) /* load factor bound of the open addressing */
#define LEAK_STACKS_SHOWN 20
#define LN2               0.6931471805599453

typedef struct stack_entry {
    uint64_t hash;                 /* of depth and frames; 0: an empty slot */
    uint32_t depth;                /* frames used */
    uint32_t samples_live;         /* scratch of a report: live samples with this stack */
    double alloc_count;            /* estimated allocations made from this stack so far */
    double alloc_bytes;            /* and their estimated bytes */
    double live_count;             /* scratch of a report: estimated live allocations */
    double live_bytes;             /* and their bytes */
    uintptr_t frames[STACK_DEPTH]; /* return addresses, the allocating function's first */
} stack_entry;

typedef struct sample {
    uintptr_t address; /* 0: an empty slot */
    uint32_t stack;    /* index + 1 into stacks */
    uint32_t unused;
    size_t size;   /* bytes requested */
    double weight; /* allocations this sample stands for: 1 / P(sampled) */
} sample;

/* The distance to a thread's next sample point, and the classes whose next slow allocation
 * holds a point already passed (their list was cut just before it). */
typedef struct countdown {
    int64_t left; /* units (bytes, or allocations) before the next point */
    uint64_t pending[(CM_CLASSES_MAX + 63) / 64]; /* bit per size class */
} countdown;

typedef struct sampler {
    countdown bytes;                     /* profile samples: units are bytes */
    countdown allocs;                    /* guarded allocations: units are small allocations */
    uint64_t random;                     /* xorshift state; 0 until the thread's first sampling */
    int busy;                            /* inside the sampler: allocations it causes are plain */
    cm_thread_cache *cache;              /* the thread's cache whose lists are parked, or NULL */
    uint16_t refused[CM_CLASSES_MAX];    /* frees kept off a pending class's list, in a row */
    uint32_t max_length[CM_CLASSES_MAX]; /* its lists' real max_length, while they show 0 */
} sampler;

int cm_sampling;
static int prof_on, guard_on;
static cm_lock prof_lock = CM_LOCK_INIT;
static stack_entry *stacks; /* STACK_SLOTS entries */
static sample *samples;     /* SAMPLE_SLOTS entries */
static size_t stack_count, sample_count, samples_dropped, table_bytes;
static double bytes_scale;                 /* the mean distance between profile samples, in bytes */
static uint8_t guard_unit[CM_CLASSES_MAX]; /* 1 for classes guard.c may take, else 0 */
static double allocs_scale; /* -1 / ln(1 - 1/CMALLOC_GUARD_RATE); 0 when the rate is 1 */
static uintptr_t own_text_start, own_text_end; /* libcmalloc.so's code; empty when linked in */
static volatile sig_atomic_t dump_requested;
static unsigned dump_sequence; /* read and bumped with __atomic builtins */
static CM_THREAD_LOCAL sampler thread_sampler;

/* ---- random intervals ------------------------------------------------------------------
 * Our own logarithm and exponential: libm is not a dependency of the library (the static
 * library is linked by programs that may not add -lm). */

/* ln(v) for v >= 1: v = m * 2^e with m in [1, 2), ln m = 2 atanh((m - 1) / (m + 1)). */
static double log_of(uint64_t v)
{
    int e = 63 - __builtin_clzll(v);
    double m = (double)v / (double)((uint64_t)1 << e);
    double t = (m - 1) / (m + 1), t2 = t * t, power = t, sum = 0;
    for (int k = 1; k <= 17; k += 2) {
        sum += power / k;
        power *= t2;
    }
    return e * LN2 + 2 * sum;
}

/* e^-x for x >= 0: x = n ln2 + r, e^-r by its series (r < ln 2), halved n times. */
static double exp_negative(double x)
{
    if (x > 700)
        return 0;
    int n = (int)(x / LN2);
    double r = x - n * LN2, term = 1, sum = 1;
    for (int k = 1; k <= 16; k++) {
        term *= -r / k;
        sum += term;
    }
    return n >= 63 ? 0 : sum / (double)((uint64_t)1 << n);
}

static uint64_t next_random(sampler *s)
{
    s->random ^= s->random >> 12;
    s->random ^= s->random << 25;
    s->random ^= s->random >> 27;
    return s->random * 0x2545f4914f6cdd1dull;
}

/* -ln(u) for u uniform in (0, 1]: an exponential variable of mean 1. */
static double exponential(sampler *s)
{
    uint64_t v = (next_random(s) >> 11) + 1; /* 1 .. 2^53 */
    return 53 * LN2 - log_of(v);
}

/* The next distance: exponential of mean scale (bytes), or, rounded up, geometric with mean
 * CMALLOC_GUARD_RATE (allocations: scale = -1 / ln(1 - 1/rate), 0 for every allocation). */
static int64_t draw(sampler *s, double scale)
{
    return (int64_t)(exponential(s) * scale) + 1;
}

/* ---- stacks -------------------------------------------------------------------------------- */
typedef struct unwind_state {
    uintptr_t frames[STACK_DEPTH];
    unsigned depth;
    uintptr_t boundary; /* return address of the hook: frames before it are ours */
    int kept;           /* the boundary frame was seen */
} unwind_state;

static _Unwind_Reason_Code unwind_step(struct _Unwind_Context *context, void *arg)
{
    unwind_state *state = arg;
    uintptr_t ip = _Unwind_GetIP(context);
    if (!state->kept) {
        if (ip != state->boundary)
            return _URC_NO_REASON;
        state->kept = 1;
    }
    if (ip == 0)
        return _URC_END_OF_STACK; /* the outermost frame (_start's caller) */
    if (ip - own_text_start < own_text_end - own_text_start && state->depth == 0)
        return _URC_NO_REASON; /* still inside libcmalloc.so (an entry point, calloc, ...) */
    state->frames[state->depth++] = ip;
    return state->depth == STACK_DEPTH ? _URC_END_OF_STACK : _URC_NO_REASON;
}

static int find_own_text(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    (void)arg;
    uintptr_t self = (uintptr_t)cm_prof_init;
    for (unsigned i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *segment = &info->dlpi_phdr[i];
        uintptr_t start = info->dlpi_addr + segment->p_vaddr;
        if (segment->p_type == PT_LOAD && self - start < segment->p_memsz) {
            if (info->dlpi_name[0] != '\0') { /* a shared library, not the program itself */
                own_text_start = start;
                own_text_end = start + segment->p_memsz;
            }
            return 1;
        }
    }
    return 0;
}

static uint64_t hash_frames(const uintptr_t *frames, unsigned depth)
{
    uint64_t h = 0x9e3779b97f4a7c15ull ^ depth;
    for (unsigned i = 0; i < depth; i++)
        h = (h ^ frames[i]) * 0xff51afd7ed558ccdull;
    return h | 1; /* never 0, the empty mark */
}

/* The id of the stack above the frame that returns to boundary, entered in the table. */
static uint32_t capture_stack(uintptr_t boundary)
{
    unwind_state state = {.depth = 0, .boundary = boundary, .kept = 0};
    _Unwind_Backtrace(unwind_step, &state);
    if (!state.kept) { /* the boundary frame was not found (inlined?): keep everything */
        state.kept = 1;
        state.boundary = 0;
        state.depth = 0;
        _Unwind_Backtrace(unwind_step, &state);
    }
    uint64_t hash = hash_frames(state.frames, state.depth);
    cm_lock_acquire(&prof_lock);
    size_t i = hash & (STACK_SLOTS - 1);
    uint32_t id = 1; /* the shared stack of a full table */
    for (size_t probes = 0; probes < STACK_SLOTS; probes++, i = (i + 1) & (STACK_SLOTS - 1)) {
        stack_entry *entry = &stacks[i];
        if (entry->hash == hash && entry->depth == state.depth &&
            memcmp(entry->frames, state.frames, state.depth * sizeof(uintptr_t)) == 0) {
            id = (uint32_t)i + 1;
            break;
        }
        if (entry->hash == 0) {
            if (stack_count + 1 >= STACK_SLOTS - STACK_SLOTS / 8)
                break; /* keep probe chains short: the rest share stack 1 */
            entry->hash = hash;
            entry->depth = state.depth;
            memcpy(entry->frames, state.frames, state.depth * sizeof(uintptr_t));
            stack_count++;
            id = (uint32_t)i + 1;
            break;
        }
    }
    cm_lock_release(&prof_lock);
    return id;
}

/* Appends "name+0xoff (object)" for a return address, or just the address. */
static void describe_address(cm_message *m, uintptr_t address)
{
    Dl_info info;
    cm_message_hex(m, address);
    /* address - 1: a return address may already be past the end of the calling function */
    if (dladdr((void *)(address - 1), &info) == 0)
        return;
    if (info.dli_sname != NULL) {
        cm_message_str(m, " ");
        cm_message_str(m, info.dli_sname);
        cm_message_str(m, "+");
        cm_message_hex(m, address - (uintptr_t)info.dli_saddr);
    }
    if (info.dli_fname != NULL && info.dli_fname[0] != '\0') {
        cm_message_str(m, " (");
        cm_message_str(m, info.dli_fname);
        cm_message_str(m, ")");
    }
}

/* Writes a stack's frames, one a line. dladdr does not allocate. */
void cm_prof_stack_print(uint32_t stack, int fd)
{
    cm_message m = {.length = 0};
    if (stack == 0 || stacks == NULL)
        return;
    const stack_entry *entry = &stacks[stack - 1];
    if (entry->depth == 0) {
        cm_message_str(&m, "    (no stack: the profiler's stack table is full)\n");
        cm_message_write(&m, fd);
    }
    for (unsigned i = 0; i < entry->depth; i++) {
        cm_message_str(&m, "    #");
        cm_message_uint(&m, i);
        cm_message_str(&m, " ");
        describe_address(&m, entry->frames[i]);
        cm_message_str(&m, "\n");
        cm_message_write(&m, fd);
    }
}

/* ---- the sample table ----------------------------------------------------------------------- */
static size_t sample_home(uintptr_t address)
{
    return (size_t)((address >> 4) * 0x9e3779b97f4a7c15ull >> 32) & (SAMPLE_SLOTS - 1);
}

static void record_sample(void *p, size_t size, size_t charge, uint32_t stack)
{
    double weight = 1 / (1 - exp_negative((double)charge / (double)cm_option.prof_rate));
    cm_lock_acquire(&prof_lock);
    stacks[stack - 1].alloc_count += weight;
    stacks[stack - 1].alloc_bytes += weight * (double)size;
    if (sample_count >= SAMPLE_MAX) {
        samples_dropped++;
    } else {
        size_t i = sample_home((uintptr_t)p);
        while (samples[i].address != 0)
            i = (i + 1) & (SAMPLE_SLOTS - 1);
        samples[i] =
            (sample){.address = (uintptr_t)p, .stack = stack, .size = size, .weight = weight};
        sample_count++;
    }
    cm_lock_release(&prof_lock);
}

/* Finds p's slot; the caller holds prof_lock. SAMPLE_SLOTS when p is not sampled. */
static size_t find_sample_locked(uintptr_t address)
{
    for (size_t i = sample_home(address); samples[i].address != 0; i = (i + 1) & (SAMPLE_SLOTS - 1))
        if (samples[i].address == address)
            return i;
    return SAMPLE_SLOTS;
}

static bool is_sampled(const void *p)
{
    if (!prof_on || ((uintptr_t)p & (CM_PAGE_SIZE - 1)) != 0 ||
        __atomic_load_n(&sample_count, __ATOMIC_RELAXED) == 0)
        return false;
    cm_lock_acquire(&prof_lock);
    bool found = find_sample_locked((uintptr_t)p) != SAMPLE_SLOTS;
    cm_lock_release(&prof_lock);
    return found;
}

/* Drops p's sample, if any, shifting later entries of its probe chain back into the hole. */
static void forget_sample(uintptr_t address)
{
    cm_lock_acquire(&prof_lock);
    size_t hole = find_sample_locked(address);
    if (hole != SAMPLE_SLOTS) {
        samples[hole].address = 0;
        sample_count--;
        for (size_t i = (hole + 1) & (SAMPLE_SLOTS - 1); samples[i].address != 0;
             i = (i + 1) & (SAMPLE_SLOTS - 1)) {
            size_t home = sample_home(samples[i].address);
            /* movable when its home is not in the cyclic range (hole, i] */
            if (((i - home) & (SAMPLE_SLOTS - 1)) >= ((i - hole) & (SAMPLE_SLOTS - 1))) {
                samples[hole] = samples[i];
                samples[i].address = 0;
                hole = i;
            }
        }
    }
    cm_lock_release(&prof_lock);
}

/* ---- the sampling decision ---------------------------------------------------------------- */
/* Seeds a thread's generator without a system call (thread churn pays for every one): a
 * process-wide random key, the thread's own address and a count, mixed (splitmix64). */
static void start_thread(sampler *s)
{
    static uint64_t threads_started; /* __atomic builtins, as for dump_sequence */
    uint64_t z =
        cm_list_key ^ (uintptr_t)s ^
        (__atomic_fetch_add(&threads_started, 1, __ATOMIC_RELAXED) * 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    s->random = (z ^ (z >> 31)) | 1; /* xorshift needs a state other than 0 */
    /* a countdown that is off never runs out (2^61 bytes), so the free path needs no test */
    s->bytes.left = prof_on ? draw(s, bytes_scale) : INT64_MAX / 4;
    s->allocs.left = guard_on ? draw(s, allocs_scale) : INT64_MAX / 4;
}

/* Whether a slow-path allocation of size_class (0: large) costing units holds a sample point. */
static bool countdown_due(sampler *s, countdown *c, double scale, unsigned size_class,
                          int64_t units)
{
    uint64_t bit = (uint64_t)1 << (size_class % 64);
    if (c->pending[size_class / 64] & bit) {
        c->pending[size_class / 64] &= ~bit;
        return true;
    }
    c->left -= units;
    if (c->left > 0)
        return false;
    c->left = draw(s, scale); /* memoryless: the rest of this allocation may be ignored */
    return true;
}

static void set_pending(sampler *s, countdown *c, unsigned size_class)
{
    c->pending[size_class / 64] |= (uint64_t)1 << (size_class % 64);
    s->refused[size_class] = 0;
}

/* How many of count objects of units each fit before the next point. */
static uint64_t countdown_fit(const countdown *c, uint64_t count, int64_t units)
{
    uint64_t fit = (uint64_t)(c->left - 1) / (uint64_t)units;
    return fit < count ? fit : count;
}

/* keep objects of size_class are handed to the fast path. When this countdown is what cut the
 * list (its point falls in object keep + 1), that object is the sample: the class's next slow
 * allocation, marked pending; the countdown restarts after it. */
static void countdown_commit(sampler *s, countdown *c, double scale, unsigned size_class,
                             uint64_t keep, uint64_t count, int64_t units)
{
    if (keep < count && countdown_fit(c, count, units) == keep) {
        set_pending(s, c, size_class);
        c->left = draw(s, scale);
    } else {
        c->left -= (int64_t)keep * units;
    }
}

static bool guardable(size_t charge)
{
    return guard_on && charge <= CM_GUARD_MAX_SIZE;
}

/* Flushes the list's objects past the first keep to the central cache, in whole batches. */
static void cut_list(cm_thread_cache *cache, unsigned size_class, uint32_t keep)
{
    cm_free_list *list = &cache->lists[size_class];
    uint32_t count = list->length - keep, batch = cm_classes[size_class].batch;
    void *rest = list->head;
    if (keep == 0) {
        list->head = NULL;
    } else {
        void *last = list->head;
        for (uint32_t i = 1; i < keep; i++)
            last = cm_link_next_checked(last);
        rest = cm_link_next_checked(last);
        cm_link_set(last, NULL);
    }
    list->length = keep;
    cache->size -= (size_t)count * cm_classes[size_class].size;
    while (count > 0) {
        uint32_t n = count < batch ? count : batch;
        void *head = rest, *last = head;
        for (uint32_t i = 1; i < n; i++)
            last = cm_link_next_checked(last);
        rest = cm_link_next_checked(last);
        cm_link_set(last, NULL);
        cm_central_flush(size_class, head, n);
        count -= n;
    }
}

/* Hands list size_class its real max_length back for a call into thread_cache.c. */
static void unpark(sampler *s, unsigned size_class)
{
    if (cm_option.sample_exact && s->cache != NULL && s->cache == cm_thread_cache_current)
        s->cache->lists[size_class].max_length = s->max_length[size_class];
}

/* Parks list size_class's max_length again (every list's, when the call made the cache). The
 * shared empty cache (a thread with no cache yet, or exiting) already shows 0 everywhere and is
 * never written. */
static void park(sampler *s, unsigned size_class)
{
    cm_thread_cache *cache = cm_thread_cache_current;
    if (cache->max_size == 0)
        return;
    if (!cm_option.sample_exact) { /* CMALLOC_SAMPLE_EXACT=0: lists keep their max_length */
        s->cache = cache;
        return;
    }
    unsigned first = size_class, last = size_class;
    if (cache != s->cache) {
        s->cache = cache;
        first = 1;
        last = cm_class_count - 1;
    }
    for (unsigned c = first; c <= last; c++) {
        s->max_length[c] = cache->lists[c].max_length;
        cache->lists[c].max_length = 0;
    }
}

/* Charges the bytes a call into the thread cache added to its lists, or refunds those it
 * flushed: before was cache->size at the call, not counting allocated, objects it returned. */
static void charge_bytes(sampler *s, size_t before, size_t allocated)
{
    cm_thread_cache *cache = cm_thread_cache_current;
    if (prof_on && cache == s->cache)
        s->bytes.left -= (int64_t)(cache->size + allocated) - (int64_t)before;
}

/* After a slow-path allocation of class size_class refilled its list: the objects left there
 * will be allocated by fast-path pops, so they are charged now, keeping only those before the
 * next point of either countdown. */
static void charge_list(sampler *s, unsigned size_class)
{
    cm_thread_cache *cache = cm_thread_cache_current;
    cm_free_list *list = &cache->lists[size_class];
    int64_t size = cm_classes[size_class].size;
    uint64_t count = list->length, keep = count;
    if (count == 0 || cache != s->cache)
        return;
    if (prof_on)
        keep = countdown_fit(&s->bytes, keep, size);
    if (guardable((size_t)size))
        keep = countdown_fit(&s->allocs, keep, 1);
    if (prof_on)
        countdown_commit(s, &s->bytes, bytes_scale, size_class, keep, count, size);
    if (guardable((size_t)size))
        countdown_commit(s, &s->allocs, allocs_scale, size_class, keep, count, 1);
    if (keep < count)
        cut_list(cache, size_class, (uint32_t)keep);
}

/* Frees of a pending class kept off its list before giving the point up. */
#define REFUSALS_MAX 64

/* Whether a countdown runs out on a freed object of size_class (about to be charged as a
 * future allocation), or the class already waits for its sampled allocation. */
static bool point_near(const countdown *c, unsigned size_class, int64_t units)
{
    return (c->pending[size_class / 64] >> (size_class % 64) & 1) || c->left - units <= 0;
}

/* Whether the freed object must skip the list: the countdown runs out on it (it is the point:
 * its class becomes pending), or its class waits for its sampled allocation, so the list must
 * drain. A thread that only frees a class (a consumer) never allocates the pending one: after
 * REFUSALS_MAX frees the point is given up (it fell on a block that thread would only have
 * flushed), rather than sending every free of the class to the central cache one by one. */
static bool point_on_push(sampler *s, countdown *c, double scale, unsigned size_class,
                          int64_t units)
{
    uint64_t bit = (uint64_t)1 << (size_class % 64);
    if (c->pending[size_class / 64] & bit) {
        if (++s->refused[size_class] <= REFUSALS_MAX)
            return true;
        c->pending[size_class / 64] &= ~bit;
    }
    if (c->left - units > 0) {
        c->left -= units;
        return false;
    }
    set_pending(s, c, size_class);
    c->left = draw(s, scale);
    return true;
}

/* A free of a small object (every one comes here while sampling): pushed on the thread's list
 * through thread_cache.c, and charged; or, on a sample point, handed to the central cache. */
static CM_NOINLINE bool free_small(sampler *s, void *p, unsigned size_class)
{
    if (CM_UNLIKELY(s->random == 0))
        start_thread(s);
    cm_thread_cache *cache = cm_thread_cache_current;
    cm_free_list *list = &cache->lists[size_class];
    int64_t size = cm_classes[size_class].size;
    if (cm_object_is_free(p))
        return false; /* a double free (its free mark): the ordinary path reports it */
    bool guarded_class = guardable((size_t)size);
    if (cache == s->cache) {
        if (((prof_on && point_near(&s->bytes, size_class, size)) ||
             (guarded_class && point_near(&s->allocs, size_class, 1))) &&
            list->length > 0) {
            /* first give the list's blocks back, unallocated (refunded): often the point then
             * falls further on, and the list is empty for a pending sample */
            uint32_t count = list->length;
            cut_list(cache, size_class, 0);
            if (prof_on)
                s->bytes.left += (int64_t)count * size;
            if (guarded_class)
                s->allocs.left += count;
        }
        /* charges the block when it goes on the list */
        bool skip = prof_on && point_on_push(s, &s->bytes, bytes_scale, size_class, size);
        if (guarded_class)
            skip |= point_on_push(s, &s->allocs, allocs_scale, size_class, 1);
        if (skip) {
            if (prof_on && !(s->bytes.pending[size_class / 64] >> (size_class % 64) & 1))
                s->bytes.left += size; /* charged by one countdown, but not pushed */
            if (guarded_class && !(s->allocs.pending[size_class / 64] >> (size_class % 64) & 1))
                s->allocs.left += 1;
            cm_link_set(p, NULL);
            cm_central_flush(size_class, p, 1);
            return true;
        }
        /* thread_cache.c pushes it (and may flush): charged above, refunds counted below */
        if (prof_on)
            s->bytes.left += size;
        if (guarded_class)
            s->allocs.left += 1;
    }
    size_t before = cache->size;
    uint32_t length = cache->lists[size_class].length;
    unpark(s, size_class);
    cm_thread_cache_free_slow(p, size_class);
    park(s, size_class);
    if (cache == s->cache && cache == cm_thread_cache_current) {
        charge_bytes(s, before, 0);
        if (guarded_class)
            s->allocs.left -= (int64_t)cache->lists[size_class].length - (int64_t)length;
    }
    return true;
}

/* A sampled allocation's own pages, so that freeing it comes to cm_sample_free. */
static void *alloc_own_pages(size_t size)
{
    if (size <= CM_MAX_SMALL) {
        cm_span *span =
            cm_page_heap_alloc(size ? (size + CM_PAGE_SIZE - 1) >> CM_PAGE_SHIFT : 1, 1, 0);
        if (span != NULL)
            return cm_span_start(span);
    }
    return cm_alloc_unchecked(size); /* large sizes have whole pages anyway; errno on failure */
}

static void dump_on_signal(void);

void *cm_sample_alloc(size_t size)
{
    sampler *s = &thread_sampler;
    if (s->busy)
        return cm_alloc_unchecked(size);
    if (CM_UNLIKELY(s->random == 0))
        start_thread(s);
    if (CM_UNLIKELY(dump_requested))
        dump_on_signal();
    unsigned size_class = size <= CM_MAX_SMALL ? cm_size_class(size) : 0;
    size_t charge = size_class ? cm_classes[size_class].size : size;
    bool guard_due = guardable(charge) && countdown_due(s, &s->allocs, allocs_scale, size_class, 1);
    bool prof_due =
        prof_on && countdown_due(s, &s->bytes, bytes_scale, size_class, (int64_t)charge);
    if (!guard_due && !prof_due) {
        if (size_class == 0)
            return cm_alloc_unchecked(size);
        size_t before = cm_thread_cache_current->size;
        unpark(s, size_class);
        void *p = cm_alloc_unchecked(size);
        park(s, size_class);
        /* what a scavenge inside flushed is refunded; the refill left on the list is charged */
        charge_bytes(s, before + (size_t)cm_thread_cache_current->lists[size_class].length * charge,
                     0);
        if (p != NULL)
            charge_list(s, size_class);
        return p;
    }
    s->busy = 1;
    uint32_t stack = capture_stack((uintptr_t)__builtin_return_address(0));
    void *p = guard_due ? cm_guard_alloc(size, stack) : NULL;
    if (prof_due) {
        if (p == NULL)
            p = alloc_own_pages(size);
        if (p != NULL)
            record_sample(p, size, charge, stack);
    } else if (p == NULL) {
        p = cm_alloc_unchecked(size); /* every guard slot is taken */
    }
    s->busy = 0;
    return p;
}

/* The size class of p when it is the start of an object of a SMALL span (the free fast path's
 * test), else 0. */
static unsigned small_class_of(const void *p)
{
    cm_pagemap_leaf *leaf = cm_pagemap_leaf_of(p);
    size_t index = cm_pagemap_index(p);
    unsigned size_class = leaf ? leaf->size_classes[index] : 0;
    if (size_class == 0)
        return 0;
    uint64_t offset =
        ((uint64_t)leaf->span_pages[index] << CM_PAGE_SHIFT) | ((uintptr_t)p & (CM_PAGE_SIZE - 1));
    return offset * cm_classes[size_class].divisor_magic < cm_classes[size_class].start_limit
               ? size_class
               : 0;
}

bool cm_sample_free(void *p, const char *caller)
{
    unsigned size_class = small_class_of(p);
    if (size_class != 0) {
        /* Most frees: the push the fast path would have made (its tests, against the parked
         * max_length), charged, with no sample point near. The rest: free_small. */
        sampler *s = &thread_sampler;
        cm_thread_cache *cache = cm_thread_cache_current;
        cm_free_list *list = &cache->lists[size_class];
        int64_t size = cm_classes[size_class].size, unit = guard_unit[size_class];
        uint64_t pending = s->bytes.pending[size_class / 64] | s->allocs.pending[size_class / 64];
        if (CM_LIKELY(cache == s->cache && !(pending >> (size_class % 64) & 1) &&
                      s->bytes.left > size && s->allocs.left > unit &&
                      list->length < s->max_length[size_class] &&
                      cache->size + (size_t)size <= cache->max_size && !cm_object_is_free(p) &&
                      !s->busy)) {
            cm_link_set(p, list->head);
            list->head = p;
            list->length++;
            cache->size += (size_t)size;
            s->bytes.left -= size;
            s->allocs.left -= unit;
            return true;
        }
        return !s->busy && free_small(s, p, size_class);
    }
    if (cm_guard_owns(p)) {
        sampler *s = &thread_sampler;
        uint32_t stack = 0;
        if (!s->busy) {
            s->busy = 1;
            stack = capture_stack((uintptr_t)__builtin_return_address(0));
            s->busy = 0;
        }
        if (prof_on)
            forget_sample((uintptr_t)p);
        cm_guard_free(p, caller, stack);
        return true;
    }
    if (is_sampled(p))
        forget_sample((uintptr_t)p);
    return false;
}

/* realloc while sampling: a guarded or sampled block always moves (through the sampler again);
 * a small one stays when cm_realloc would keep it, else moves with its free through
 * cm_sample_free (an ordinary move would hand it to the thread cache unseen). Says what
 * api.c's cm_realloc does: keep p, move it (*old_size: the bytes to copy), or leave it to the
 * ordinary path. */
int cm_sample_realloc(const void *p, size_t size, size_t *old_size)
{
    unsigned size_class = small_class_of(p);
    if (size_class != 0) {
        *old_size = cm_classes[size_class].size;
        return size <= *old_size && size >= *old_size / 2 ? CM_SAMPLE_KEEP : CM_SAMPLE_MOVE;
    }
    if (cm_guard_owns(p))
        *old_size = cm_guard_usable_size(p, "realloc");
    else if (is_sampled(p))
        *old_size = cm_usable_size_unchecked(p);
    else
        return CM_SAMPLE_NOT_MINE;
    return CM_SAMPLE_MOVE;
}

/* ---- output ----------------------------------------------------------------------------- */
typedef struct writer {
    int fd;
    bool failed;
    size_t length;
    char buffer[4096];
} writer;

static void put_bytes(writer *w, const char *bytes, size_t length)
{
    while (length > 0) {
        if (w->length == sizeof w->buffer) {
            w->failed |= !cm_os_write(w->fd, w->buffer, w->length);
            w->length = 0;
        }
        size_t n = sizeof w->buffer - w->length < length ? sizeof w->buffer - w->length : length;
        memcpy(w->buffer + w->length, bytes, n);
        w->length += n;
        bytes += n;
        length -= n;
    }
}

static void put(writer *w, cm_message *m)
{
    put_bytes(w, m->text, m->length);
    m->length = 0;
}

/* Adds up the live samples per stack into the stacks' scratch fields; holds prof_lock. */
static void sum_live_locked(double *count, double *bytes)
{
    *count = *bytes = 0;
    for (size_t i = 0; i < STACK_SLOTS; i++) {
        stacks[i].live_count = stacks[i].live_bytes = 0;
        stacks[i].samples_live = 0;
    }
    for (size_t i = 0; i < SAMPLE_SLOTS; i++) {
        const sample *x = &samples[i];
        if (x->address == 0)
            continue;
        stack_entry *entry = &stacks[x->stack - 1];
        entry->live_count += x->weight;
        entry->live_bytes += x->weight * (double)x->size;
        entry->samples_live++;
        *count += x->weight;
        *bytes += x->weight * (double)x->size;
    }
}

static uint64_t rounded(double x)
{
    return (uint64_t)(x + 0.5);
}

/* "<count>: <bytes> [<count>: <bytes>]", pprof's pair of in-use and allocated totals. */
static void put_counts(cm_message *m, double live_count, double live_bytes, double count,
                       double bytes)
{
    cm_message_uint(m, rounded(live_count));
    cm_message_str(m, ": ");
    cm_message_uint(m, rounded(live_bytes));
    cm_message_str(m, " [");
    cm_message_uint(m, rounded(count));
    cm_message_str(m, ": ");
    cm_message_uint(m, rounded(bytes));
    cm_message_str(m, "]");
}

static int write_profile(int fd)
{
    writer w = {.fd = fd, .failed = false, .length = 0};
    cm_message m = {.length = 0};
    double live_count, live_bytes, count = 0, bytes = 0;
    cm_lock_acquire(&prof_lock);
    sum_live_locked(&live_count, &live_bytes);
    for (size_t i = 0; i < STACK_SLOTS; i++) {
        count += stacks[i].alloc_count;
        bytes += stacks[i].alloc_bytes;
    }
    cm_message_str(&m, "heap profile: ");
    put_counts(&m, live_count, live_bytes, count, bytes);
    cm_message_str(&m, " @ heapprofile\n");
    put(&w, &m);
    for (size_t i = 0; i < STACK_SLOTS; i++) {
        const stack_entry *entry = &stacks[i];
        if (entry->hash == 0 || entry->alloc_count == 0)
            continue;
        put_counts(&m, entry->live_count, entry->live_bytes, entry->alloc_count,
                   entry->alloc_bytes);
        cm_message_str(&m, " @");
        for (unsigned f = 0; f < entry->depth; f++) {
            cm_message_str(&m, " ");
            cm_message_hex(&m, entry->frames[f]);
            if (m.length > sizeof m.text - 24)
                put(&w, &m);
        }
        cm_message_str(&m, "\n");
        put(&w, &m);
    }
    cm_lock_release(&prof_lock);
    /* The mappings let pprof find each address's object file and symbolise it. */
    cm_message_str(&m, "\nMAPPED_LIBRARIES:\n");
    put(&w, &m);
    int maps = cm_os_open("/proc/self/maps", false);
    if (maps >= 0) {
        char chunk[1024];
        size_t n;
        while ((n = cm_os_read(maps, chunk, sizeof chunk)) > 0)
            put_bytes(&w, chunk, n);
        cm_os_close(maps);
    }
    w.failed |= !cm_os_write(fd, w.buffer, w.length);
    return w.failed ? -1 : 0;
}

CM_EXPORT int cmalloc_prof_dump(const char *path)
{
    if (!prof_on) {
        errno = EINVAL; /* nothing sampled: CMALLOC_PROF is off */
        return -1;
    }
    /* Not a cancellation point (open and read are, and prof_lock is held across them): a
     * thread cancelled in the middle would leave the lock held for good. */
    int cancel_state, result = -1;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
    int fd = cm_os_open(path, true);
    if (fd >= 0) {
        thread_sampler.busy++;
        result = write_profile(fd);
        thread_sampler.busy--;
        if (!cm_os_close(fd))
            result = -1;
        if (result != 0)
            errno = EIO; /* the file is incomplete */
    }
    pthread_setcancelstate(cancel_state, NULL);
    return result;
}

static void on_dump_signal(int signal_number)
{
    (void)signal_number;
    dump_requested = 1;
}

/* <CMALLOC_PROF_DUMP or "cmalloc">.<pid>.<sequence>.heap, written by the first sampling slow path
 * after the signal. */
static void dump_on_signal(void)
{
    if (!__atomic_exchange_n(&dump_requested, 0, __ATOMIC_ACQ_REL))
        return;
    cm_message name = {.length = 0};
    cm_message_str(&name, cm_option.prof_dump ? cm_option.prof_dump : "cmalloc");
    cm_message_str(&name, ".");
    cm_message_uint(&name, (uint64_t)cm_os_process_id());
    cm_message_str(&name, ".");
    cm_message_uint(&name, __atomic_fetch_add(&dump_sequence, 1, __ATOMIC_RELAXED));
    cm_message_str(&name, ".heap");
    if (name.length >= sizeof name.text)
        return;
    name.text[name.length] = '\0';
    int saved = errno; /* inside malloc: errno comes out as it went in */
    cmalloc_prof_dump(name.text);
    errno = saved;
}

/* A signal by name (SIGUSR2, USR2) or number; 0 when not recognised. */
static int signal_number(const char *text)
{
    static const struct {
        const char *name;
        int number;
    } names[] = {
        {"USR1", SIGUSR1}, {"USR2", SIGUSR2},   {"HUP", SIGHUP},   {"PROF", SIGPROF},
        {"URG", SIGURG},   {"WINCH", SIGWINCH}, {"TTIN", SIGTTIN}, {"TTOU", SIGTTOU},
    };
    if (strncmp(text, "SIG", 3) == 0)
        text += 3;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(text, names[i].name) == 0)
            return names[i].number;
    int number = 0;
    for (; *text >= '0' && *text <= '9' && number < 1000; text++)
        number = number * 10 + (*text - '0');
    return *text == '\0' && number > 0 && number < SIGRTMAX + 1 ? number : 0;
}

static void install_dump_signal(void)
{
    int number = signal_number(cm_option.prof_signal);
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_dump_signal;
    action.sa_flags = SA_RESTART;
    sigemptyset(&action.sa_mask);
    if (number == 0 || number == SIGSEGV || number == SIGKILL || number == SIGSTOP ||
        sigaction(number, &action, NULL) != 0) {
        cm_message m = {.length = 0};
        cm_message_str(&m, "cmalloc: warning: ignoring CMALLOC_PROF_SIGNAL=");
        cm_message_str(&m, cm_option.prof_signal);
        cm_message_str(&m, " (not a signal that can be caught)\n");
        cm_message_write(&m, 2);
    }
}

/* The leak report: live samples grouped by stack, largest estimated bytes first. */
static void report_leaks(int fd)
{
    cm_message m = {.length = 0};
    double live_count, live_bytes;
    cm_lock_acquire(&prof_lock);
    sum_live_locked(&live_count, &live_bytes);
    size_t live_samples = sample_count, live_stacks = 0;
    for (size_t i = 0; i < STACK_SLOTS; i++)
        live_stacks += stacks[i].samples_live != 0;
    cm_message_str(&m, "cmalloc: leak report: about ");
    cm_message_uint(&m, rounded(live_bytes));
    cm_message_str(&m, " bytes in ");
    cm_message_uint(&m, rounded(live_count));
    cm_message_str(&m, " allocations still live at exit, from ");
    cm_message_uint(&m, live_stacks);
    cm_message_str(&m, " stacks (estimated from ");
    cm_message_uint(&m, live_samples);
    cm_message_str(&m, " samples, one per ");
    cm_message_uint(&m, cm_option.prof_rate);
    cm_message_str(&m, " bytes on average)\n");
    cm_message_write(&m, fd);
    for (unsigned shown = 0; shown < LEAK_STACKS_SHOWN; shown++) {
        stack_entry *largest = NULL;
        for (size_t i = 0; i < STACK_SLOTS; i++)
            if (stacks[i].samples_live != 0 &&
                (largest == NULL || stacks[i].live_bytes > largest->live_bytes))
                largest = &stacks[i];
        if (largest == NULL)
            break;
        cm_message_str(&m, "  about ");
        cm_message_uint(&m, rounded(largest->live_bytes));
        cm_message_str(&m, " bytes in ");
        cm_message_uint(&m, rounded(largest->live_count));
        cm_message_str(&m, " allocations (");
        cm_message_uint(&m, largest->samples_live);
        cm_message_str(&m, " samples) allocated at:\n");
        cm_message_write(&m, fd);
        largest->samples_live = 0;
        cm_prof_stack_print((uint32_t)(largest - stacks) + 1, fd);
    }
    cm_lock_release(&prof_lock);
}

void cm_prof_stats_print(int fd)
{
    cm_message m = {.length = 0};
    if (prof_on) {
        cm_lock_acquire(&prof_lock);
        cm_message_str(&m, "  profiler:          ");
        cm_message_uint(&m, table_bytes);
        cm_message_str(&m, " bytes (fixed; in metadata): ");
        cm_message_uint(&m, sample_count);
        cm_message_str(&m, " live samples of at most ");
        cm_message_uint(&m, SAMPLE_MAX);
        cm_message_str(&m, ", ");
        cm_message_uint(&m, samples_dropped);
        cm_message_str(&m, " dropped, ");
        cm_message_uint(&m, stack_count);
        cm_message_str(&m, " stacks\n");
        cm_lock_release(&prof_lock);
        cm_message_write(&m, fd);
    }
    if (guard_on) {
        size_t live, bytes = cm_guard_bytes(&live);
        cm_message_str(&m, "  guarded:           ");
        cm_message_uint(&m, live);
        cm_message_str(&m, " live, ");
        cm_message_uint(&m, bytes);
        cm_message_str(&m, " bytes resident at most, of ");
        cm_message_uint(&m, cm_option.guard_slots);
        cm_message_str(&m, " slots\n");
        cm_message_write(&m, fd);
    }
}

/* ---- set-up, fork, exit ------------------------------------------------------------------- */
static bool tables_init(void)
{
    if (stacks != NULL)
        return true;
    size_t bytes = STACK_SLOTS * sizeof(stack_entry) + SAMPLE_SLOTS * sizeof(sample);
    char *memory = cm_metadata_alloc(bytes); /* zeroed */
    if (memory == NULL)
        return false;
    stacks = (stack_entry *)memory;
    samples = (sample *)(memory + STACK_SLOTS * sizeof(stack_entry));
    stack_count = 1; /* stack 1: the shared one, no frames */
    stacks[0].hash = 1;
    table_bytes = bytes;
    dl_iterate_phdr(find_own_text, NULL);
    return true;
}

/* Called by cm_init with the options read, before any allocation is served. */
void cm_prof_init(void)
{
    if (cm_option.check)
        return; /* the debug mode wraps every block itself: no sampling beside it */
    if (cm_option.prof_leaks || cm_option.prof_dump || cm_option.prof_signal)
        cm_option.prof = 1;
    if (cm_option.prof_rate == 0)
        cm_option.prof_rate = 1;
    bytes_scale = (double)cm_option.prof_rate;
    if (cm_option.guard_rate > 1)
        allocs_scale = -1 / (log_of(cm_option.guard_rate - 1) - log_of(cm_option.guard_rate));
    prof_on = cm_option.prof && tables_init();
    guard_on = cm_option.guard_rate && tables_init() && cm_guard_init(cm_prof_stack_print);
    for (unsigned c = 1; c < cm_class_count; c++)
        guard_unit[c] = guard_on && cm_classes[c].size <= CM_GUARD_MAX_SIZE;
    if (prof_on && cm_option.prof_signal)
        install_dump_signal();
    cm_sampling = prof_on || guard_on;
}

void cm_prof_fork(int phase)
{
    cm_lock_fork(&prof_lock, phase);
    cm_guard_fork(phase);
}

__attribute__((destructor)) static void prof_at_exit(void)
{
    if (!prof_on)
        return;
    thread_sampler.busy++;
    if (cm_option.prof_dump && cmalloc_prof_dump(cm_option.prof_dump) != 0) {
        cm_message m = {.length = 0};
        cm_message_str(&m, "cmalloc: could not write the heap profile to ");
        cm_message_str(&m, cm_option.prof_dump);
        cm_message_str(&m, "\n");
        cm_message_write(&m, 2);
    }
    if (cm_option.prof_leaks)
        report_leaks(2);
    thread_sampler.busy--;
}
