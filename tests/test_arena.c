/* test_arena.c - linear arenas (cmalloc_arena_*), black box.
 *
 *   alignment_every_power_of_two  alignments 1..65536 (every power of two) between odd sizes:
 *                                 each pointer aligned, no two allocations overlap
 *   nested_marks_and_rewinds      three nested marks: each rewind frees exactly what came after
 *                                 its mark (the next allocation reuses the address), used()
 *                                 follows, earlier data is intact
 *   random_against_model          seeded allocations (alignments 1..4096), marks, rewinds to
 *                                 random open marks and resets against a model (TEST_SEED)
 *   growth_past_the_first_chunk   a 4 KiB arena given 3 MiB in small pieces and one 8 MiB block:
 *                                 contents intact; a rewind across chunks and back up again
 *   reset_reuses_one_chunk        repeated fill + reset cycles settle into one chunk: the same
 *                                 first address every cycle, bytes_in_use flat, from the third
 *   memory_in_stats_and_released  a 64 MiB arena counts in bytes_in_use; destroy takes it out of
 *                                 bytes_in_use and RSS at once
 *   bad_arguments                 EINVAL: create(0), size 0, alignment 0, 3, 48; the arena is
 *                                 unchanged after each
 *   inline_and_exported_agree     the same seeded requests (alignments 1..16384, some past the
 *                                 chunk, some bad) to one arena through cmalloc.h's inline
 *                                 cmalloc_arena_alloc, to another through the exported function:
 *                                 the same errors, the same offsets and used() until a
 *                                 request aligned past the page or a new chunk
 *   death_*                       rewinding forward, to another arena's mark, to a mark freed by
 *                                 a rewind, to a mark from before a reset: SIGABRT, exact message
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cmalloc.h"
#include "helpers.h"

static void alignment_every_power_of_two(void **state)
{
    (void)state;
    cmalloc_arena *arena = cmalloc_arena_create(1000);
    assert_non_null(arena);
    enum { ROUNDS = 4, ALIGNS = 17 };
    static unsigned char *blocks[ROUNDS][ALIGNS];
    for (int r = 0; r < ROUNDS; r++)
        for (int a = 0; a < ALIGNS; a++) {
            size_t align = (size_t)1 << a, size = 1 + 37 * (size_t)(a + r);
            blocks[r][a] = cmalloc_arena_alloc(arena, size, align);
            assert_non_null(blocks[r][a]);
            assert_int_equal((uintptr_t)blocks[r][a] % align, 0);
            memset(blocks[r][a], r * ALIGNS + a, size);
        }
    for (int r = 0; r < ROUNDS; r++)
        for (int a = 0; a < ALIGNS; a++)
            for (size_t k = 0; k < 1 + 37 * (size_t)(a + r); k++)
                assert_int_equal(blocks[r][a][k], r * ALIGNS + a);
    cmalloc_arena_destroy(arena);
}

static void nested_marks_and_rewinds(void **state)
{
    (void)state;
    cmalloc_arena *arena = cmalloc_arena_create(1 << 16);
    char *base = cmalloc_arena_alloc(arena, 100, 16);
    memset(base, 'b', 100);
    size_t used0 = cmalloc_arena_used(arena);
    assert_int_equal(used0, 100);
    size_t m1 = cmalloc_arena_mark(arena);
    char *a = cmalloc_arena_alloc(arena, 200, 16);
    size_t m2 = cmalloc_arena_mark(arena);
    char *b = cmalloc_arena_alloc(arena, 300, 16);
    size_t m3 = cmalloc_arena_mark(arena);
    char *c = cmalloc_arena_alloc(arena, 400, 16);
    assert_true(a < b && b < c);
    cmalloc_arena_rewind(arena, m3);
    assert_ptr_equal(cmalloc_arena_alloc(arena, 400, 16), c);
    cmalloc_arena_rewind(arena, m2);
    assert_ptr_equal(cmalloc_arena_alloc(arena, 300, 16), b);
    cmalloc_arena_rewind(arena, m2); /* twice to the same mark is fine */
    cmalloc_arena_rewind(arena, m1);
    assert_int_equal(cmalloc_arena_used(arena), used0);
    assert_ptr_equal(cmalloc_arena_alloc(arena, 200, 16), a);
    cmalloc_arena_rewind(arena, m1);
    cmalloc_arena_rewind(arena, m1);
    for (int k = 0; k < 100; k++)
        assert_int_equal(base[k], 'b');
    cmalloc_arena_destroy(arena);
}

