/* test_pagemap.c - the radix pagemap: entries set and read back, leaves created on demand,
 * addresses outside 48 bits and stale entries rejected, the hot leaf while there is one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdlib.h>

#include "internal.h"

/* The root's leaves: how many, and the index of the last one found. */
static size_t leaves_in_root(uintptr_t *index)
{
    size_t leaves = 0;
    for (uintptr_t i = 0; i < (uintptr_t)1 << CM_PAGEMAP_ROOT_BITS; i++)
        if (cm_pagemap_root[i] != NULL) {
            leaves++;
            *index = i;
        }
    return leaves;
}

/* Runs first, before the tests below add leaves far from the heap. The heap's leaf is the hot
 * one while it is the only leaf with SMALL spans (a heap straddling two 2 GiB regions has two
 * from the start, and then none is hot); a leaf with other spans only (a MAPPED block, a free
 * or LARGE span) leaves it hot, a SMALL span in a second leaf gives it up for good, and lookups
 * read the root and stay right. */
static void the_hot_leaf_lasts_while_it_holds_every_small_span(void **state)
{
    (void)state;
    char *block = malloc(100);
    cm_span *span = cm_span_of(block);
    assert_non_null(span);
    uintptr_t index = 0;
    if (leaves_in_root(&index) == 1) {
        assert_int_equal(cm_pagemap_hot_index, index);
        assert_ptr_equal(cm_pagemap_hot_leaf, cm_pagemap_root[index]);
        assert_ptr_equal(cm_pagemap_leaf_of(block), cm_pagemap_root[index]);
    } else {
        assert_int_equal(cm_pagemap_hot_index, CM_PAGEMAP_NO_HOT);
    }
    uintptr_t hot = cm_pagemap_hot_index;
    uintptr_t far = ((uintptr_t)0x16b6b << 18) + 9; /* no mapping of cmalloc's is near it */
    assert_true(cm_pagemap_ensure(far, 2));
    cm_span large = {.page = far, .pages = 1, .state = CM_SPAN_LARGE};
    cm_pagemap_set(far, &large);
    assert_int_equal(cm_pagemap_hot_index, hot);
    assert_ptr_equal(cm_pagemap_lookup((void *)(far << CM_PAGE_SHIFT)), &large);
    cm_span small = {.page = far + 1, .pages = 1, .state = CM_SPAN_SMALL, .size_class = 1};
    cm_pagemap_set(far + 1, &small);
    assert_int_equal(cm_pagemap_hot_index, CM_PAGEMAP_NO_HOT);
    assert_ptr_equal(cm_span_of(block), span);
    assert_ptr_equal(cm_pagemap_leaf_of((void *)(far << CM_PAGE_SHIFT)),
                     cm_pagemap_root[far >> CM_PAGEMAP_LEAF_BITS]);
    assert_ptr_equal(cm_pagemap_lookup((void *)((far + 1) << CM_PAGE_SHIFT)), &small);
    cm_pagemap_set(far, NULL);
    cm_pagemap_set(far + 1, NULL);
    assert_null(cm_pagemap_lookup((void *)(far << CM_PAGE_SHIFT)));
    free(block);
}

/* A leaf covers 2 GiB: pages 1 GiB apart in one such region share it, and the pages of entries
 * written count in the metadata bytes until, mapping nothing again, they are given back. */
static void written_entry_pages_are_counted_and_given_back(void **state)
{
    (void)state;
    uintptr_t page = ((uintptr_t)0x12d2 << CM_PAGEMAP_LEAF_BITS) + 3,
              apart = (uintptr_t)1 << (30 - CM_PAGE_SHIFT);
    assert_true(cm_pagemap_ensure(page, 1) && cm_pagemap_ensure(page + apart, 1));
    cm_pagemap_leaf *leaf = cm_pagemap_leaf_of((void *)(page << CM_PAGE_SHIFT));
    assert_ptr_equal(cm_pagemap_leaf_of((void *)((page + apart) << CM_PAGE_SHIFT)), leaf);
    assert_int_equal(cm_pagemap_written_pages(leaf), 0);
    size_t before = cm_pagemap_bytes();
    /* SMALL: class bytes that are not zero (a page of classes that are all zero, as a LARGE
     * span's are, goes back too, and reads the same) */
    cm_span span = {.page = page, .pages = 1, .state = CM_SPAN_SMALL, .size_class = 1},
            other = {.page = page + apart, .pages = 1, .state = CM_SPAN_SMALL, .size_class = 1};
    cm_pagemap_set(page, &span);
    cm_pagemap_set(page + apart, &other);
    /* a page of classes and one of spans for each */
    assert_int_equal(cm_pagemap_written_pages(leaf), 4);
    assert_true(cm_pagemap_bytes() >= before + 4 * CM_SYSTEM_PAGE);
    cm_pagemap_set(page, NULL);
    assert_true(cm_pagemap_release_unused() >= 2 * CM_SYSTEM_PAGE);
    assert_int_equal(cm_pagemap_written_pages(leaf), 2);
    assert_ptr_equal(cm_pagemap_lookup((void *)((page + apart) << CM_PAGE_SHIFT)), &other);
    assert_int_equal(leaf->classes[(page + apart) % CM_PAGEMAP_LEAF_ENTRIES].size_class, 1);
    assert_null(cm_pagemap_lookup((void *)(page << CM_PAGE_SHIFT)));
    cm_pagemap_set(page + apart, NULL);
    cm_pagemap_release_unused();
    assert_int_equal(cm_pagemap_written_pages(leaf), 0);
    assert_null(cm_pagemap_lookup((void *)((page + apart) << CM_PAGE_SHIFT)));
}

