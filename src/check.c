/* check.c - the debug mode, CMALLOC_CHECK=1: every allocation gets a header and a canary, freed
 * memory is filled with a pattern and held in a quarantine before reuse.
 *
 *   raw object (any class or span):
 *   | link 8 | state 8 | requested 8 | unused 8 | user data: requested bytes | canary ... |
 *   ^ raw                                       ^ pointer handed out (raw + 32, 16-aligned)
 *
 *   state       keyed by address: ALLOCATED or FREED (a random key, so program data is never
 *               mistaken for it)
 *   canary      every byte after the user data to the end of the raw object (>= 1 byte),
 *               checked at free: a write past the request is reported as an overflow
 *   freed data  filled with FREE_FILL; objects wait in a FIFO quarantine (CM_QUARANTINE_OBJECTS,
 *               CM_QUARANTINE_BYTES) and are checked for writes as they leave it to be reused
 *
 * Reports: overflow, double free (any second free while the object is still in quarantine or
 * not yet reused), write after free. Thread caches are bypassed (thread_cache.c gives no cache
 * in this mode), so every call takes the slow paths; the cost is several times the normal one.
 * Aligned requests above 16 bytes are served unchecked (no header): their pointers are object
 * starts, which free tells apart from checked pointers.
 * Lock: quarantine_lock, taken alone (the frees it makes happen after releasing it).
 */
#include "internal.h"

#include <string.h>

#define HEADER    32
#define NEW_FILL  0xa5
#define FREE_FILL 0xdf
#define CANARY    0xca

typedef struct check_header {
    uintptr_t link;  /* the free-list link while free */
    uintptr_t state; /* state_word(ALLOCATED / FREED, raw) */
    size_t requested;
    size_t unused;
} check_header;

enum { ALLOCATED = 0x11, FREED = 0x22 };

static cm_lock quarantine_lock = CM_LOCK_INIT;
static check_header *quarantine[CM_QUARANTINE_OBJECTS]; /* FIFO ring */
static size_t quarantine_head, quarantine_count, quarantine_bytes;

static uintptr_t state_word(unsigned state, const void *raw)
{
    return ((uintptr_t)raw * 0x9e3779b97f4a7c15ull) ^ cm_list_key ^ state;
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

static size_t raw_size(const check_header *raw)
{
    return cm_usable_size_unchecked(raw);
}

void *cm_check_alloc(size_t size)
{
    if (size > CM_REQUEST_MAX)
        return NULL;
    size += size == 0; /* malloc(0) has one usable byte, as programs expect a positive size */
    check_header *raw = cm_alloc_unchecked(size + HEADER + 1);
    if (raw == NULL)
        return NULL;
    raw->state = state_word(ALLOCATED, raw);
    raw->requested = size;
    unsigned char *user = (unsigned char *)raw + HEADER;
    memset(user, NEW_FILL, size);
    memset(user + size, CANARY, raw_size(raw) - HEADER - size);
    return user;
}

/* The checked allocation that p was handed out as, or NULL when p is not one. */
static check_header *header_of(const void *p)
{
    /* A checked pointer is never an object start (raw objects are > HEADER bytes); an
     * unchecked one always is, and the object before it must not be mistaken for its header. */
    check_header *raw = (check_header *)((uintptr_t)p - HEADER);
    if ((uintptr_t)p < HEADER || cm_is_object_start(p) || !cm_is_object_start(raw))
        return NULL;
    return raw->state == state_word(ALLOCATED, raw) || raw->state == state_word(FREED, raw) ? raw
                                                                                            : NULL;
}

/* Really frees an object leaving quarantine, after checking nobody wrote to it. */
static void release_from_quarantine(check_header *raw)
{
    const unsigned char *data = (const unsigned char *)raw + HEADER;
    size_t length = raw_size(raw) - HEADER;
    for (size_t i = 0; i < length; i++) {
        if (data[i] != FREE_FILL) {
            report("write to freed memory at", data, i, " bytes into the freed block");
            return; /* leaked: its memory is suspect */
        }
    }
    cm_free_unchecked(raw, "free");
}

/* Whether nothing was written past the request; reports the overflow when something was. */
static bool canary_intact(const check_header *raw, const void *p)
{
    const unsigned char *canary = (const unsigned char *)p + raw->requested;
    size_t canary_length = raw_size(raw) - HEADER - raw->requested;
    for (size_t i = 0; i < canary_length; i++) {
        if (canary[i] != CANARY) {
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
    if (canary_intact(raw, p)) {
        size += size == 0;
        raw->requested = size;
        memset((unsigned char *)p + size, CANARY, raw_size(raw) - HEADER - size);
    }
    return true;
}

bool cm_check_free(void *p, const char *caller)
{
    check_header *raw = header_of(p);
    if (raw == NULL)
        return false;
    if (raw->state != state_word(ALLOCATED, raw)) {
        cm_report_double_free(caller, p);
        return true;
    }
    if (!canary_intact(raw, p))
        return true;
    /* Room first, then the block: the blocks leaving the quarantine go back to the allocator,
     * which may wait on a lock, and a free that fork's prepare handler catches waiting must
     * leave its block allocated in the child (thread_cache.c's free says why). So the block is
     * marked freed, its canary filled over (the child's free checks it) and queued under the
     * lock, in a round that releases nothing; its user data may be filled before. */
    size_t size = raw_size(raw);
    memset(p, FREE_FILL, raw->requested);
    for (;;) {
        check_header *evicted[8];
        size_t evicted_count = 0;
        bool twice = false;
        cm_lock_acquire(&quarantine_lock);
        while (evicted_count < 8 && quarantine_count > 0 &&
               (quarantine_count == CM_QUARANTINE_OBJECTS ||
                quarantine_bytes + size > CM_QUARANTINE_BYTES)) {
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
                memset((char *)p + raw->requested, FREE_FILL, size - HEADER - raw->requested);
                quarantine[(quarantine_head + quarantine_count) % CM_QUARANTINE_OBJECTS] = raw;
                quarantine_count++;
                quarantine_bytes += size;
            }
        }
        cm_lock_release(&quarantine_lock);
        for (size_t i = 0; i < evicted_count; i++)
            release_from_quarantine(evicted[i]);
        if (twice)
            cm_report_double_free(caller, p);
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
}