/* Seeded random allocations, marks, rewinds and resets against a model: every live block keeps
 * its contents, a rewind restores the mark's used() and frees exactly the blocks made after it,
 * blocks never overlap (their patterns would clash). TEST_SEED repeats a run. */
static void random_against_model(void **state)
{
    (void)state;
    uint64_t s = seed_from_env("test_arena: random_against_model") | 1;
    enum { BLOCKS = 4096, MARKS = 64, STEPS = 200000 };
    static struct {
        unsigned char *p;
        size_t size;
        unsigned char fill;
    } live[BLOCKS];
    struct {
        size_t mark, used, blocks;
    } marks[MARKS];
    size_t blocks = 0, depth = 0;
    cmalloc_arena *arena = cmalloc_arena_create(3000);
    for (long step = 0; step < STEPS; step++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        unsigned what = (unsigned)(s % 100);
        if (what < 70 && blocks < BLOCKS) {
            size_t size = 1 + (s >> 8) % 3000, align = (size_t)1 << ((s >> 24) % 13);
            unsigned char *p = cmalloc_arena_alloc(arena, size, align);
            assert_non_null(p);
            assert_int_equal((uintptr_t)p % align, 0);
            live[blocks].p = p, live[blocks].size = size, live[blocks].fill = (unsigned char)step;
            memset(p, (unsigned char)step, size);
            blocks++;
        } else if (what < 85 && depth < MARKS) {
            marks[depth].mark = cmalloc_arena_mark(arena);
            marks[depth].used = cmalloc_arena_used(arena);
            marks[depth++].blocks = blocks;
        } else if (what < 99 && depth > 0) {
            depth = 1 + (s >> 8) % depth; /* back to a random open mark, dropping the later ones */
            cmalloc_arena_rewind(arena, marks[depth - 1].mark);
            assert_int_equal(cmalloc_arena_used(arena), marks[depth - 1].used);
            blocks = marks[--depth].blocks;
        } else if (what == 99) {
            cmalloc_arena_reset(arena);
            assert_int_equal(cmalloc_arena_used(arena), 0);
            blocks = depth = 0;
        }
        if (step % 1000 == 0 || what >= 85)
            for (size_t b = 0; b < blocks; b++)
                assert_true(live[b].p[0] == live[b].fill &&
                            live[b].p[live[b].size - 1] == live[b].fill);
    }
    cmalloc_arena_destroy(arena);
}

static void growth_past_the_first_chunk(void **state)
{
    (void)state;
    cmalloc_arena *arena = cmalloc_arena_create(4096);
    enum { N = 30000, SIZE = 100 };
    static unsigned char *pieces[N];
    size_t half = 0;
    for (int i = 0; i < N; i++) {
        if (i == N / 2)
            half = cmalloc_arena_mark(arena);
        pieces[i] = cmalloc_arena_alloc(arena, SIZE, 16);
        assert_non_null(pieces[i]);
        memset(pieces[i], i & 0xff, SIZE);
    }
    unsigned char *big = cmalloc_arena_alloc(arena, (size_t)8 << 20, 4096);
    assert_non_null(big);
    memset(big, 0x5a, (size_t)8 << 20);
    for (int i = 0; i < N; i++)
        for (int k = 0; k < SIZE; k++)
            assert_int_equal(pieces[i][k], i & 0xff);
    assert_true(cmalloc_arena_used(arena) >= (size_t)N * SIZE + ((size_t)8 << 20));
    cmalloc_arena_rewind(arena, half); /* across chunks */
    assert_ptr_equal(cmalloc_arena_alloc(arena, SIZE, 16), pieces[N / 2]);
    for (int i = N / 2 + 1; i < N; i++) /* and up again through the chunks it gave back */
        memset(pieces[i] = cmalloc_arena_alloc(arena, SIZE, 16), 0x77, SIZE);
    for (int i = 0; i < N / 2; i++)
        assert_int_equal(pieces[i][SIZE - 1], i & 0xff);
    cmalloc_arena_destroy(arena);
}

