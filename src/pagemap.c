/* pagemap.c - the map from page number to span, a two-level radix tree over 48-bit addresses.
 *
 *   address:  | 17 bits: root index | 18 bits: leaf index | 13 bits: offset in page |
 *   root      static array of 2^17 leaf pointers (1 MiB of .bss, touched only where used)
 *   leaf      2^18 span pointers and pairs of size-class and page-in-span bytes (2.5 MiB mapped
 *             on demand, resident only where written), covering 2 GiB of address space
 *
 * The hot leaf: while the pagemap has one leaf (a heap within one 2 GiB region, as each program
 * of the benchmark matrix had where looked at), cm_pagemap_leaf_of finds it by comparing the
 * root index with cm_pagemap_hot_index and reading cm_pagemap_hot_leaf, two loads that do not
 * wait on the address, instead of the root's entry, a load that does and lay on free's path
 * from a block's address to its list (the 64-byte malloc-free loop 124.9M ops/s with the hot
 * leaf, 106.1M without: docs/PERFORMANCE.md, "The fast path", with the command). A second
 * leaf sets the index to CM_PAGEMAP_NO_HOT for good, and every lookup reads the root again: a
 * branch guessing between two leaves would cost more than the load it saves. The hot leaf is
 * the root's entry at the hot index and never changes, so a reader that sees the old index is
 * right too.
 * Reads are lock-free (cm_pagemap_lookup in internal.h): a leaf, once published, is never
 * unmapped or moved. pagemap_lock serializes leaf creation. Every writer of entries holds the
 * page heap's lock (the mmap path too, through cm_page_heap_set_mapped), after
 * cm_pagemap_ensure; so does cm_pagemap_release_empty, which gives back the pages of a leaf
 * whose entries are all NULL: a reader then finds zero pages, which read as NULL entries, the
 * same answer. A leaf counts in the metadata bytes while it is not released.
 * Invariant: an entry is NULL or points to the live span that contains its page, and its
 * class byte equals that span's size_class (0 when NULL) and, for a SMALL span, its page
 * byte is the page's distance from the span's first page; a leaf's used counts its entries
 * that are not NULL, and a released leaf has used == 0. Every page of a span has
 * the same owner (0 when the span is set), written by the central cache on a fill (under the
 * class's lock: the span is SMALL, so its leaf is in use and never released meanwhile).
 */
#include "internal.h"

cm_pagemap_leaf *cm_pagemap_root[1u << CM_PAGEMAP_ROOT_BITS];
uintptr_t cm_pagemap_hot_index = CM_PAGEMAP_NO_HOT;
cm_pagemap_leaf *cm_pagemap_hot_leaf;
static cm_lock pagemap_lock = CM_LOCK_INIT;
#define LEAF_BYTES    ((sizeof(cm_pagemap_leaf) + CM_PAGE_SIZE - 1) & ~(CM_PAGE_SIZE - 1))
/* classes and spans, which are page-aligned in size: what a release gives back */
#define ENTRIES_BYTES (offsetof(cm_pagemap_leaf, used) & ~(CM_PAGE_SIZE - 1))
/* Root indexes that have a leaf lie in [first_leaf, last_leaf]; written under pagemap_lock. */
static size_t first_leaf = SIZE_MAX, last_leaf;
static size_t leaves, released_leaves; /* leaves under pagemap_lock; released: heap lock */

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
            cm_pagemap_leaf *leaf = cm_os_map(LEAF_BYTES);
            if (leaf == NULL) {
                cm_lock_release(&pagemap_lock);
                return false;
            }
            __atomic_store_n(&cm_pagemap_root[i], leaf, __ATOMIC_RELEASE);
            if (leaves == 0)
                cm_pagemap_hot_leaf = leaf;
            __atomic_store_n(&cm_pagemap_hot_index, leaves == 0 ? i : CM_PAGEMAP_NO_HOT,
                             __ATOMIC_RELEASE);
            __atomic_store_n(&leaves, leaves + 1, __ATOMIC_RELAXED);
            first_leaf = i < first_leaf ? i : first_leaf;
            last_leaf = i > last_leaf ? i : last_leaf;
        }
        cm_lock_release(&pagemap_lock);
    }
    return true;
}

void cm_pagemap_set(uintptr_t page, cm_span *span)
{
    cm_pagemap_leaf *leaf = cm_pagemap_root[page >> CM_PAGEMAP_LEAF_BITS];
    size_t i = page & (CM_PAGEMAP_LEAF_ENTRIES - 1);
    if ((leaf->spans[i] == NULL) != (span == NULL)) {
        leaf->used += span ? 1 : (size_t)-1;
        if (leaf->released) { /* its pages come back as they are written */
            leaf->released = false;
            __atomic_store_n(&released_leaves, released_leaves - 1, __ATOMIC_RELAXED);
        }
    }
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

/* Gives back the entry pages of every leaf that maps nothing (the caller holds the page heap's
 * lock, so no entry changes meanwhile). Returns the bytes given back. */
size_t cm_pagemap_release_empty(void)
{
    cm_lock_acquire(&pagemap_lock);
    size_t first = first_leaf, last = last_leaf;
    cm_lock_release(&pagemap_lock);
    size_t bytes = 0;
    for (size_t i = first; i <= last && first != SIZE_MAX; i++) {
        cm_pagemap_leaf *leaf = __atomic_load_n(&cm_pagemap_root[i], __ATOMIC_ACQUIRE);
        if (leaf == NULL || leaf->used != 0 || leaf->released)
            continue;
        cm_os_release(leaf, ENTRIES_BYTES);
        leaf->released = true;
        __atomic_store_n(&released_leaves, released_leaves + 1, __ATOMIC_RELAXED);
        bytes += ENTRIES_BYTES;
    }
    return bytes;
}

/* Bytes of the leaves that are not released, for the metadata figure. */
size_t cm_pagemap_bytes(void)
{
    size_t held = __atomic_load_n(&leaves, __ATOMIC_RELAXED) -
                  __atomic_load_n(&released_leaves, __ATOMIC_RELAXED);
    return held * LEAF_BYTES;
}

void cm_pagemap_fork(int phase)
{
    cm_lock_fork(&pagemap_lock, phase);
}
