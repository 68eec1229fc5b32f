/* test_page_heap.c - the page heap, called directly (internal.h).
 *
 *   split_and_coalesce             parts of one run freed in an odd order come back as one span
 *                                  (the whole run is handed out again, no new mapping)
 *   random_sequence_keeps_invariants  seeded allocations (1..600 pages, aligned 1..16) and frees;
 *                                  cm_page_heap_valid every 100 steps (TEST_SEED to repeat)
 *   small_spans_map_every_page     a SMALL span maps every page to itself
 *   release_returns_free_pages     release hands every free page back; they read back as zero
 *   resize_shrink_gives_back_the_tail  64 -> 40 pages in place: the 24 become free pages of a
 *                                  free span right after it, the kept contents stay
 *   resize_grows_into_a_free_right_neighbour  16 -> 50 pages in place, taking 34 from the free
 *                                  span on its right (the rest stays free there), then all of it
 *   resize_fails_when_the_neighbour_is_taken_or_too_small  false, and nothing changes, with a
 *                                  LARGE span on the right, and with a 16-page free one asked
 *                                  for 17; asked for exactly 16, it takes them
 *   growth_releases_resident_free_pages  two-page holes given back when the heap grows
 *   resident_pages_go_out_before_released_ones  freed written pages between released ones stay
 *                                  a span of their own and are handed out first
 *   a_request_spans_resident_and_released_pages  a request only the run of both fits merges
 *                                  them, with no new mapping
 *   runs_by_request_size           beside a resident 300-page run and a released 200-page one,
 *                                  150 pages come from the released run (best fit), 100 from
 *                                  the resident one (resident first)
 * Each resize step is checked by both heap walkers, cm_page_heap_valid and cm_heap_check. */
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

/* Growing the heap while it holds resident free spans too small for the request gives as many
 * pages back first: free pieces left between live spans do not stay resident beside the new
 * chunk. */
static void growth_releases_resident_free_pages(void **state)
{
    (void)state;
    cm_page_heap_unmap_free(); /* no free span left: the pieces come from a new chunk */
    enum { PIECES = 64 };
    cm_span *pieces[PIECES];
    for (int i = 0; i < PIECES; i++) {
        pieces[i] = cm_page_heap_alloc(2, 1, 0);
        assert_non_null(pieces[i]);
        memset(cm_span_start(pieces[i]), 7, 2 * CM_PAGE_SIZE); /* resident */
    }
    for (int i = 0; i < PIECES; i += 2) /* two-page holes between live spans */
        cm_page_heap_free(pieces[i]);
    size_t free_bytes, released, large, count;
    cm_page_heap_counters(&free_bytes, &released, &large, &count);
    assert_true(free_bytes >= PIECES / 2 * 2 * CM_PAGE_SIZE); /* resident free bytes */
    /* more than the chunk's untouched rest: the heap must grow, and the holes go first */
    cm_span *big = cm_page_heap_alloc(CM_HEAP_GROW_MIN / CM_PAGE_SIZE, 1, 0);
    assert_non_null(big);
    size_t free_after, released_after;
    cm_page_heap_counters(&free_after, &released_after, &large, &count);
    assert_int_equal(free_after, 0);
    cm_page_heap_free(big);
    for (int i = 1; i < PIECES; i += 2)
        cm_page_heap_free(pieces[i]);
    assert_true(cm_page_heap_valid());
}

/* ---- resize in place (realloc of a page-heap block) ------------------------------------------ */

static size_t free_bytes_now(void)
{
    size_t free_bytes, released, large, count;
    cm_page_heap_counters(&free_bytes, &released, &large, &count);
    return free_bytes;
}

static void *page_address(const cm_span *span, size_t page)
{
    return (char *)cm_span_start(span) + page * CM_PAGE_SIZE;
}

/* The free span just past span's last page, or NULL (taken, or not heap memory). */
static cm_span *free_right_neighbour(const cm_span *span)
{
    cm_span *right = cm_span_of(page_address(span, span->pages));
    return right != NULL && right->state == CM_SPAN_FREE ? right : NULL;
}