static void reset_reuses_one_chunk(void **state)
{
    (void)state;
    cmalloc_arena *arena = cmalloc_arena_create(8192);
    void *first = NULL;
    size_t in_use_after_first = 0;
    for (int cycle = 0; cycle < 20; cycle++) {
        void *p = cmalloc_arena_alloc(arena, 64, 16);
        for (int i = 0; i < 20000; i++)
            memset(cmalloc_arena_alloc(arena, 64, 16), cycle, 64);
        cmalloc_arena_reset(arena);
        assert_int_equal(cmalloc_arena_used(arena), 0);
        cmalloc_stats s;
        cmalloc_stats_get(&s);
        if (cycle == 2) { /* the kept chunk doubled once more in cycle 1: from then on it fits */
            first = p;
            in_use_after_first = s.bytes_in_use;
        } else if (cycle > 2) {
            assert_ptr_equal(p, first); /* everything fits in the one chunk kept */
            assert_true(s.bytes_in_use <= in_use_after_first);
        }
    }
    cmalloc_arena_destroy(arena);
    cmalloc_arena_destroy(NULL);
}

static void *filled_arena(size_t bytes)
{
    cmalloc_arena *arena = cmalloc_arena_create(1 << 20);
    for (size_t done = 0; done < bytes; done += 4096)
        memset(cmalloc_arena_alloc(arena, 4096, 64), 1, 4096);
    return arena;
}

static void destroy_arena(void *arena)
{
    cmalloc_arena_destroy(arena);
}

static void memory_in_stats_and_released(void **state)
{
    (void)state;
    expect_in_stats_and_released(filled_arena, destroy_arena, (size_t)64 << 20);
}

/* cmalloc.h's inline cmalloc_arena_alloc and the exported one, given the same requests, give
 * the same answers: the same offset from the chunk's first byte while both stay in it and no
 * alignment exceeded the page (the two chunks' addresses differ above it), the same errno on
 * bad input, the same used() always. */
static void inline_and_exported_agree(void **state)
{
    (void)state;
    uint64_t s = seed_from_env("test_arena: inline_and_exported_agree") | 1;
    cmalloc_arena *fast = cmalloc_arena_create(1 << 16), *called = cmalloc_arena_create(1 << 16);
    /* each arena's first byte: a one-byte allocation, made in both so used() stays equal */
    char *fast0 = cmalloc_arena_alloc(fast, 1, 1), *called0 = cmalloc_arena_alloc(called, 1, 1);
    bool comparable = true;
    for (int i = 0; i < 20000; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        size_t size = s % 7 == 0 ? 0 : (size_t)(s >> 8) % (s % 13 == 0 ? 70000 : 300);
        size_t align = s % 11 == 0 ? (size_t)(s >> 20) % 100 : (size_t)1 << (s >> 32) % 15;
        errno = 0;
        char *a = cmalloc_arena_alloc(fast, size, align);
        int fast_errno = errno;
        errno = 0;
        char *b = (cmalloc_arena_alloc)(called, size, align);
        assert_int_equal(fast_errno, errno);
        assert_true((a == NULL) == (b == NULL));
        /* offsets and used() stay equal up to the first success past the page (the padding
         * differs) or the chunk */
        comparable = comparable && (a == NULL || (align <= 4096 && a >= fast0 &&
                                                  a + size <= fast0 + (1 << 16)));
        if (comparable)
            assert_int_equal(cmalloc_arena_used(fast), cmalloc_arena_used(called));
        if (a != NULL && comparable)
            assert_int_equal(a - fast0, b - called0);
        if (a != NULL)
            assert_int_equal((uintptr_t)a % align, 0);
        if (i % 500 == 499) {
            cmalloc_arena_reset(fast);
            cmalloc_arena_reset(called);
            fast0 = cmalloc_arena_alloc(fast, 1, 1);
            called0 = cmalloc_arena_alloc(called, 1, 1);
            comparable = true;
        }
    }
    cmalloc_arena_destroy(fast);
    cmalloc_arena_destroy(called);
}

