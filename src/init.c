/* init.c - lazy, idempotent initialization and the fork handlers.
 *
 * The first slow path of any thread calls cm_init (it may run inside ld.so, a constructor, or
 * before main). One thread initializes; others wait for it. Nothing here allocates before
 * cm_initialized is set; pthread_atfork, which may allocate, runs after.
 * Fork: the prepare handler takes every allocator lock in the order written in internal.h;
 * the parent releases them and the child makes them new, so a child of a multi-threaded
 * parent can allocate. glibc runs prepare handlers in reverse order of registration, so ours
 * must be registered before anyone else's that may allocate: a priority constructor
 * initializes the allocator before ordinary constructors run (in the same module, and for a
 * preloaded library before the program's own).
 */
#define _GNU_SOURCE
#include "internal.h"

#include <stdatomic.h>
#include <unistd.h>

int cm_initialized;
uintptr_t cm_list_key;
static _Atomic int init_started;

static void fork_prepare(void)
{
    cm_check_fork(CM_FORK_PREPARE);
    cm_thread_cache_fork(CM_FORK_PREPARE);
    cm_central_fork(CM_FORK_PREPARE);
    cm_page_heap_fork(CM_FORK_PREPARE);
    cm_pagemap_fork(CM_FORK_PREPARE);
    cm_metadata_fork(CM_FORK_PREPARE);
}

static void fork_finish(int phase)
{
    cm_metadata_fork(phase);
    cm_pagemap_fork(phase);
    cm_page_heap_fork(phase);
    cm_central_fork(phase);
    cm_thread_cache_fork(phase);
    cm_check_fork(phase);
}

static void fork_parent(void) { fork_finish(CM_FORK_PARENT); }
static void fork_child(void) { fork_finish(CM_FORK_CHILD); }

void cm_init(void)
{
    if (atomic_exchange(&init_started, 1) != 0) {
        while (!cm_is_initialized())
            cm_os_yield();
        return;
    }
    cm_list_key = cm_os_random();
    cm_options_init(environ);
    cm_size_class_init();
    cm_thread_cache_init();
    __atomic_store_n(&cm_initialized, 1, __ATOMIC_RELEASE);
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

__attribute__((constructor(101))) static void init_early(void)
{
    if (!cm_is_initialized())
        cm_init();
}
