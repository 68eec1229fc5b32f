/* test_page_heap.c - the page heap: spans split and coalesce (freed neighbours merge so the
 * memory is reusable as one span), alignment, release to the OS, and the invariants of
 * cm_page_heap_valid after every step of a seeded random sequence. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "helpers.h"

static unsigned seed;

static unsigned next_random(void)
{
    seed = seed * 1103515245u + 12345u;
    return seed >> 8;
}

static void split_and_coalesce(void **state)
{
    (void)state;
    /* Carve neighbours out of one fresh run, free them in an odd order, and the run comes
     * back as a single span: the same pages are handed out again for the whole size. */
    cm_span *whole = cm_page_heap_alloc(64, 1, 0);
    assert_non_null(whole);
    uintptr_t first = whole->page;
    cm_page_heap_free(whole);
    cm_span *parts[8];
    for (int i = 0; i < 8; i++) {
        parts[i] = cm_page_heap_alloc(8, 1, 0);
        assert_non_null(parts[i]);
        memset(cm_span_start(parts[i]), i, 8 * CM_PAGE_SIZE);
    }
    const int order[8] = {3, 0, 7, 5, 1, 6, 2, 4};
    for (int i = 0; i < 8; i++) {
        cm_page_heap_free(parts[order[i]]);
        assert_true(cm_page_heap_valid());
    }
    size_t mapped = cm_os_mapped_bytes();
    whole = cm_page_heap_alloc(64, 1, 0);
    assert_non_null(whole);
    assert_int_equal(whole->page, first);
    assert_int_equal(cm_os_mapped_bytes(), mapped); /* no growth: coalesced */
    cm_page_heap_free(whole);
    assert_true(cm_page_heap_valid());
}

static void random_sequence_keeps_invariants(void **state)
{
    (void)state;
    cm_span *live[200] = {0};
    for (int step = 0; step < 4000; step++) {
        unsigned i = next_random() % 200;
        if (live[i]) {
            cm_page_heap_free(live[i]);
            live[i] = NULL;
        } else {
            size_t pages = 1 + next_random() % (next_random() % 8 == 0 ? 600 : 20);
            size_t align = (size_t)1 << (next_random() % 5);
            live[i] = cm_page_heap_alloc(pages, align, 0);
            assert_non_null(live[i]);
            assert_int_equal(live[i]->pages, pages);
            assert_int_equal(live[i]->page % align, 0);
            assert_int_equal(live[i]->state, CM_SPAN_LARGE);
            ((char *)cm_span_start(live[i]))[pages * CM_PAGE_SIZE - 1] = 1;
        }
        if (step % 100 == 0)
            assert_true(cm_page_heap_valid());
    }
    for (int i = 0; i < 200; i++)
        if (live[i])
            cm_page_heap_free(live[i]);
    assert_true(cm_page_heap_valid());
}

static void small_spans_map_every_page(void **state)
{
    (void)state;
    unsigned c = cm_size_class(20000);
    cm_span *span = cm_page_heap_alloc(cm_classes[c].pages, 1, c);
    assert_non_null(span);
    assert_int_equal(span->state, CM_SPAN_SMALL);
    for (size_t i = 0; i < span->pages; i++)
        assert_ptr_equal(cm_pagemap_lookup((char *)cm_span_start(span) + i * CM_PAGE_SIZE), span);
    span->used = 0;
    cm_page_heap_free(span);
    assert_int_equal(span->state == CM_SPAN_FREE || span->state == CM_SPAN_DEAD, 1);
    assert_true(cm_page_heap_valid());
}

static void release_returns_free_pages(void **state)
{
    (void)state;
    cm_span *span = cm_page_heap_alloc(256, 1, 0);
    assert_non_null(span);
    memset(cm_span_start(span), 7, 256 * CM_PAGE_SIZE);
    cm_page_heap_free(span);
    size_t free_bytes, released, large, count;
    cm_page_heap_counters(&free_bytes, &released, &large, &count);
    assert_true(free_bytes >= 256 * CM_PAGE_SIZE);
    size_t given = cm_page_heap_release(true);
    assert_true(given >= 256 * CM_PAGE_SIZE);
    size_t free_after, released_after;
    cm_page_heap_counters(&free_after, &released_after, &large, &count);
    assert_int_equal(free_after, 0);
    assert_int_equal(released_after, released + free_bytes);
    /* Released pages read back as zero when handed out again. */
    span = cm_page_heap_alloc(256, 1, 0);
    assert_non_null(span);
    assert_int_equal(((char *)cm_span_start(span))[12345], 0);
    cm_page_heap_free(span);
    assert_true(cm_page_heap_valid());
}

int main(void)
{
    cm_init();
    seed = seed_from_env("test_page_heap");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(split_and_coalesce),
        cmocka_unit_test(random_sequence_keeps_invariants),
        cmocka_unit_test(small_spans_map_every_page),
        cmocka_unit_test(release_returns_free_pages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