/* Pages of entries that map nothing go back in runs, and a page that still maps something
 * splits a run and stays, its entries intact. Map pages CM_PAGEMAP_CLASSES_PER_PAGE apart have
 * their class bytes on adjacent pages of entries. */
static void zero_entry_pages_go_back_in_runs_that_skip_live_ones(void **state)
{
    (void)state;
    const uintptr_t base = (uintptr_t)0x12d3 << CM_PAGEMAP_LEAF_BITS,
                    apart = CM_PAGEMAP_CLASSES_PER_PAGE;
    cm_span spans[4];
    assert_true(cm_pagemap_ensure(base, 4 * apart));
    cm_pagemap_leaf *leaf = cm_pagemap_leaf_of((void *)(base << CM_PAGE_SHIFT));
    for (int i = 0; i < 4; i++) {
        spans[i] = (cm_span){.page = base + i * apart, .pages = 1, .state = CM_SPAN_SMALL,
                             .size_class = 1};
        cm_pagemap_set(base + i * apart, &spans[i]);
    }
    /* four pages of class bytes, four of spans (two apart: a span entry is twice as wide) */
    assert_int_equal(cm_pagemap_written_pages(leaf), 8);
    cm_pagemap_set(base, NULL);
    cm_pagemap_set(base + apart, NULL);
    cm_pagemap_set(base + 3 * apart, NULL);
    assert_true(cm_pagemap_release_unused() >= 6 * CM_SYSTEM_PAGE);
    assert_int_equal(cm_pagemap_written_pages(leaf), 2);
    void *live = (void *)((base + 2 * apart) << CM_PAGE_SHIFT);
    assert_ptr_equal(cm_pagemap_lookup(live), &spans[2]);
    assert_int_equal(cm_pagemap_class_of(live), 1);
    for (int i = 0; i < 4; i++)
        if (i != 2)
            assert_null(cm_pagemap_lookup((void *)((base + i * apart) << CM_PAGE_SHIFT)));
    cm_pagemap_set(base + 2 * apart, NULL);
    cm_pagemap_release_unused();
    assert_int_equal(cm_pagemap_written_pages(leaf), 0);
}

static void set_and_lookup(void **state)
{
    (void)state;
    /* A page far from anything cmalloc maps: its leaf does not exist yet. */
    uintptr_t page = ((uintptr_t)0x15a5a << 18) + 77;
    assert_null(cm_pagemap_lookup((void *)(page << CM_PAGE_SHIFT)));
    assert_true(cm_pagemap_ensure(page, 3));
    cm_span span = {.page = page, .pages = 3, .state = CM_SPAN_LARGE};
    cm_pagemap_set_range(page, 3, &span);
    for (uintptr_t p = page; p < page + 3; p++) {
        char *address = (char *)(p << CM_PAGE_SHIFT);
        assert_ptr_equal(cm_pagemap_lookup(address), &span);
        assert_ptr_equal(cm_pagemap_lookup(address + CM_PAGE_SIZE - 1), &span);
        assert_ptr_equal(cm_span_of(address + 100), &span);
    }
    assert_null(cm_pagemap_lookup((void *)((page + 3) << CM_PAGE_SHIFT)));
    cm_pagemap_set_range(page, 3, NULL);
    assert_null(cm_pagemap_lookup((void *)(page << CM_PAGE_SHIFT)));
}

static void stale_and_wild_pointers_are_rejected(void **state)
{
    (void)state;
    uintptr_t page = ((uintptr_t)0x13c3c << 18) + 5;
    assert_true(cm_pagemap_ensure(page, 4));
    cm_span span = {.page = page, .pages = 1, .state = CM_SPAN_LARGE};
    cm_pagemap_set(page + 2, &span); /* an entry for a page the span does not cover */
    assert_ptr_equal(cm_pagemap_lookup((void *)((page + 2) << CM_PAGE_SHIFT)), &span);
    assert_null(cm_span_of((void *)((page + 2) << CM_PAGE_SHIFT)));
    span.state = CM_SPAN_DEAD;
    cm_pagemap_set(page, &span);
    assert_null(cm_span_of((void *)(page << CM_PAGE_SHIFT)));
    cm_pagemap_set(page, NULL);
    cm_pagemap_set(page + 2, NULL);
    assert_null(cm_pagemap_lookup((void *)0xffff800000001000ull));
    assert_null(cm_span_of((void *)((uintptr_t)1 << 60)));
}

static void heap_objects_resolve_to_their_span(void **state)
{
    (void)state;
    for (size_t size = 16; size <= cm_option.mmap_threshold; size *= 3) {
        char *p = malloc(size);
        cm_span *span = cm_span_of(p);
        assert_non_null(span);
        assert_non_null(cm_span_of(p + size - 1));
        assert_true(span->state == CM_SPAN_SMALL || span->state == CM_SPAN_LARGE);
        free(p);
    }
    char *mapped = malloc(cm_option.mmap_threshold_max + 1); /* above any threshold: mmap */
    assert_non_null(cm_span_of(mapped));
    assert_int_equal(cm_span_of(mapped)->state, CM_SPAN_MAPPED); /* only its first page maps */
    free(mapped);
    int on_stack;
    assert_null(cm_span_of(&on_stack));
}

int main(void)
{
    cm_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_hot_leaf_lasts_while_it_holds_every_small_span),
        cmocka_unit_test(written_entry_pages_are_counted_and_given_back),
        cmocka_unit_test(zero_entry_pages_go_back_in_runs_that_skip_live_ones),
        cmocka_unit_test(set_and_lookup),
        cmocka_unit_test(stale_and_wild_pointers_are_rejected),
        cmocka_unit_test(heap_objects_resolve_to_their_span),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
