/* test_free_list_encoding.c - free-list links are stored encoded (internal.h), so a write into
 * freed memory cannot steer malloc to an address of the writer's choosing: the corrupted link
 * is reported (abort with "corrupted free list") or decodes to some other address, never to
 * the one written (that address may fault when read: a crash, never a steered allocation). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "helpers.h"

/* Grows the class's list so that freeing what was just taken never overflows into a flush. */
static void warm_up(size_t size)
{
    void *objects[100];
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < 100; i++)
            objects[i] = malloc(size);
        for (int i = 0; i < 100; i++)
            free(objects[i]);
    }
}

static void links_are_not_stored_in_the_clear(void **state)
{
    (void)state;
    warm_up(48);
    void *a = malloc(48), *b = malloc(48);
    free(a);
    free(b); /* b's link now leads to a */
    assert_ptr_not_equal(*(void **)b, a);
    assert_ptr_equal(cm_link_next(b), a);
    assert_ptr_equal(malloc(48), b);
    assert_ptr_equal(malloc(48), a);
    free(a);
    free(b);
}

/* In the child: the use-after-free write of *target into a freed object's link, then two
 * mallocs; exits 0 when the second is not the written address. */
static void write_link_and_allocate(void *target)
{
    warm_up(80);
    void *first = malloc(80), *second = malloc(80);
    free(second);
    free(first);                              /* first heads the list, linking to second */
    memcpy(first, target, sizeof(uintptr_t)); /* the use-after-free write */
    void *again = malloc(80);
    void *steered = malloc(80);
    _exit(again == first && steered != *(void **)target ? 0 : 3);
}

static void use_after_free_write_cannot_choose_the_next_pointer(void **state)
{
    (void)state;
    static const uintptr_t targets[] = {0x4141414141414140u, 0x7ffff7dd0000u, 0x10000u};
    static child_result result;
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
        child_spec spec = {.body = write_link_and_allocate, .arg = (void *)&targets[i]};
        run_child(&spec, &result);
        int status = result.status;
        if (WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT) {
            assert_non_null(strstr(result.output, "cmalloc: corrupted free list at 0x"));
        } else if (WIFSIGNALED(status)) {
            /* 1 time in 16 the garbage decodes to an aligned address and reading it faults:
             * a crash, but not the written address handed out. */
            assert_int_equal(WTERMSIG(status), SIGSEGV);
        } else {
            assert_true(WIFEXITED(status));
            assert_int_equal(WEXITSTATUS(status), 0);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(links_are_not_stored_in_the_clear),
        cmocka_unit_test(use_after_free_write_cannot_choose_the_next_pointer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