static void bad_arguments(void **state)
{
    (void)state;
    errno = 0;
    assert_null(cmalloc_arena_create(0));
    assert_int_equal(errno, EINVAL);
    cmalloc_arena *arena = cmalloc_arena_create(100);
    size_t mark = cmalloc_arena_mark(arena);
    static const struct {
        size_t size, align;
    } cases[] = {{0, 16}, {0, 1}, {16, 0}, {16, 3}, {16, 48}, {16, SIZE_MAX}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        errno = 0;
        assert_null(cmalloc_arena_alloc(arena, cases[i].size, cases[i].align));
        assert_int_equal(errno, EINVAL);
        assert_int_equal(cmalloc_arena_mark(arena), mark);
    }
    errno = 0;
    assert_null(cmalloc_arena_alloc(arena, SIZE_MAX - 64, 16));
    assert_int_equal(errno, ENOMEM);
    assert_int_equal(cmalloc_arena_mark(arena), mark);
    cmalloc_arena_destroy(arena);
}

/* ---- death tests ---------------------------------------------------------------------------- */

typedef struct bad_rewind {
    cmalloc_arena *arena;
    size_t mark;
} bad_rewind;

static void rewind_body(void *arg)
{
    bad_rewind *r = arg;
    cmalloc_arena_rewind(r->arena, r->mark);
}

static void expect_ahead(cmalloc_arena *arena, size_t mark)
{
    char expected[256];
    snprintf(expected, sizeof expected,
             "cmalloc: cmalloc_arena_rewind(): mark %p is ahead of the "
             "arena's position %p (a rewind forward, or a mark from before a reset); aborting\n",
             (void *)mark, (void *)(uintptr_t)cmalloc_arena_mark(arena));
    expect_death(rewind_body, &(bad_rewind){arena, mark}, expected);
}

static void expect_stale(cmalloc_arena *arena, size_t mark)
{
    char expected[320];
    snprintf(expected, sizeof expected,
             "cmalloc: cmalloc_arena_rewind(): mark %p is not a position of arena %p (made "
             "invalid by an earlier rewind past it, or by a reset; the memory there has been "
             "handed out again); aborting\n",
             (void *)mark, (void *)arena);
    expect_death(rewind_body, &(bad_rewind){arena, mark}, expected);
}

static void expect_not_a_position(cmalloc_arena *arena, size_t mark)
{
    char expected[256];
    snprintf(expected, sizeof expected,
             "cmalloc: cmalloc_arena_rewind(): mark %p is not a "
             "position of arena %p (another arena's mark, or one freed by a rewind or reset); "
             "aborting\n",
             (void *)mark, (void *)arena);
    expect_death(rewind_body, &(bad_rewind){arena, mark}, expected);
}

static void death_rewind_forward(void **state)
{
    (void)state;
    cmalloc_arena *arena = cmalloc_arena_create(1 << 16);
    size_t early = cmalloc_arena_mark(arena);
    cmalloc_arena_alloc(arena, 100, 16);
    size_t late = cmalloc_arena_mark(arena);
    cmalloc_arena_rewind(arena, early);
    expect_ahead(arena, late);
    /* A mark in an older chunk, above where that chunk was filled: the first chunk is 72 KiB
     * (64 KiB + its header, in whole pages) and takes 17 blocks of 4096, up to 69,760 bytes
     * from its start; late is 164 bytes from its start. */
    for (int i = 0; i < 30; i++)
        cmalloc_arena_alloc(arena, 4096, 16);
    expect_ahead(arena, late + 72000);
    cmalloc_arena_destroy(arena);
}

static void death_rewind_other_arena(void **state)
{
    (void)state;
    cmalloc_arena *arena = cmalloc_arena_create(1 << 16), *other = cmalloc_arena_create(1 << 16);
    cmalloc_arena_alloc(other, 100, 16);
    expect_not_a_position(arena, cmalloc_arena_mark(other));
    int local;
    expect_not_a_position(arena, (size_t)(uintptr_t)&local);
    expect_not_a_position(arena, 12345);
    cmalloc_arena_destroy(other);
    cmalloc_arena_destroy(arena);
}

