/* check.c - the debug mode, CMALLOC_CHECK=1: every allocation gets a header and a canary, freed
 * memory is filled with a pattern and held in a quarantine before reuse.
 *
 *   raw object (any class or span):
 *   | link 8 | state 8 | requested 8 | stack 4 | family 4 | user data: requested bytes | canary |
 *   ^ raw                                       ^ pointer handed out (raw + 32, 16-aligned)
 *   an aligned request (alignment A above 16 bytes; the object aligned to A, of A + request + 1
 *   bytes at least):
 *   | A - 32 bytes | pad 8 | state 8 | requested 8 | stack 4 | family 4 | user data | canary |
 *   ^ the object's start                                     ^ pointer handed out (+ A)
 *   Either way the header is the 32 bytes before the pointer; its first word, the link of the
 *   allocator's free list once the object is released, holds pad (the bytes before the
 *   header: 0, or A - 32) while the block is the program's or in the quarantine.
 *
 *   state       keyed by the header's address: ALLOCATED or FREED (a random key, so program
 *               data is never mistaken for it)
 *   canary      every byte after the user data to the end of the raw object (>= 1 byte),
 *               checked at free: a write past the request is reported as an overflow
 *   freed data  filled with FREE_FILL; objects wait in a FIFO quarantine (CM_QUARANTINE_OBJECTS,
 *               CM_QUARANTINE_BYTES) and are checked for writes as they leave it to be reused
 *
 *   family      the calls that made it (malloc's, new or new[]: internal.h's cm_family), whose
 *               free must release it
 *   stack       where it was allocated: an id in prof.c's stack table (handed down at init),
 *               unwound (libunwind) at every allocation: 2,098 instructions an allocation of
 *               1000 bytes instead of 614 (callgrind's count of tests/data/prof_reports.c
 *               `work 30000` less `work 10000`, over 20,000, CMALLOC_CHECK=1, LD_PRELOAD)
 *
 * Reports: overflow, double free (any second free while the object is still in quarantine or
 * not yet reused), write after free, a free of another family's block (free of new's, delete
 * of new[]'s...) or of another size than requested (a sized free); each line is followed
 * (error.c's report details) by the stack of the call that found it and the block's allocation
 * stack. At exit the blocks still quarantined are checked once, so a write to one is reported
 * even though it never left.
 * Thread caches are bypassed (thread_cache.c gives no cache in this mode), so every call takes
 * the slow paths; the cost is several times the normal one.
 * Lock: quarantine_lock, taken alone (the frees it makes happen after releasing it).
 */
#include "internal.h"

#include <string.h>

#define HEADER    32
#define NEW_FILL  0xa5
#define FREE_FILL 0xdf
#define CANARY    0xca

typedef struct check_header {
    uintptr_t pad;   /* the object's bytes before the header; its free-list link once released */
    uintptr_t state; /* state_word(ALLOCATED / FREED, raw) */
    size_t requested;
    uint32_t stack;  /* where it was allocated: an id in prof.c's stack table, 0: none */
    uint32_t family; /* cm_family: the calls that made it */
} check_header;

enum { ALLOCATED = 0x11, FREED = 0x22 };

static cm_lock quarantine_lock = CM_LOCK_INIT;
static check_header *quarantine[CM_QUARANTINE_OBJECTS]; /* FIFO ring */
static size_t quarantine_head, quarantine_count, quarantine_bytes;
static cm_latest_free latest_frees[CM_LATEST_FREES]; /* each thread's latest free */

static uintptr_t state_word(unsigned state, const void *raw)
{
    return ((uintptr_t)raw * 0x9e3779b97f4a7c15ull) ^ cm_list_key ^ state;
}

/* prof.c's, handed over by cm_check_init (NULL when its stack table could not be made). */
static cm_stack_capture capture_stack;
static cm_stack_printer print_stack;
static cm_caller_printer print_caller;
/* What the report this thread is making is about: the block (its allocation stack), and the
 * return address inside cmalloc above which the call that found the error begins (0: none,
 * the walk at exit). error.c prints them after the report's line (report_details). */
static CM_THREAD_LOCAL const check_header *reported_block;
static CM_THREAD_LOCAL uintptr_t reported_boundary;
static CM_THREAD_LOCAL bool in_capture; /* an allocation the unwinder makes is not unwound */

