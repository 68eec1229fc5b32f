/* test_central_cache.c - the central cache: fills hand out distinct objects of the class from
 * SMALL spans, carving on to a 128-byte boundary (and faulting in, of a span cut from pages
 * given back to the OS, the pages its links land on and no other; a sandbox refusing that call
 * is asked once), a flushed full batch comes back whole from the transfer cache (no span
 * touched), partial flushes go to spans, and a span whose objects all come back returns to the
 * page heap, a fill takes one span's given-back objects at most; the transfer cache grows past
 * its start only while other threads take its batches. Uses classes the test harness itself
 * never allocates from. */
#define _GNU_SOURCE /* REG_RAX */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

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
    unsigned n = cm_central_fill(c, 7, &head, 0);
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

/* The class of request, which no test here uses, with no object out: its first fill carves a
 * span. */
static unsigned unused_class(size_t request)
{
    unsigned c = cm_size_class(request);
    cm_central_drain(); /* no ready batches: the fill must come from spans */
    size_t cached;
    assert_int_equal(cm_central_objects_out(c, &cached), 0);
    return c;
}

/* A fill carves on to a 128-byte boundary: a thread asking for one object gets every object
 * that shares its lines (or its pair of lines), so no two threads write one line. */
static void carving_ends_on_a_false_sharing_boundary(void **state)
{
    (void)state;
    unsigned c = unused_class(1040);
    const size_t size = cm_classes[c].size;
    unsigned expected = 1;
    while ((expected * size) % CM_FALSE_SHARING != 0 && expected < cm_classes[c].objects)
        expected++;
    assert_true(expected > 1); /* 1040 is no multiple of 128 */
    void *head;
    unsigned n = cm_central_fill(c, 1, &head, 0);
    assert_int_equal(n, expected);
    char *start = cm_span_start(cm_span_of(head)), *end = start;
    for (void *a = head; a; a = cm_link_next(a))
        if ((char *)a + size > end)
            end = (char *)a + size;
    assert_int_equal((size_t)(end - start), expected * size); /* the span's first objects */
    cm_central_flush(c, head, n);
}

/* The bytes a fill's carving of n objects from a span's start writes links to, in whole
 * system pages. */
static size_t link_pages_bytes(unsigned n, size_t size)
{
    size_t end = (n - 1) * size + 2 * sizeof(uintptr_t);
    return (end + CM_SYSTEM_PAGE - 1) & ~(size_t)(CM_SYSTEM_PAGE - 1);
}

/* Carving a span cut from pages given back to the OS faults in the pages its links go to with
 * one call (os.c's cm_os_populate), and only those; a span of resident pages is not asked. */
static void carving_populates_only_pages_given_back(void **state)
{
    (void)state;
    unsigned c = unused_class(2000);
    const size_t size = cm_classes[c].size;
    cm_page_heap_release(true); /* every free page given back: the span will be cut from them */
    size_t before = cm_os_populated_bytes();
    void *head;
    const unsigned per_span = cm_classes[c].objects; /* a fresh span's fill carves them all */
    unsigned n = cm_central_fill(c, per_span, &head, 0);
    assert_true(n == per_span && link_pages_bytes(n, size) > CM_SYSTEM_PAGE);
    cm_span *span = cm_span_of(head);
    assert_true(span->released);
    for (void *a = head; a; a = cm_link_next(a))
        assert_ptr_equal(cm_span_of(a), span);
    assert_int_equal(cm_os_populated_bytes() - before, link_pages_bytes(n, size));
    cm_central_flush(c, head, n); /* less than a batch: to the span, which empties */
    cm_central_drain();
    size_t cached;
    assert_int_equal(cm_central_objects_out(c, &cached), 0);

    before = cm_os_populated_bytes();
    n = cm_central_fill(c, per_span, &head, 0);
    span = cm_span_of(head);
    assert_int_equal(cm_os_populated_bytes() - before,
                     span->released ? link_pages_bytes(n, size) : 0);
    cm_central_flush(c, head, n);
}

/* Objects above a page: only the page of each carved link is asked for, never the pages
 * between, which a program using the start of a large block does not touch. */
static void carving_populates_no_page_between_large_objects(void **state)
{
    (void)state;
    unsigned c = unused_class(20000);
    const size_t size = cm_classes[c].size;
    assert_true(size > 2 * CM_SYSTEM_PAGE);
    cm_page_heap_release(true);
    size_t before = cm_os_populated_bytes();
    void *head;
    unsigned n = cm_central_fill(c, cm_classes[c].objects, &head, 0);
    assert_true(n >= 2 && cm_span_of(head)->released);
    assert_int_equal(cm_os_populated_bytes() - before, (size_t)n * CM_SYSTEM_PAGE);
    cm_central_flush(c, head, n);
}

/* ---- a sandbox that refuses MADV_POPULATE_WRITE ---------------------------------------------
 * As seccomp policies that allow madvise only for the advice they know do (Chromium's returns
 * EPERM): the filter traps the call, the handler counts it and makes it fail with EPERM. */
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
static volatile sig_atomic_t refused_calls;

