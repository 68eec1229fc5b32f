/* pagemap.c - the map from page number to span, a two-level radix tree over 48-bit addresses.
 *
 *   address:  | 17 bits: root index | 18 bits: leaf index | 13 bits: offset in page |
 *   root      static array of 2^17 leaf pointers (1 MiB of .bss, touched only where used)
 *   leaf      2^18 span pointers and pairs of size-class and page-in-span bytes (3 MiB mapped
 *             on demand, resident only where written), covering 2 GiB of address space
 *
 * The hot leaf: while one leaf holds every SMALL span (a heap within one 2 GiB region),
 * cm_pagemap_leaf_of finds it by comparing the root index with cm_pagemap_hot_index and
 * reading cm_pagemap_hot_leaf, two loads that do not wait on the address, instead of the
 * root's entry, a load that does and lay on free's path from a block's address to its list
 * (the 64-byte malloc-free loop 124.9M ops/s with the hot leaf, 106.1M without:
 * docs/PERFORMANCE.md, "The fast path", with the command). A SMALL span in a second leaf sets
 * the index to CM_PAGEMAP_NO_HOT for good, and every lookup reads the root again: a branch
 * guessing between two leaves would cost more than the load it saves (note_small_span). The
 * hot leaf is the root's entry at the hot index and never changes, so a reader that sees the
 * old index is right too; any other leaf is found through the root whatever the index. Only a
 * SMALL span ends it: the kernel places thread stacks and large blocks among the heap's
 * mappings, and where any second leaf ended it, a program that started 200 threads and then
 * mapped 256 MiB of blocks lost the hot leaf in 10 runs of 10 (docs/PERFORMANCE.md, "Measured
 * at e40c6c6"). Bigger leaves would keep it as well, but a leaf's mapping counts against
 * RLIMIT_AS: at 24 MiB a leaf (16 GiB of address space), a C++ program allocating 360 MiB
 * under a 400 MiB limit failed whenever the block needed a leaf of its own
 * (tests/test_oom_cxx.sh, 1 run in 60).
 * Reads are lock-free (cm_pagemap_lookup in internal.h): a leaf, once published, is never
 * unmapped or moved. pagemap_lock serializes leaf creation. Every writer of entries holds the
 * page heap's lock (the mmap path too, through cm_page_heap_set_mapped), after
 * cm_pagemap_ensure; so does cm_pagemap_release_unused, which gives back the pages of entries
 * that map nothing: a reader then finds zero pages, which read as NULL entries, the same
 * answer. Each leaf keeps a bit for each page of entries written since it was last given back
 * (written): those are what it holds resident, the figure the metadata bytes count.
 * Invariant: an entry is NULL or points to the live span that contains its page, and its
 * class byte equals that span's size_class (0 when NULL) and, for a SMALL span, its page
 * byte is the page's distance from the span's first page; every page of a leaf's entries that
 * is not zero has its bit in written. Every page of a span has the same owner (0 when the span
 * is set), written by the central cache on a fill (under the class's lock: the span is SMALL,
 * so its class bytes are not zero and their page is never given back meanwhile).
 */
#include "internal.h"

cm_pagemap_leaf *cm_pagemap_root[1u << CM_PAGEMAP_ROOT_BITS];
uintptr_t cm_pagemap_hot_index = CM_PAGEMAP_NO_HOT;
cm_pagemap_leaf *cm_pagemap_hot_leaf;
static cm_lock pagemap_lock = CM_LOCK_INIT;
#define LEAF_BYTES       ((sizeof(cm_pagemap_leaf) + CM_PAGE_SIZE - 1) & ~(CM_PAGE_SIZE - 1))
_Static_assert(offsetof(cm_pagemap_leaf, spans) == CM_PAGEMAP_CLASS_PAGES * CM_SYSTEM_PAGE &&
                   offsetof(cm_pagemap_leaf, written) % CM_SYSTEM_PAGE == 0,
               "entry pages are numbered classes first, then spans, with nothing between");
/* Root indexes that have a leaf lie in [first_leaf, last_leaf]; written under pagemap_lock,
 * read without it (leaf_range: the range only widens). */
static size_t first_leaf = SIZE_MAX, last_leaf;
static bool hot_given_up; /* under the page heap's lock, as the entries' writes */