static void death_rewind_stale(void **state)
{
    (void)state;
    cmalloc_arena *arena = cmalloc_arena_create(4096);
    size_t start = cmalloc_arena_mark(arena);
    for (int i = 0; i < 100; i++) /* into a second chunk */
        cmalloc_arena_alloc(arena, 100, 16);
    size_t in_second = cmalloc_arena_mark(arena);
    cmalloc_arena_rewind(arena, start);
    expect_not_a_position(arena, in_second);
    cmalloc_arena_alloc(arena, 1000, 16);
    size_t in_first = cmalloc_arena_mark(arena);
    cmalloc_arena_reset(arena); /* keeps the larger second chunk: the first one is gone */
    expect_not_a_position(arena, in_first);
    cmalloc_arena_alloc(arena, 1000, 16);
    size_t before_reset = cmalloc_arena_mark(arena);
    cmalloc_arena_reset(arena); /* keeps the same chunk: the mark is now ahead */
    expect_ahead(arena, before_reset);
    cmalloc_arena_destroy(arena);
}

/* Marks made invalid by a rewind past them or a reset, whose position the cursor has passed
 * again: accepted, the next allocation would overlap a live object. */
static void death_rewind_stale_passed_again(void **state)
{
    (void)state;
    cmalloc_arena *arena = cmalloc_arena_create(1 << 16);
    size_t m1 = cmalloc_arena_mark(arena);
    cmalloc_arena_alloc(arena, 100, 16);
    size_t m2 = cmalloc_arena_mark(arena);
    cmalloc_arena_alloc(arena, 100, 16);
    cmalloc_arena_rewind(arena, m1);
    char *live = cmalloc_arena_alloc(arena, 500, 16); /* covers m2's position */
    memset(live, 'x', 500);
    expect_stale(arena, m2);
    size_t m3 = cmalloc_arena_mark(arena);
    cmalloc_arena_alloc(arena, 100, 16);
    cmalloc_arena_reset(arena);
    cmalloc_arena_alloc(arena, 2000, 16); /* past m3 again */
    expect_stale(arena, m3);
    cmalloc_arena_destroy(arena);
}

/* What stays valid: an outer mark under 100,000 inner rewinds (past the 16 bits of epoch a
 * mark holds), and marks left by rewinds at rising positions, taken back in any order down. */
static void valid_marks_stay_valid(void **state)
{
    (void)state;
    cmalloc_arena *arena = cmalloc_arena_create(1 << 16);
    char *base = cmalloc_arena_alloc(arena, 64, 16);
    size_t outer = cmalloc_arena_mark(arena);
    for (int i = 0; i < 100000; i++) {
        size_t inner = cmalloc_arena_mark(arena);
        memset(cmalloc_arena_alloc(arena, 32, 16), 'i', 32);
        cmalloc_arena_rewind(arena, inner);
    }
    cmalloc_arena_rewind(arena, outer);
    assert_int_equal(cmalloc_arena_used(arena), 64);
    enum { RISING = 40 };
    size_t marks[RISING];
    for (int i = 0; i < RISING; i++) { /* mark, 2 blocks, rewind past the second: rising */
        cmalloc_arena_alloc(arena, 48, 16);
        marks[i] = cmalloc_arena_mark(arena);
        cmalloc_arena_alloc(arena, 48, 16);
        size_t back = cmalloc_arena_mark(arena);
        cmalloc_arena_alloc(arena, 48, 16);
        cmalloc_arena_rewind(arena, back);
    }
    for (int i = RISING - 1; i >= 0; i -= 3)
        cmalloc_arena_rewind(arena, marks[i]);
    cmalloc_arena_rewind(arena, outer);
    assert_ptr_equal(cmalloc_arena_alloc(arena, 16, 16), base + 64);
    cmalloc_arena_destroy(arena);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(alignment_every_power_of_two),
        cmocka_unit_test(nested_marks_and_rewinds),
        cmocka_unit_test(random_against_model),
        cmocka_unit_test(growth_past_the_first_chunk),
        cmocka_unit_test(reset_reuses_one_chunk),
        cmocka_unit_test(memory_in_stats_and_released),
        cmocka_unit_test(bad_arguments),
        cmocka_unit_test(inline_and_exported_agree),
        cmocka_unit_test(death_rewind_forward),
        cmocka_unit_test(death_rewind_other_arena),
        cmocka_unit_test(death_rewind_stale),
        cmocka_unit_test(death_rewind_stale_passed_again),
        cmocka_unit_test(valid_marks_stay_valid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
