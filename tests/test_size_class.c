/* test_size_class.c - the size-class table: every size maps to the smallest class that fits,
 * classes are 16-byte multiples, waste stays within 12.5% above 128 B (25% above
 * CM_CLASS_COARSE_FROM), span and batch sizes follow the rules in size_class.c, and an aligned
 * request maps to the smallest aligned class. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "internal.h"

static void every_size_maps_to_smallest_fitting_class(void **state)
{
    (void)state;
    for (size_t n = 0; n <= CM_MAX_SMALL; n++) {
        unsigned c = cm_size_class(n);
        assert_true(c >= 1 && c < cm_class_count);
        assert_true(cm_classes[c].size >= n);
        if (c > 1)
            assert_true(cm_classes[c - 1].size < n);
        if (n > 128 && n <= CM_CLASS_COARSE_FROM)
            assert_true((size_t)(cm_classes[c].size - n) * 8 <= n); /* waste <= 12.5% */
        if (n > CM_CLASS_COARSE_FROM)
            assert_true((size_t)(cm_classes[c].size - n) * 4 <= n); /* waste <= 25% */
    }
    assert_int_equal(cm_classes[cm_size_class(0)].size, 16);
    assert_int_equal(cm_classes[cm_class_count - 1].size, CM_MAX_SMALL);
}

static void classes_are_aligned_and_increasing(void **state)
{
    (void)state;
    assert_true(cm_class_count <= CM_CLASSES_MAX);
    assert_true(cm_class_count < 256); /* spans store the class in a byte */
    for (unsigned c = 1; c < cm_class_count; c++) {
        assert_int_equal(cm_classes[c].size % 16, 0);
        if (c > 1)
            assert_true(cm_classes[c].size > cm_classes[c - 1].size);
        if (cm_classes[c].size <= 128)
            assert_int_equal(cm_classes[c].size, 16 * c);
        if (cm_classes[c].size > CM_SMALL_STEP_MAX)
            assert_int_equal(cm_classes[c].size % 128, 0); /* coarse lookup stays exact */
    }
}

/* 1 KiB and a 16-byte header has a class of its own: it would waste 10% in the next one. */
static void a_kilobyte_and_a_header_fits(void **state)
{
    (void)state;
    assert_int_equal(cm_classes[cm_size_class(1032)].size, 1040);
    assert_int_equal(cm_classes[cm_size_class(1041)].size, 1152);
    assert_int_equal(cm_classes[cm_size_class(1024)].size, 1024);
}

static void spans_and_batches_follow_the_rules(void **state)
{
    (void)state;
    for (unsigned c = 1; c < cm_class_count; c++) {
        const cm_class_info *info = &cm_classes[c];
        size_t span = (size_t)info->pages * CM_PAGE_SIZE;
        assert_true(info->objects >= 1);
        assert_true(info->pages < 256); /* the pagemap keeps a page's place in its span in a byte */
        for (uint64_t offset = 0; offset < 4 * (uint64_t)info->size; offset += 16)
            assert_int_equal(offset * info->divisor_magic < info->divisor_magic,
                             offset % info->size == 0);
        assert_int_equal(info->objects, span / info->size);
        size_t tail = span - (size_t)info->objects * info->size;
        assert_true(tail * CM_SPAN_WASTE_DIVISOR <= span); /* tail waste */
        if (info->size <= CM_SPAN_TIGHT_SIZE) /* small classes: tighter, within a few pages */
            assert_true(tail * CM_SPAN_TIGHT_DIVISOR <= span || info->pages == CM_SPAN_TIGHT_PAGES);
        assert_true(info->batch >= 2 && info->batch <= CM_BATCH_MAX);
        assert_true(info->transfer_capacity >= 2 && info->transfer_capacity <= CM_TRANSFER_SLOTS);
        assert_true((size_t)info->transfer_capacity * info->batch * info->size <=
                    (CM_TRANSFER_BYTES > 2 * info->batch * info->size
                         ? CM_TRANSFER_BYTES
                         : 2 * info->batch * info->size));
    }
}

/* An aligned request's class (cm_aligned_class) is the smallest class from its size's class
 * up whose objects all start on the alignment, or 0 (no class: a page-heap block) when none
 * is; class 0 stays 0, the list the fast paths never find filled. */
static void aligned_classes_are_the_smallest_aligned(void **state)
{
    (void)state;
    for (size_t alignment = 2 * CM_ALIGNMENT; alignment <= CM_PAGE_SIZE; alignment *= 2) {
        assert_int_equal(cm_aligned_class(alignment, 0), 0);
        for (unsigned c = 1; c < cm_class_count; c++) {
            unsigned want = c;
            while (want < cm_class_count && cm_classes[want].size % alignment != 0)
                want++;
            assert_int_equal(cm_aligned_class(alignment, c), want < cm_class_count ? want : 0);
        }
    }
    assert_int_equal(cm_classes[cm_aligned_class(64, cm_size_class(48))].size, 64);
    assert_int_equal(cm_classes[cm_aligned_class(4096, cm_size_class(100))].size, 4096);
}

int main(void)
{
    cm_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_size_maps_to_smallest_fitting_class),
        cmocka_unit_test(classes_are_aligned_and_increasing),
        cmocka_unit_test(spans_and_batches_follow_the_rules),
        cmocka_unit_test(a_kilobyte_and_a_header_fits),
        cmocka_unit_test(aligned_classes_are_the_smallest_aligned),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