/* Makes sure leaves exist for pages [page, page + pages). False when the OS refuses memory. */
bool cm_pagemap_ensure(uintptr_t page, size_t pages)
{
    uintptr_t first = page >> CM_PAGEMAP_LEAF_BITS,
              last = (page + pages - 1) >> CM_PAGEMAP_LEAF_BITS;
    for (uintptr_t i = first; i <= last; i++) {
        if (__atomic_load_n(&cm_pagemap_root[i], __ATOMIC_ACQUIRE) != NULL)
            continue;
        cm_lock_acquire(&pagemap_lock);
        if (cm_pagemap_root[i] == NULL) {
            cm_pagemap_leaf *leaf = cm_os_map_sparse(LEAF_BYTES);
            if (leaf == NULL) {
                cm_lock_release(&pagemap_lock);
                return false;
            }
            __atomic_store_n(&cm_pagemap_root[i], leaf, __ATOMIC_RELEASE);
            __atomic_store_n(&first_leaf, i < first_leaf ? i : first_leaf, __ATOMIC_RELAXED);
            __atomic_store_n(&last_leaf, i > last_leaf ? i : last_leaf, __ATOMIC_RELAXED);
        }
        cm_lock_release(&pagemap_lock);
    }
    return true;
}

/* The address of entry page number (classes first, then spans) of leaf. */
static char *entry_page(cm_pagemap_leaf *leaf, size_t number)
{
    return (char *)leaf->classes + number * CM_SYSTEM_PAGE;
}

/* Marks entry page number of leaf as written (a write makes a page resident, NULL or not). */
static void mark_written(cm_pagemap_leaf *leaf, size_t number)
{
    uint64_t bit = (uint64_t)1 << (number % 64), word = leaf->written[number / 64];
    if ((word & bit) == 0)
        __atomic_store_n(&leaf->written[number / 64], word | bit, __ATOMIC_RELAXED);
}

/* The pages of entries leaf holds written (racy outside the page heap's lock). */
size_t cm_pagemap_written_pages(const cm_pagemap_leaf *leaf)
{
    size_t pages = 0;
    for (size_t word = 0; word < CM_PAGEMAP_ENTRY_PAGES / 64; word++)
        pages += (size_t)__builtin_popcountll(__atomic_load_n(&leaf->written[word],
                                                              __ATOMIC_RELAXED));
    return pages;
}

/* The root indexes that have a leaf lie in [*first, *last]; false while there is none. */
static bool leaf_range(size_t *first, size_t *last)
{
    *first = __atomic_load_n(&first_leaf, __ATOMIC_RELAXED);
    *last = __atomic_load_n(&last_leaf, __ATOMIC_RELAXED);
    return *first != SIZE_MAX;
}

/* The hot leaf follows the SMALL spans, the only ones free's fast path finds objects of: the
 * first leaf to hold one becomes the hot leaf (its pointer published before its index), and a
 * SMALL span in any other leaf gives the hot leaf up for good. A leaf holding only other
 * spans (MAPPED blocks, free or LARGE ones) leaves it be: their frees read the root and take
 * the slow path in any case. */
static void note_small_span(cm_pagemap_leaf *leaf, uintptr_t index)
{
    if (leaf == cm_pagemap_hot_leaf || hot_given_up)
        return;
    if (cm_pagemap_hot_leaf == NULL) {
        cm_pagemap_hot_leaf = leaf;
        __atomic_store_n(&cm_pagemap_hot_index, index, __ATOMIC_RELEASE);
        return;
    }
    hot_given_up = true;
    __atomic_store_n(&cm_pagemap_hot_index, CM_PAGEMAP_NO_HOT, __ATOMIC_RELEASE);
}

void cm_pagemap_set(uintptr_t page, cm_span *span)
{
    cm_pagemap_leaf *leaf = cm_pagemap_root[page >> CM_PAGEMAP_LEAF_BITS];
    size_t i = page & (CM_PAGEMAP_LEAF_ENTRIES - 1);
    if (span != NULL && span->size_class != 0)
        note_small_span(leaf, page >> CM_PAGEMAP_LEAF_BITS);
    mark_written(leaf, i / CM_PAGEMAP_CLASSES_PER_PAGE);
    mark_written(leaf, CM_PAGEMAP_CLASS_PAGES + i / CM_PAGEMAP_SPANS_PER_PAGE);
    leaf->spans[i] = span;
    leaf->classes[i].size_class = span ? span->size_class : 0;
    leaf->classes[i].span_pages = span && span->size_class ? (uint8_t)(page - span->page) : 0;
    __atomic_store_n(&leaf->classes[i].owner, 0, __ATOMIC_RELAXED);
}

