/* init.c - lazy, idempotent initialization, the release thread's start, and the fork handlers.
 *
 * The first slow path of any thread calls cm_init (it may run inside ld.so, a constructor, or
 * before main). One thread initializes; the others of its process wait for it. A fork that
 * catches another thread in the middle of it leaves the child waiting for a thread it does
 * not have, so the initializer is known by its process id and a child takes the work over.
 * Nothing here allocates before cm_initialized is set; pthread_atfork, which may allocate,
 * runs after. The library's constructor initializes before ordinary constructors run (in the
 * same module, and for a preloaded library before the program's own) and is the one place a
 * thread is ever started (background.c says why).
 *
 * Fork, in glibc's order: the prepare handler takes stdio's list lock, then the locks of the
 * files above this one through the hooks they added (pool.c's THREAD_SAFE pools, once a pool
 * exists: this file never names them), then every allocator lock in the order written in
 * internal.h, and then lets the forking thread allocate while it holds them all (other
 * libraries' atfork handlers run after ours and may allocate: os.c). The parent releases them and
 * the child makes them new, so a child of a multi-threaded parent can allocate. A single-threaded
 * process takes none (os.c's cm_os_fork says why).
 */
#define _GNU_SOURCE
#include "internal.h"

#include <stdatomic.h>
#include <unistd.h>

int cm_initialized;
static _Atomic int init_owner; /* process id of the initializer; 0 before anyone started */
static bool fork_took_locks;   /* written by the forking thread only, read back by it */

/* The fork hooks of the files above: their locks are taken before every allocator lock (they
 * take allocator locks while holding their own), in the order the hooks were added, and given
 * back after them, in reverse. hooks_lock is held from prepare to parent or child, so a hook
 * added while another thread forks waits for the fork to end: a file that has begun to use its
 * locks has its hook in, and the fork takes them. */
#define FORK_HOOKS_MAX 4
static cm_fork_hook fork_hooks[FORK_HOOKS_MAX];
static unsigned fork_hook_count;
static cm_lock hooks_lock = CM_LOCK_INIT;

/* Called before the file first takes a lock the hook covers; adding the same hook again is a
 * no-op. With no allocator lock held. */
void cm_fork_hook_add(cm_fork_hook hook)
{
    cm_lock_acquire(&hooks_lock);
    bool added = false;
    for (unsigned i = 0; i < fork_hook_count; i++)
        added |= fork_hooks[i] == hook;
    CM_ASSERT(added || fork_hook_count < FORK_HOOKS_MAX);
    if (!added && fork_hook_count < FORK_HOOKS_MAX)
        fork_hooks[fork_hook_count++] = hook;
    cm_lock_release(&hooks_lock);
}

static void fork_prepare(void)
{
    fork_took_locks = cm_os_fork(CM_FORK_PREPARE);
    if (!fork_took_locks)
        return;
    cm_lock_fork(&hooks_lock, CM_FORK_PREPARE);
    for (unsigned i = 0; i < fork_hook_count; i++)
        fork_hooks[i](CM_FORK_PREPARE);
    cm_prof_fork(CM_FORK_PREPARE);
    cm_check_fork(CM_FORK_PREPARE);
    cm_thread_cache_fork(CM_FORK_PREPARE);
    cm_central_fork(CM_FORK_PREPARE);
    cm_page_heap_fork(CM_FORK_PREPARE);
    cm_pagemap_fork(CM_FORK_PREPARE);
    cm_metadata_fork(CM_FORK_PREPARE);
    cm_os_fork_locked();
}

static void fork_finish(int phase)
{
    if (!fork_took_locks)
        return;
    cm_metadata_fork(phase);
    cm_pagemap_fork(phase);
    cm_page_heap_fork(phase);
    cm_central_fork(phase);
    cm_thread_cache_fork(phase);
    cm_check_fork(phase);
    cm_prof_fork(phase);
    for (unsigned i = fork_hook_count; i-- > 0;)
        fork_hooks[i](phase);
    cm_lock_fork(&hooks_lock, phase);
    cm_os_fork(phase);
}

static void fork_parent(void)
{
    fork_finish(CM_FORK_PARENT);
}
static void fork_child(void)
{
    fork_finish(CM_FORK_CHILD);
    cm_thread_cache_fork_owner();
}

void cm_init(void)
{
    int self = cm_os_process_id();
    for (;;) {
        if (cm_is_initialized())
            return;
        int owner = atomic_load(&init_owner);
        if (owner == self) { /* another thread of this process is at it */
            cm_os_yield();
            continue;
        }
        /* nobody yet, or a parent process forked us in the middle of it: ours now */
        if (atomic_compare_exchange_strong(&init_owner, &owner, self))
            break;
    }
    cm_list_key = cm_os_random();
    /* the marks' low byte never 0 (internal.h, "free-list links and free marks") */
    cm_free_key = (cm_os_random() & ~(uintptr_t)(CM_ALIGNMENT - 1)) | CM_FREE_MARK_LOW;
    cm_options_init(environ);
    cm_size_class_init();
    cm_thread_cache_init();
    cm_prof_init();
    cm_options_announce();
    __atomic_store_n(&cm_initialized, 1, __ATOMIC_RELEASE);
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

__attribute__((constructor(101))) static void init_early(void)
{
    if (!cm_is_initialized())
        cm_init();
    cm_prof_start();
    cm_background_start();
    cm_stats_exit_init();
}