static void report_details(void)
{
    cm_message m = {.length = 0};
    if (reported_boundary != 0) {
        cm_message_str(&m, "  found by the call at:\n");
        cm_message_write(&m, 2);
        print_caller(reported_boundary, 2);
    }
    if (reported_block != NULL && reported_block->stack != 0) {
        cm_message_str(&m, "  allocated at:\n");
        cm_message_write(&m, 2);
        print_stack(reported_block->stack, 2);
    }
}

void cm_check_init(cm_stack_capture capture, cm_stack_printer print, cm_caller_printer caller)
{
    capture_stack = capture;
    print_stack = print;
    print_caller = caller;
    cm_report_set_details(report_details);
}

/* Reports about raw (or NULL) go through here: the details printed after the line are its. */
static void about(const check_header *raw, uintptr_t boundary)
{
    reported_block = raw;
    reported_boundary = print_caller != NULL ? boundary : 0;
}

static CM_COLD void report(const char *what, const void *p, size_t detail, const char *unit)
{
    cm_message m = {.length = 0};
    cm_message_str(&m, "cmalloc: ");
    cm_message_str(&m, what);
    cm_message_str(&m, " ");
    cm_message_hex(&m, (uintptr_t)p);
    cm_message_str(&m, " (");
    cm_message_uint(&m, detail);
    cm_message_str(&m, unit);
    cm_message_str(&m, ")");
    cm_report_finish(&m);
}

/* The start of the object that holds raw's block, which the allocator beneath handed out. */
static void *object_of(const check_header *raw)
{
    return (char *)raw - raw->pad;
}

/* The bytes from raw's header to the end of its object. The object is the debug mode's, from
 * the allocator beneath: never a bad pointer, so the caller named for a report is never
 * printed. */
static size_t raw_size(const check_header *raw)
{
    return cm_usable_size_unchecked(object_of(raw), "free") - raw->pad;
}

/* Makes the block of size bytes whose header starts pad bytes into object. */
static void *make_block(void *object, size_t pad, size_t size, cm_family family, uintptr_t caller)
{
    check_header *raw = (check_header *)((char *)object + pad);
    raw->pad = pad;
    raw->state = state_word(ALLOCATED, raw);
    raw->requested = size;
    raw->family = family;
    raw->stack = 0;
    if (capture_stack != NULL && !in_capture) {
        in_capture = true;
        raw->stack = capture_stack(caller);
        in_capture = false;
    }
    unsigned char *user = (unsigned char *)raw + HEADER;
    memset(user, NEW_FILL, size);
    memset(user + size, CANARY, raw_size(raw) - HEADER - size);
    return user;
}

void *cm_check_alloc(size_t size, cm_family family)
{
    if (size > CM_REQUEST_MAX)
        return NULL;
    size += size == 0; /* malloc(0) has one usable byte, as programs expect a positive size */
    void *object = cm_alloc_unchecked(size + HEADER + 1);
    return object ? make_block(object, 0, size, family, (uintptr_t)__builtin_return_address(0))
                  : NULL;
}

/* alignment: a power of two above CM_ALIGNMENT (so at least HEADER): the object is aligned to
 * it and the block starts alignment bytes in, its header just before. */
void *cm_check_alloc_aligned(size_t alignment, size_t size, cm_family family)
{
    if (alignment >= CM_REQUEST_MAX || size >= CM_REQUEST_MAX - alignment)
        return NULL;
    size += size == 0;
    void *object = cm_alloc_aligned_unchecked(alignment, alignment + size + 1);
    return object ? make_block(object, alignment - HEADER, size, family,
                               (uintptr_t)__builtin_return_address(0))
                  : NULL;
}

/* raw, if it heads a checked block pad bytes into its object. */
static check_header *block_at(check_header *raw, size_t pad)
{
    return raw->pad == pad && (raw->state == state_word(ALLOCATED, raw) ||
                               raw->state == state_word(FREED, raw))
               ? raw
               : NULL;
}

/* The checked allocation that p was handed out as, or NULL when p is not one. A checked
 * pointer is never an object start (its object holds a header before it); an unchecked one
 * always is, and the object before it must not be mistaken for its header. A header is read
 * only inside an object that reaches past it: an aligned block's object starts A bytes before
 * the pointer, A a power of two the pointer has (the pages in between may be a large span's
 * inner pages, which the pagemap does not name), so those are tried from 64 up. */