static void fill_pages(cm_span *span, size_t pages, unsigned char tag)
{
    for (size_t i = 0; i < pages; i++)
        memset(page_address(span, i), tag, 64);
}

static void expect_pages(cm_span *span, size_t pages, unsigned char tag)
{
    for (size_t i = 0; i < pages; i++)
        for (size_t k = 0; k < 64; k++)
            assert_int_equal(((unsigned char *)page_address(span, i))[k], tag);
}

/* Both walkers after each step: the page heap's lists and pagemap, then every layer. */
static void expect_heap_valid(void)
{
    assert_true(cm_page_heap_valid());
    assert_true(cm_heap_check());
}

static void resize_shrink_gives_back_the_tail(void **state)
{
    (void)state;
    cm_span *span = cm_page_heap_alloc(64, 1, 0);
    assert_non_null(span);
    uintptr_t first = span->page;
    fill_pages(span, 64, 0x5a);
    size_t free_before = free_bytes_now();
    assert_true(cm_page_heap_resize(span, 40));
    assert_int_equal(span->page, first);
    assert_int_equal(span->pages, 40);
    assert_int_equal(span->state, CM_SPAN_LARGE);
    assert_int_equal(free_bytes_now(), free_before + 24 * CM_PAGE_SIZE);
    /* The new last page maps to the span; the first page given back starts a free span. */
    assert_ptr_equal(cm_span_of(page_address(span, 39)), span);
    cm_span *tail = free_right_neighbour(span);
    assert_non_null(tail);
    assert_int_equal(tail->page, first + 40);
    assert_true(tail->pages >= 24);
    expect_pages(span, 40, 0x5a);
    expect_heap_valid();
    /* The same size is a no-op that succeeds. */
    assert_true(cm_page_heap_resize(span, 40));
    assert_int_equal(span->pages, 40);
    assert_int_equal(free_bytes_now(), free_before + 24 * CM_PAGE_SIZE);
    cm_page_heap_free(span);
    expect_heap_valid();
}

static void resize_grows_into_a_free_right_neighbour(void **state)
{
    (void)state;
    cm_span *span = cm_page_heap_alloc(64, 1, 0);
    assert_non_null(span);
    uintptr_t first = span->page;
    assert_true(cm_page_heap_resize(span, 16)); /* 48 free pages on its right, at least */
    fill_pages(span, 16, 0xa5);
    size_t free_before = free_bytes_now();
    assert_true(cm_page_heap_resize(span, 50));
    assert_int_equal(span->page, first);
    assert_int_equal(span->pages, 50);
    assert_int_equal(free_bytes_now(), free_before - 34 * CM_PAGE_SIZE);
    assert_ptr_equal(cm_span_of(page_address(span, 49)), span);
    /* A LARGE span maps only its end pages: its old last page and the neighbour's old first
     * page are inner pages now, and map to nothing. */
    assert_ptr_equal(cm_span_of(page_address(span, 0)), span);
    assert_null(cm_pagemap_lookup(page_address(span, 15)));
    assert_null(cm_pagemap_lookup(page_address(span, 16)));
    cm_span *rest = free_right_neighbour(span);
    assert_non_null(rest); /* what was not taken stays free, where it was */
    assert_int_equal(rest->page, first + 50);
    expect_pages(span, 16, 0xa5);
    memset(page_address(span, 16), 1, 34 * CM_PAGE_SIZE); /* the new pages are writable */
    expect_heap_valid();
    /* Taking the whole neighbour leaves no free span on the right. */
    assert_true(cm_page_heap_resize(span, 50 + rest->pages));
    assert_null(free_right_neighbour(span));
    expect_heap_valid();
    cm_page_heap_free(span);
    expect_heap_valid();
}

