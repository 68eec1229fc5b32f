/* test_central_cache.c - the central cache: fills hand out distinct objects of the class from
 * SMALL spans, a flushed full batch comes back whole from the transfer cache (no span
 * touched), partial flushes go to spans, and a span whose objects all come back returns to
 * the page heap. Uses a class the test harness itself never allocates from. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "internal.h"

static unsigned test_class(void)
{
    return cm_size_class(180 * 1024);
}

static unsigned list_length(void *head)
{
    unsigned n = 0;
    for (; head; head = cm_link_next(head))
        n++;
    return n;
}

static void fill_hands_out_distinct_objects(void **state)
{
    (void)state;
    unsigned c = cm_size_class(3000);
    void *head;
    cm_central_drain(); /* no ready batches: the fill must come from spans */
    size_t cached, before = cm_central_objects_out(c, &cached);
    unsigned n = cm_central_fill(c, 7, &head);
    assert_int_equal(n, 7);
    assert_int_equal(list_length(head), n);
    assert_int_equal(cm_central_objects_out(c, &cached), before + n);
    for (void *a = head; a; a = cm_link_next(a)) {
        cm_span *span = cm_span_of(a);
        assert_non_null(span);
        assert_int_equal(span->state, CM_SPAN_SMALL);
        assert_int_equal(span->size_class, c);
        assert_int_equal(((char *)a - (char *)cm_span_start(span)) % cm_classes[c].size, 0);
        for (void *b = cm_link_next(a); b; b = cm_link_next(b))
            assert_ptr_not_equal(a, b);
    }
    cm_central_flush(c, head, n);
}

static void full_batch_round_trips_through_transfer_cache(void **state)
{
    (void)state;
    unsigned c = test_class(), batch = cm_classes[c].batch;
    void *head;
    unsigned n = cm_central_fill(c, batch, &head);
    assert_int_equal(n, batch);
    size_t cached;
    size_t out = cm_central_objects_out(c, &cached);
    cm_central_flush(c, head, n);
    size_t cached_after;
    assert_int_equal(cm_central_objects_out(c, &cached_after), out); /* spans untouched */
    assert_int_equal(cached_after, cached + batch);
    void *again;
    assert_int_equal(cm_central_fill(c, 1, &again), batch); /* the whole batch comes back */
    assert_ptr_equal(again, head);
    cm_central_flush(c, again, batch);
}

static void empty_spans_return_to_the_page_heap(void **state)
{
    (void)state;
    unsigned c = test_class();
    cm_central_drain();
    size_t cached, out = cm_central_objects_out(c, &cached);
    assert_int_equal(cached, 0);
    size_t free_before, released, large, count;
    void *head;
    unsigned n = cm_central_fill(c, 3 * cm_classes[c].objects, &head);
    assert_int_equal(n, 3 * cm_classes[c].objects);
    assert_int_equal(cm_central_objects_out(c, &cached), out + n);
    cm_page_heap_counters(&free_before, &released, &large, &count);
    size_t released_before = released;
    assert_true(cm_heap_check());
    cm_central_flush(c, head, n); /* not a batch: goes to the spans, which empty */
    assert_true(cm_heap_check());
    assert_int_equal(cm_central_objects_out(c, &cached), out);
    size_t free_after;
    cm_page_heap_counters(&free_after, &released, &large, &count);
    assert_true(free_after + released - free_before - released_before >=
                3 * (size_t)cm_classes[c].pages * CM_PAGE_SIZE);
    assert_true(cm_page_heap_valid());
}

static void idle_batches_return_to_spans(void **state)
{
    (void)state;
    unsigned c = test_class(), batch = cm_classes[c].batch;
    int64_t saved_delay = cm_option.release_delay_ms;
    cm_option.release_delay_ms = 20;
    cm_central_drain();
    void *head;
    assert_int_equal(cm_central_fill(c, batch, &head), batch);
    cm_central_flush(c, head, batch);
    size_t cached;
    cm_central_objects_out(c, &cached);
    assert_int_equal(cached, batch);
    /* A batch nobody takes goes back to its spans within two intervals of the decay tick
     * (the first interval it lives through sets the low-water mark). */
    uint64_t start = cm_os_now_ms();
    while (cached != 0 && cm_os_now_ms() - start < 3000) {
        cm_os_sleep_ms(5);
        cm_central_tick();
        cm_central_objects_out(c, &cached);
    }
    assert_int_equal(cached, 0);
    assert_true(cm_os_now_ms() - start >= 20); /* not at once: only after idling */
    assert_true(cm_heap_check());
    cm_option.release_delay_ms = saved_delay;
}

int main(void)
{
    cm_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fill_hands_out_distinct_objects),
        cmocka_unit_test(full_batch_round_trips_through_transfer_cache),
        cmocka_unit_test(empty_spans_return_to_the_page_heap),
        cmocka_unit_test(idle_batches_return_to_spans),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