static check_header *header_of(const void *p)
{
    check_header *raw = (check_header *)((uintptr_t)p - HEADER);
    if ((uintptr_t)p < HEADER || cm_is_object_start(p))
        return NULL;
    if (cm_is_object_start(raw))
        return block_at(raw, 0);
    for (uintptr_t a = 2 * HEADER; a != 0 && a <= (uintptr_t)p && ((uintptr_t)p & (a - 1)) == 0;
         a <<= 1) {
        const char *object = (const char *)p - a;
        check_header *found;
        if (cm_is_object_start(object) && cm_usable_size_unchecked(object, "free") > a &&
            (found = block_at(raw, a - HEADER)) != NULL)
            return found;
    }
    return NULL;
}

/* Where the first byte written since raw was freed is, or SIZE_MAX when none was. */
static size_t first_written(const check_header *raw)
{
    const unsigned char *data = (const unsigned char *)raw + HEADER;
    size_t length = raw_size(raw) - HEADER;
    for (size_t i = 0; i < length; i++)
        if (data[i] != FREE_FILL)
            return i;
    return SIZE_MAX;
}

static CM_COLD void report_write_after_free(const check_header *raw, size_t offset,
                                            uintptr_t boundary)
{
    about(raw, boundary);
    report(boundary != 0 ? "write to freed memory at"
                         : "write to freed memory (found at exit, still quarantined) at",
           (const unsigned char *)raw + HEADER, offset, " bytes into the freed block");
}

/* Really frees an object leaving quarantine, after checking nobody wrote to it. */
static void release_from_quarantine(check_header *raw, uintptr_t boundary)
{
    size_t offset = first_written(raw);
    if (offset != SIZE_MAX) {
        report_write_after_free(raw, offset, boundary);
        return; /* leaked: its memory is suspect */
    }
    cm_free_unchecked(object_of(raw), "free");
}

/* Whether nothing was written past the request; reports the overflow when something was. */
static bool canary_intact(const check_header *raw, const void *p, uintptr_t boundary)
{
    const unsigned char *canary = (const unsigned char *)p + raw->requested;
    size_t canary_length = raw_size(raw) - HEADER - raw->requested;
    for (size_t i = 0; i < canary_length; i++) {
        if (canary[i] != CANARY) {
            about(raw, boundary);
            report("heap buffer overflow past the block at", p, raw->requested, " bytes requested");
            return false;
        }
    }
    return true;
}

/* realloc to a size within the usable size keeps the block, as in the normal mode: the request
 * shrinks and the canary grows over the rest. False when p is not a live checked block or
 * size is larger (the caller moves it). */
bool cm_check_shrink(void *p, size_t size)
{
    check_header *raw = header_of(p);
    if (raw == NULL || raw->state != state_word(ALLOCATED, raw) || size > raw->requested)
        return false;
    if (canary_intact(raw, p, (uintptr_t)__builtin_return_address(0))) {
        size += size == 0;
        raw->requested = size;
        memset((unsigned char *)p + size, CANARY, raw_size(raw) - HEADER - size);
    }
    return true;
}

/* A free of a block already freed: reported, unless a forked child frees again the block a
 * thread the fork left behind had just freed (thread_cache.c's cm_latest_free_take). */
static void second_free(const check_header *raw, const void *p, const char *caller,
                        uintptr_t boundary)
{
    cm_lock_acquire(&quarantine_lock);
    bool first_in_child = cm_latest_free_take(latest_frees, raw);
    cm_lock_release(&quarantine_lock);
    if (!first_in_child) {
        about(raw, boundary);
        cm_report_double_free(caller, p);
    }
}

static const char *const family_names[] = {"malloc", "operator new", "operator new[]"};

/* A free by another family's call than the block's (free of new's block, delete of new[]'s). */
static CM_COLD void report_other_family(const check_header *raw, const void *p, const char *caller,
                                        uintptr_t boundary)
{
    about(raw, boundary);
    cm_message m = {.length = 0};
    cm_message_call(&m, caller, p);
    cm_message_str(&m, " was allocated by ");
    cm_message_str(&m, family_names[raw->family]);
    cm_report_finish(&m);
}

/* size: what a sized free was told (CM_UNSIZED: nothing), checked against the request (that
 * of malloc(0) is 1), and family: the calls the free is of, against the block's. A block freed
 * by another family or with another size is reported and leaked, as a bad pointer is: a sized
 * delete through a base class without a virtual destructor, say, or free of a new[]'s block.
 * A delete may free a block from malloc: C++'s delete must free what a program's own operator
 * new returns, and such a new may take its memory from malloc. */