static void refuse_population(int signal, siginfo_t *info, void *context)
{
    (void)signal, (void)info;
    ucontext_t *uc = context;
    refused_calls++;
#if defined(__x86_64__)
    uc->uc_mcontext.gregs[REG_RAX] = -EPERM;
#elif defined(__aarch64__)
    uc->uc_mcontext.regs[0] = (unsigned long)-EPERM;
#else
#error "the test's SIGSYS handler sets the return register of x86-64 and AArch64 only"
#endif
}

static bool refuse_population_from_now_on(void)
{
    struct sock_filter program[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_madvise, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[2])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, MADV_POPULATE_WRITE, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog filter = {.len = sizeof program / sizeof program[0], .filter = program};
    struct sigaction action = {.sa_sigaction = refuse_population, .sa_flags = SA_SIGINFO};
    return sigaction(SIGSYS, &action, NULL) == 0 && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
           prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &filter) == 0;
}

/* Whether this kernel has MADV_POPULATE_WRITE (Linux 5.14): where it has not, the process may
 * have stopped asking at an EINVAL before the sandbox below. */
static bool kernel_populates(void)
{
    void *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(page != MAP_FAILED);
    bool populates = madvise(page, 4096, MADV_POPULATE_WRITE) == 0;
    munmap(page, 4096);
    return populates;
}

/* Under such a sandbox, carving fresh spans still hands out whole, writable objects, and the
 * kernel is asked once (at most once where it lacks the advice): the refusal stops the asking
 * (os.c's cm_os_populate). In a child, whose filter goes with it. */
static void a_sandbox_that_refuses_population_is_asked_once(void **state)
{
    (void)state;
    const bool populates = kernel_populates();
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        if (!refuse_population_from_now_on())
            _exit(2);
        for (size_t request = 2500; request <= 9500; request += 1000) {
            cm_page_heap_release(true); /* the spans cut next are cut from released pages */
            unsigned c = cm_size_class(request);
            void *head;
            unsigned n = cm_central_fill(c, 3 * cm_classes[c].objects, &head, 0);
            if (n != 3 * cm_classes[c].objects)
                _exit(3);
            for (void *a = head, *next; a; a = next) {
                next = cm_link_next(a);
                memset(a, 0x5a, cm_classes[c].size);
            }
        }
        bool once = populates ? refused_calls == 1 : refused_calls <= 1;
        _exit(once ? 0 : 10 + (refused_calls > 9 ? 9 : refused_calls));
    }
    int status;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0); /* 2: no filter; 3: a short fill; 1x: x calls */
}