/* Makes *left with a 16-page LARGE span *right just past its end: left first swallows its free
 * right neighbour (so nothing free lies past it), then gives back its last 16 pages, which
 * head the exact list for 16 pages and so are what the next 16-page allocation takes. */
static void make_neighbours(cm_span **left, cm_span **right)
{
    cm_span *span = cm_page_heap_alloc(64, 1, 0);
    assert_non_null(span);
    cm_span *free_right = free_right_neighbour(span);
    if (free_right != NULL)
        assert_true(cm_page_heap_resize(span, span->pages + free_right->pages));
    assert_null(free_right_neighbour(span));
    assert_true(cm_page_heap_resize(span, span->pages - 16));
    cm_span *next = cm_page_heap_alloc(16, 1, 0);
    assert_non_null(next);
    assert_int_equal(next->page, span->page + span->pages);
    *left = span;
    *right = next;
}

static void resize_fails_when_the_neighbour_is_taken_or_too_small(void **state)
{
    (void)state;
    cm_span *left, *right;
    make_neighbours(&left, &right);
    uintptr_t first = left->page;
    size_t pages = left->pages;
    size_t free_before = free_bytes_now();
    assert_false(cm_page_heap_resize(left, pages + 1)); /* taken: unchanged */
    assert_int_equal(left->page, first);
    assert_int_equal(left->pages, pages);
    assert_int_equal(right->page, first + pages);
    assert_int_equal(right->pages, 16);
    assert_int_equal(right->state, CM_SPAN_LARGE);
    assert_int_equal(free_bytes_now(), free_before);
    expect_heap_valid();
    cm_page_heap_free(right); /* now a free neighbour of exactly 16 pages */
    cm_span *gap = free_right_neighbour(left);
    assert_non_null(gap);
    assert_int_equal(gap->pages, 16);
    free_before = free_bytes_now();
    assert_false(cm_page_heap_resize(left, pages + 17)); /* too small: unchanged */
    assert_int_equal(left->pages, pages);
    assert_ptr_equal(free_right_neighbour(left), gap);
    assert_int_equal(gap->pages, 16);
    assert_int_equal(free_bytes_now(), free_before);
    expect_heap_valid();
    assert_true(cm_page_heap_resize(left, pages + 16)); /* exactly its size: taken whole */
    assert_int_equal(left->pages, pages + 16);
    assert_int_equal(free_bytes_now(), free_before - 16 * CM_PAGE_SIZE);
    expect_heap_valid();
    cm_page_heap_free(left);
    expect_heap_valid();
}

/* ---- resident and released free spans ---------------------------------------------------- */

/* Written pages between released ones (pages given back, and the fresh chunk's untouched
 * rest): the free spans of the heap's only chunk, left to right, and where the first two
 * start. */
typedef struct {
    uintptr_t released_page, written_page;
} chunk_of_both;

static chunk_of_both released_written_released(void)
{
    cm_page_heap_unmap_free(); /* the chunk below is the heap's only free memory */
    cm_span *a = cm_page_heap_alloc(8, 1, 0), *b = cm_page_heap_alloc(8, 1, 0);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(b->page, a->page + 8);
    fill_pages(a, 8, 1);
    fill_pages(b, 8, 2);
    chunk_of_both chunk = {a->page, b->page};
    cm_page_heap_free(a);
    cm_page_heap_release(true);
    cm_page_heap_free(b);
    expect_heap_valid();
    return chunk;
}

static void resident_pages_go_out_before_released_ones(void **state)
{
    (void)state;
    uintptr_t written = released_written_released().written_page;
    size_t free_bytes, released, large, count;
    cm_page_heap_counters(&free_bytes, &released, &large, &count);
    assert_int_equal(free_bytes, 8 * CM_PAGE_SIZE); /* the written pages alone are resident */
    /* Two requests the written 8 pages hold: both cut from them, though the released pages
     * come first in the address space and the chunk's rest fits too; no released page is
     * taken. */
    cm_span *first = cm_page_heap_alloc(4, 1, 0), *second = cm_page_heap_alloc(1, 1, 1);
    assert_non_null(first);
    assert_non_null(second);
    assert_int_equal(first->page, written);
    assert_int_equal(second->page, written + 4);
    assert_int_equal(((unsigned char *)cm_span_start(second))[0], 2); /* the pages written */
    size_t released_after;
    cm_page_heap_counters(&free_bytes, &released_after, &large, &count);
    assert_int_equal(released_after, released);
    expect_heap_valid();
    second->used = 0;
    cm_page_heap_free(second);
    cm_page_heap_free(first);
    expect_heap_valid();
}

