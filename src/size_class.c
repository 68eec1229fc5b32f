/* size_class.c - the size-class table and the lookup from a request size to its class.
 *
 * Generated once at init by the rules below (cmalloc_stats_print shows the result):
 *   size     16-byte steps up to 128 B, then 8 classes per doubling (step = lower bound / 8)
 *            up to CM_CLASS_COARSE_FROM and 4 above it (policy.h), so a request wastes at most
 *            12.5% above 128 B and 25% above CM_CLASS_COARSE_FROM, plus 1040 (1 KiB and a
 *            16-byte header, a common buffer: sqlite3's page cache); every size is a multiple
 *            of 16, so every object is 16-byte aligned.
 *   pages    the fewest pages holding min(CM_SPAN_OBJECTS_MIN objects, 256 KiB), one object
 *            from CM_SPAN_ONE_OBJECT_SIZE up, whose tail wastes at most
 *            1/CM_SPAN_WASTE_DIVISOR, and for classes up to CM_SPAN_TIGHT_SIZE at most
 *            1/CM_SPAN_TIGHT_DIVISOR within CM_SPAN_TIGHT_PAGES pages (policy.h).
 *   batch    objects per fill/flush: CM_BATCH_BYTES / size, clamped to [CM_BATCH_MIN,
 *            CM_BATCH_MAX].
 *   magic    for free's test that an offset into a span starts one of its objects, with no
 *            division: offset * magic (mod 2^64) is k * step for offset k * size, where
 *            step = magic * size (mod 2^64) < size, and at least magic for any offset not a
 *            multiple of size (offsets < 2^32). So offset starts an object of the span iff
 *            offset * magic < start_limit = objects * step, which also rejects the slots past
 *            the last whole object in the span's tail. (A power-of-two size has step 0 and no
 *            tail: start_limit 1 accepts every multiple.)
 *   transfer batches the central transfer cache keeps at first: CM_TRANSFER_BYTES / batch
 *            bytes, clamped to [CM_TRANSFER_MIN, CM_TRANSFER_BASE_SLOTS] (more while other
 *            threads take them; idle batches are drained by age: central_cache.c).
 * Lookup: cm_size_class() reads one of two byte tables, in 16-byte steps up to
 * CM_SMALL_STEP_MAX (1152) and in 128-byte steps above (every class above it is a multiple of
 * 128). Class 0 is never used. An aligned request's class is a third table's entry for its
 * size's class (cm_aligned_classes, a row per alignment).
 * Invariant: cm_classes[cm_size_class(n)].size is the smallest class size >= n.
 */
#include "internal.h"

cm_class_info cm_classes[CM_CLASSES_MAX];
unsigned cm_class_count; /* classes 1..cm_class_count-1 are in use */
cm_class_lookup cm_class_table;
uint8_t cm_aligned_classes[CM_ALIGNED_ROWS][CM_CLASSES_MAX];
const cm_class_lookup *cm_fast_path_classes = &cm_class_table;

static size_t clamp(size_t value, size_t low, size_t high)
{
    return value < low ? low : value > high ? high : value;
}

static uint32_t pages_for(size_t size)
{
    size_t want = size >= CM_SPAN_ONE_OBJECT_SIZE
                      ? size
                      : clamp(CM_SPAN_OBJECTS_MIN * size, size, CM_MAX_SMALL);
    size_t pages = (want + CM_PAGE_SIZE - 1) / CM_PAGE_SIZE;
    while ((pages * CM_PAGE_SIZE) % size > pages * CM_PAGE_SIZE / CM_SPAN_WASTE_DIVISOR)
        pages++;
    while (size <= CM_SPAN_TIGHT_SIZE && pages < CM_SPAN_TIGHT_PAGES &&
           (pages * CM_PAGE_SIZE) % size > pages * CM_PAGE_SIZE / CM_SPAN_TIGHT_DIVISOR)
        pages++;
    return (uint32_t)pages;
}

_Static_assert(CM_CLASSES_MAX <= 256, "a size class must fit the pagemap's class byte");
_Static_assert((CM_MAX_SMALL * 9 / 8) / CM_PAGE_SIZE + 1 < 256,
               "the pages of a small span must fit the pagemap's span_pages byte");

static void add_class(size_t size)
{
    CM_ASSERT(cm_class_count < CM_CLASSES_MAX && size % CM_ALIGNMENT == 0);
    cm_class_info *c = &cm_classes[cm_class_count++];
    c->size = (uint32_t)size;
    c->pages = pages_for(size);
    c->objects = (uint32_t)(c->pages * CM_PAGE_SIZE / size);
    c->batch = (uint32_t)clamp(CM_BATCH_BYTES / size, CM_BATCH_MIN, CM_BATCH_MAX);
    c->divisor_magic = UINT64_MAX / size + 1;
    uint64_t step = c->divisor_magic * size;
    c->start_limit = step == 0 ? 1 : (uint32_t)(c->objects * step);
    CM_ASSERT(c->objects >= 1 && c->pages < 256 && c->batch <= CM_BATCH_MAX &&
              (uint64_t)c->objects * step < c->divisor_magic);
    c->transfer_capacity = (uint32_t)clamp(CM_TRANSFER_BYTES / ((size_t)c->batch * size),
                                           CM_TRANSFER_MIN, CM_TRANSFER_BASE_SLOTS);
}

void cm_size_class_init(void)
{
    cm_class_count = 1;
    for (size_t size = 16; size <= 128; size += 16)
        add_class(size);
    for (size_t low = 128; low < CM_MAX_SMALL; low *= 2) {
        if (low == 1024)
            add_class(1024 + 16); /* 1 KiB and a header (sqlite3's page cache: 1,032 bytes) */
        size_t step = low < CM_CLASS_COARSE_FROM ? low / 8 : low / 4;
        for (size_t size = low + step; size <= 2 * low; size += step)
            add_class(size);
    }

    unsigned c = 1;
    for (size_t i = 0; i <= CM_SMALL_STEP_MAX / 16; i++) {
        while (cm_classes[c].size < i * 16)
            c++;
        cm_class_table.small[i] = (uint8_t)c;
    }
    c = 1;
    for (size_t i = 0; i <= CM_MAX_SMALL / 128; i++) {
        while (cm_classes[c].size < i * 128)
            c++;
        cm_class_table.medium[i] = (uint8_t)c;
    }
    for (unsigned row = 0; row < CM_ALIGNED_ROWS; row++) {
        uint8_t aligned = 0;
        for (unsigned from = cm_class_count - 1; from >= 1; from--) {
            if (cm_classes[from].size % ((size_t)1 << (CM_ALIGNED_MIN_SHIFT + row)) == 0)
                aligned = (uint8_t)from;
            cm_aligned_classes[row][from] = aligned;
        }
    }
}