static void full_batch_round_trips_through_transfer_cache(void **state)
{
    (void)state;
    unsigned c = test_class(), batch = cm_classes[c].batch;
    void *head;
    unsigned n = cm_central_fill(c, batch, &head, 0);
    assert_int_equal(n, batch);
    size_t cached;
    size_t out = cm_central_objects_out(c, &cached);
    cm_central_flush(c, head, n);
    size_t cached_after;
    assert_int_equal(cm_central_objects_out(c, &cached_after), out); /* spans untouched */
    assert_int_equal(cached_after, cached + batch);
    void *again;
    assert_int_equal(cm_central_fill(c, 1, &again, 0), batch); /* the whole batch comes back */
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
    unsigned n = cm_central_fill(c, 3 * cm_classes[c].objects, &head, 0);
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

/* Two full spans, one object given back to each: a fill that asks for both gets one, from
 * one span (taking the second span's list would mean walking the first's to its end). */
static void a_fill_takes_one_span_of_given_back_objects(void **state)
{
    (void)state;
    unsigned c = cm_size_class(6000), per_span = cm_classes[c].objects;
    cm_central_drain();
    void *head;
    unsigned n = cm_central_fill(c, 2 * per_span, &head, 0);
    assert_true(n >= 2 * per_span);
    void *objects[n], *first_span = NULL, *second_span = NULL;
    for (unsigned i = 0; i < n; i++, head = cm_link_next(head)) {
        objects[i] = head;
        if (first_span == NULL)
            first_span = head;
        else if (second_span == NULL && cm_pagemap_lookup(head) != cm_pagemap_lookup(first_span))
            second_span = head;
    }
    assert_non_null(second_span);
    for (unsigned i = 0; i < n; i++) /* back one at a time: to the spans, not as a batch */
        if (objects[i] == first_span || objects[i] == second_span) {
            cm_link_relink(objects[i], NULL);
            cm_central_flush(c, objects[i], 1);
        }
    void *again;
    assert_int_equal(cm_central_fill(c, 2, &again, 0), 1);
    assert_true(again == first_span || again == second_span);
    cm_link_relink(again, NULL);
    cm_central_flush(c, again, 1);
    for (unsigned i = 0; i < n; i++)
        if (objects[i] != first_span && objects[i] != second_span) {
            cm_link_relink(objects[i], NULL);
            cm_central_flush(c, objects[i], 1);
        }
    assert_true(cm_heap_check());
}

static void idle_batches_return_to_spans(void **state)
{
    (void)state;
    unsigned c = test_class(), batch = cm_classes[c].batch;
    int64_t saved_delay = cm_option.release_delay_ms;
    cm_option.release_delay_ms = 20;
    cm_central_drain();
    void *head;
    assert_int_equal(cm_central_fill(c, batch, &head, 0), batch);
    cm_central_flush(c, head, batch);
    size_t cached;
    cm_central_objects_out(c, &cached);
    assert_int_equal(cached, batch);
    /* A batch nobody takes goes back to its spans within two intervals of the decay tick
     * (the first interval it lives through sets the low-water mark). */
    uint64_t start = cm_os_now_ms();
    while (cached != 0 && cm_os_now_ms() - start < 3000) {
        cm_os_sleep_ms(5);
        cm_central_tick(cm_os_now_ms());
        cm_central_objects_out(c, &cached);
    }
    assert_int_equal(cached, 0);
    assert_true(cm_os_now_ms() - start >= 20); /* not at once: only after idling */
    assert_true(cm_heap_check());
    cm_option.release_delay_ms = saved_delay;
}

/* Exactly a batch of class c, from as many fills as it takes (a fill takes at most one span's
 * given-back objects); what the last fill gave beyond it goes back. */
static void *fill_batch(unsigned c)
{
    unsigned batch = cm_classes[c].batch, have = 0;
    void *head = NULL;
    while (have < batch) {
        void *part;
        unsigned n = cm_central_fill(c, batch - have, &part, 0);
        assert_true(n > 0);
        while (part != NULL && have < batch) {
            void *next = cm_link_next(part);
            cm_link_relink(part, head);
            head = part;
            part = next;
            have++;
            n--;
        }
        if (n > 0)
            cm_central_flush(c, part, n);
    }
    return head;
}

/* Flushes count whole batches of class c (filled first) from the calling thread; returns the
 * objects the transfer cache then holds. */
static size_t flush_batches(unsigned c, unsigned count)
{
    unsigned batch = cm_classes[c].batch;
    void *heads[64];
    for (unsigned i = 0; i < count; i++)
        heads[i] = fill_batch(c);
    for (unsigned i = 0; i < count; i++)
        cm_central_flush(c, heads[i], batch);
    size_t cached;
    cm_central_objects_out(c, &cached);
    return cached;
}

static unsigned shared_class;
static void *take_one_batch(void *arg)
{
    (void)arg;
    void *head;
    unsigned n = cm_central_fill(shared_class, cm_classes[shared_class].batch, &head, 0);
    cm_central_flush(shared_class, head, n); /* back, as this thread's own */
    return NULL;
}

static void transfer_limit_grows_only_while_batches_change_threads(void **state)
{
    (void)state;
    unsigned c = cm_size_class(3000), batch = cm_classes[c].batch;
    size_t start = (size_t)cm_classes[c].transfer_capacity * batch;
    int64_t saved_delay = cm_option.release_delay_ms;
    cm_option.release_delay_ms = -1; /* no decay tick while it grows */
    cm_central_drain();
    /* One thread alone: the surplus goes back to spans. */
    assert_int_equal(flush_batches(c, 4 * cm_classes[c].transfer_capacity), start);
    /* Another thread takes a batch this one flushed: the limit doubles on each overflow. */
    shared_class = c;
    pthread_t thread;
    assert_int_equal(pthread_create(&thread, NULL, take_one_batch, NULL), 0);
    pthread_join(thread, NULL);
    size_t grown = flush_batches(c, 4 * cm_classes[c].transfer_capacity);
    assert_true(grown > start);
    assert_true(grown <= (size_t)CM_TRANSFER_SLOTS * batch);
    assert_true(grown * cm_classes[c].size <= CM_TRANSFER_SHARED_BYTES + 2 * batch * 3072);
    /* Decay ticks with no batch changing threads halve it back to the start. */
    cm_option.release_delay_ms = 10;
    size_t cached = grown;
    uint64_t begin = cm_os_now_ms();
    while (cached != start && cm_os_now_ms() - begin < 3000) {
        cm_os_sleep_ms(12);
        cm_central_tick(cm_os_now_ms());
        cm_central_drain();
        cached = flush_batches(c, 4 * cm_classes[c].transfer_capacity);
    }
    assert_int_equal(cached, start);
    cm_central_drain();
    assert_true(cm_heap_check());
    cm_option.release_delay_ms = saved_delay;
}

int main(void)
{
    cm_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fill_hands_out_distinct_objects),
        cmocka_unit_test(carving_ends_on_a_false_sharing_boundary),
        cmocka_unit_test(carving_populates_no_page_between_large_objects),
        cmocka_unit_test(carving_populates_only_pages_given_back),
        cmocka_unit_test(a_sandbox_that_refuses_population_is_asked_once),
        cmocka_unit_test(full_batch_round_trips_through_transfer_cache),
        cmocka_unit_test(empty_spans_return_to_the_page_heap),
        cmocka_unit_test(a_fill_takes_one_span_of_given_back_objects),
        cmocka_unit_test(idle_batches_return_to_spans),
        cmocka_unit_test(transfer_limit_grows_only_while_batches_change_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