static void a_request_spans_resident_and_released_pages(void **state)
{
    (void)state;
    chunk_of_both chunk = released_written_released();
    size_t mapped = cm_os_mapped_bytes();
    /* The whole chunk: no single free span holds it, the run of the three does. */
    cm_span *whole = cm_page_heap_alloc(CM_HEAP_GROW_MIN / CM_PAGE_SIZE, 1, 0);
    assert_non_null(whole);
    assert_int_equal(whole->page, chunk.released_page);
    assert_int_equal(cm_os_mapped_bytes(), mapped); /* no growth */
    assert_int_equal(
        ((unsigned char *)page_address(whole, chunk.written_page - chunk.released_page))[0], 2);
    expect_heap_valid();
    cm_page_heap_free(whole);
    expect_heap_valid();
}

static void runs_by_request_size(void **state)
{
    (void)state;
    cm_page_heap_unmap_free(); /* the heap's only free pages: the runs below */
    cm_span *whole = cm_page_heap_alloc(600, 1, 0);
    assert_non_null(whole);
    cm_page_heap_free(whole); /* 600 resident pages */
    cm_span *resident = cm_page_heap_alloc(300, 1, 0), *gap = cm_page_heap_alloc(1, 1, 0),
            *released = cm_page_heap_alloc(200, 1, 0), *rest = cm_page_heap_alloc(99, 1, 0);
    assert_non_null(resident);
    assert_non_null(gap);
    assert_non_null(released);
    assert_non_null(rest);
    uintptr_t resident_page = resident->page, released_page = released->page;
    cm_page_heap_free(resident);
    cm_page_heap_free_released(released);
    expect_heap_valid();
    cm_span *large = cm_page_heap_alloc(150, 1, 0); /* above 128 pages: the smaller run */
    assert_non_null(large);
    assert_int_equal(large->page, released_page);
    cm_span *small = cm_page_heap_alloc(100, 1, 0); /* up to 128: a resident run first */
    assert_non_null(small);
    assert_int_equal(small->page, resident_page);
    expect_heap_valid();
    cm_page_heap_free(small);
    cm_page_heap_free(large);
    cm_page_heap_free(gap);
    cm_page_heap_free(rest);
    expect_heap_valid();
}

int main(void)
{
    cm_init();
    /* The tests count free and released pages: a CMALLOC_RELEASE_DELAY_MS in the environment
     * (0 releases at once, -1 never) would change what they count, so they run with the
     * default whatever it says. */
    cm_option.release_delay_ms = CM_DEFAULT_RELEASE_DELAY_MS;
    seed = seed_from_env("test_page_heap");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(split_and_coalesce),
        cmocka_unit_test(random_sequence_keeps_invariants),
        cmocka_unit_test(small_spans_map_every_page),
        cmocka_unit_test(release_returns_free_pages),
        cmocka_unit_test(resize_shrink_gives_back_the_tail),
        cmocka_unit_test(resize_grows_into_a_free_right_neighbour),
        cmocka_unit_test(resize_fails_when_the_neighbour_is_taken_or_too_small),
        /* last: these unmap the free spans */
        cmocka_unit_test(growth_releases_resident_free_pages),
        cmocka_unit_test(resident_pages_go_out_before_released_ones),
        cmocka_unit_test(a_request_spans_resident_and_released_pages),
        cmocka_unit_test(runs_by_request_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