/* Routes the frees of span's objects to slot owner (remote.c); written only when it changes. */
void cm_pagemap_set_owner(const cm_span *span, unsigned owner)
{
    for (uintptr_t page = span->page; page < span->page + span->pages; page++) {
        cm_page_class *entry = &cm_pagemap_root[page >> CM_PAGEMAP_LEAF_BITS]
                                    ->classes[page & (CM_PAGEMAP_LEAF_ENTRIES - 1)];
        if (__atomic_load_n(&entry->owner, __ATOMIC_RELAXED) == owner)
            return; /* set for the whole span at once: one page tells */
        __atomic_store_n(&entry->owner, (uint16_t)owner, __ATOMIC_RELAXED);
    }
}

void cm_pagemap_set_range(uintptr_t page, size_t pages, cm_span *span)
{
    for (size_t i = 0; i < pages; i++)
        cm_pagemap_set(page + i, span);
}

/* Whether the kernel's page at start holds zeros only: entries that map nothing. */
static bool page_is_zero(const char *start)
{
    const uint64_t *words = (const uint64_t *)start;
    uint64_t any = 0;
    for (size_t i = 0; i < CM_SYSTEM_PAGE / sizeof *words; i++)
        any |= __atomic_load_n(&words[i], __ATOMIC_RELAXED); /* owners are written racily */
    return any == 0;
}

/* Gives back count entry pages of leaf from number first on (none when count is 0), in one
 * call: a trim of a heap that held gigabytes finds its zero pages in runs. Returns bytes. */
static size_t release_entry_pages(cm_pagemap_leaf *leaf, size_t first, size_t count)
{
    if (count > 0)
        cm_os_release(entry_page(leaf, first), count * CM_SYSTEM_PAGE);
    return count * CM_SYSTEM_PAGE;
}

/* Gives back the written entry pages of every leaf that map nothing now (every written page of
 * a leaf that maps nothing), the caller holding the page heap's lock, so that no entry changes
 * meanwhile but the owners of SMALL spans' pages, whose class bytes are not zero. Returns the
 * bytes given back. */
size_t cm_pagemap_release_unused(void)
{
    size_t first, last, bytes = 0;
    if (!leaf_range(&first, &last))
        return 0;
    for (size_t i = first; i <= last; i++) {
        cm_pagemap_leaf *leaf = __atomic_load_n(&cm_pagemap_root[i], __ATOMIC_ACQUIRE);
        if (leaf == NULL)
            continue;
        size_t run_first = 0, run_count = 0; /* zero pages found next to each other */
        for (size_t word = 0; word < CM_PAGEMAP_ENTRY_PAGES / 64; word++) {
            for (uint64_t bits = leaf->written[word]; bits != 0; bits &= bits - 1) {
                size_t number = word * 64 + (size_t)__builtin_ctzll(bits);
                if (!page_is_zero(entry_page(leaf, number)))
                    continue;
                __atomic_store_n(&leaf->written[word],
                                 leaf->written[word] & ~((uint64_t)1 << (number % 64)),
                                 __ATOMIC_RELAXED);
                if (number != run_first + run_count) {
                    bytes += release_entry_pages(leaf, run_first, run_count);
                    run_first = number;
                    run_count = 0;
                }
                run_count++;
            }
        }
        bytes += release_entry_pages(leaf, run_first, run_count);
    }
    return bytes;
}

/* Bytes the leaves hold resident, for the metadata figure: their written entry pages and, for
 * each, the page of its bitmap. */
size_t cm_pagemap_bytes(void)
{
    size_t first, last, pages = 0;
    if (!leaf_range(&first, &last))
        return 0;
    for (size_t i = first; i <= last; i++) {
        cm_pagemap_leaf *leaf = __atomic_load_n(&cm_pagemap_root[i], __ATOMIC_ACQUIRE);
        if (leaf != NULL)
            pages += cm_pagemap_written_pages(leaf) + 1;
    }
    return pages * CM_SYSTEM_PAGE;
}

void cm_pagemap_fork(int phase)
{
    cm_lock_fork(&pagemap_lock, phase);
}