bool cm_check_free(void *p, size_t size, cm_family family, const char *caller)
{
    check_header *raw = header_of(p);
    if (raw == NULL)
        return false;
    uintptr_t boundary = (uintptr_t)__builtin_return_address(0);
    if (raw->state != state_word(ALLOCATED, raw)) {
        second_free(raw, p, caller, boundary);
        return true;
    }
    if (family != (cm_family)raw->family && raw->family != CM_BY_MALLOC) {
        report_other_family(raw, p, caller, boundary);
        return true;
    }
    if (size != CM_UNSIZED && size + (size == 0) != raw->requested) {
        about(raw, boundary);
        cm_report_sized_free(caller, p, 1, size, raw->requested, true);
        return true;
    }
    if (!canary_intact(raw, p, boundary))
        return true;
    /* Room first, then the block: the blocks leaving the quarantine go back to the allocator,
     * which may wait on a lock, and a free that fork's prepare handler catches waiting must
     * leave its block allocated in the child (thread_cache.c's free says why). So the block is
     * marked freed, its canary filled over (the child's free checks it) and queued under the
     * lock, in a round that releases nothing; its user data may be filled before. */
    size_t bytes = raw_size(raw);
    memset(p, FREE_FILL, raw->requested);
    for (;;) {
        check_header *evicted[8];
        size_t evicted_count = 0;
        bool twice = false;
        cm_lock_acquire(&quarantine_lock);
        while (evicted_count < 8 && quarantine_count > 0 &&
               (quarantine_count == CM_QUARANTINE_OBJECTS ||
                quarantine_bytes + bytes > CM_QUARANTINE_BYTES)) {
            evicted[evicted_count++] = quarantine[quarantine_head];
            quarantine_head = (quarantine_head + 1) % CM_QUARANTINE_OBJECTS;
            quarantine_count--;
            quarantine_bytes -= raw_size(evicted[evicted_count - 1]);
        }
        bool queued = evicted_count == 0;
        if (queued) {
            twice = raw->state != state_word(ALLOCATED, raw); /* another thread's free won */
            if (!twice) {
                raw->state = state_word(FREED, raw);
                memset((char *)p + raw->requested, FREE_FILL, bytes - HEADER - raw->requested);
                quarantine[(quarantine_head + quarantine_count) % CM_QUARANTINE_OBJECTS] = raw;
                quarantine_count++;
                quarantine_bytes += bytes;
                cm_latest_free_note(latest_frees, raw);
            }
        }
        cm_lock_release(&quarantine_lock);
        for (size_t i = 0; i < evicted_count; i++)
            release_from_quarantine(evicted[i], boundary);
        if (twice)
            second_free(raw, p, caller, boundary);
        if (queued)
            return true;
    }
}

/* Bytes of freed blocks waiting in the quarantine: freed by the program, not yet reusable. */
size_t cm_check_quarantined_bytes(void)
{
    cm_lock_acquire(&quarantine_lock);
    size_t bytes = quarantine_bytes;
    cm_lock_release(&quarantine_lock);
    return bytes;
}

bool cm_check_usable_size(const void *p, size_t *size)
{
    check_header *raw = header_of(p);
    if (raw == NULL)
        return false;
    *size = raw->requested;
    return true;
}

void cm_check_fork(int phase)
{
    cm_lock_fork(&quarantine_lock, phase);
    if (phase == CM_FORK_CHILD)
        cm_latest_free_fork_child(latest_frees);
}

/* At exit, the blocks still in the quarantine are checked once, so that a write to freed memory
 * is reported even when the program ends before the block would have left it. The first one
 * found is reported (and aborts, as any report does); the lock is released before. */
__attribute__((destructor(CM_EXIT_CHECK))) static void check_quarantine_at_exit(void)
{
    if (!cm_option.check)
        return;
    const check_header *written = NULL;
    size_t offset = SIZE_MAX;
    cm_lock_acquire(&quarantine_lock);
    for (size_t i = 0; i < quarantine_count && written == NULL; i++) {
        const check_header *raw = quarantine[(quarantine_head + i) % CM_QUARANTINE_OBJECTS];
        offset = first_written(raw);
        if (offset != SIZE_MAX)
            written = raw;
    }
    cm_lock_release(&quarantine_lock);
    if (written != NULL)
        report_write_after_free(written, offset, 0);
}
