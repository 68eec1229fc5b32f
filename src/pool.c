/* pool.c - object pools (cmalloc_pool_*): fixed-size objects carved from slabs, freed all at
 * once by cmalloc_pool_destroy.
 *
 *   slab:  | next slab (16 B) | object | object | ... |     from cm_alloc, 16-byte aligned
 *
 * A pool is a free list of returned objects plus a bump pointer into the newest slab, so an
 * alloc or free is a few instructions. With CMALLOC_POOL_THREAD_SAFE, allocations take the
 * pool's lock, and frees push onto a lock-free stack (remote_free) that an allocation takes
 * whole when its own list runs dry: a thread that only frees (a consumer) never contends with
 * the thread that allocates. Without the flag one thread at a time uses the pool.
 * Invariant: every object handed out lies in one of the pool's slabs.
 */
#include "internal.h"
#include "cmalloc.h"

#include <errno.h>
#include <stdatomic.h>

#define SLAB_HEADER 16
#define SLAB_MIN ((size_t)64 << 10)

struct cmalloc_pool {
    cm_lock lock;
    unsigned flags;
    size_t object_size;      /* request rounded up to 16 */
    size_t slab_size;
    void *free_objects;      /* returned objects, linked through their first word */
    void *_Atomic remote_free; /* THREAD_SAFE: objects freed since the last take, a stack */
    char *bump, *limit;      /* never-used space in the newest slab */
    void *slabs;             /* linked through their first word */
};

CM_EXPORT cmalloc_pool *cmalloc_pool_create(size_t object_size, unsigned flags)
{
    if (object_size == 0 || object_size > ((size_t)1 << 30) || (flags & ~CMALLOC_POOL_THREAD_SAFE)) {
        errno = EINVAL;
        return NULL;
    }
    cmalloc_pool *pool = cm_alloc(sizeof *pool);
    if (pool == NULL)
        return NULL;
    *pool = (cmalloc_pool){.lock = CM_LOCK_INIT, .flags = flags};
    pool->object_size = (object_size + 15) & ~(size_t)15;
    pool->slab_size = SLAB_HEADER + 16 * pool->object_size;
    if (pool->slab_size < SLAB_MIN)
        pool->slab_size = SLAB_MIN;
    return pool;
}

static void *alloc_locked(cmalloc_pool *pool)
{
    if (pool->free_objects == NULL && (pool->flags & CMALLOC_POOL_THREAD_SAFE))
        pool->free_objects = atomic_exchange_explicit(&pool->remote_free, NULL, memory_order_acquire);
    void *object = pool->free_objects;
    if (object != NULL) {
        pool->free_objects = *(void **)object;
        return object;
    }
    if ((size_t)(pool->limit - pool->bump) < pool->object_size) {
        char *slab = cm_alloc(pool->slab_size);
        if (slab == NULL)
            return NULL;
        *(void **)slab = pool->slabs;
        pool->slabs = slab;
        pool->bump = slab + SLAB_HEADER;
        pool->limit = slab + pool->slab_size;
    }
    object = pool->bump;
    pool->bump += pool->object_size;
    return object;
}

CM_EXPORT void *cmalloc_pool_alloc(cmalloc_pool *pool)
{
    if (!(pool->flags & CMALLOC_POOL_THREAD_SAFE))
        return alloc_locked(pool);
    cm_lock_acquire(&pool->lock);
    void *object = alloc_locked(pool);
    cm_lock_release(&pool->lock);
    return object;
}

CM_EXPORT void cmalloc_pool_free(cmalloc_pool *pool, void *object)
{
    if (object == NULL)
        return;
    if (!(pool->flags & CMALLOC_POOL_THREAD_SAFE)) {
        *(void **)object = pool->free_objects;
        pool->free_objects = object;
        return;
    }
    /* A push needs no lock and has no ABA problem: only whole-stack takes pop. */
    void *head = atomic_load_explicit(&pool->remote_free, memory_order_relaxed);
    do
        *(void **)object = head;
    while (!atomic_compare_exchange_weak_explicit(&pool->remote_free, &head, object,
                                                  memory_order_release, memory_order_relaxed));
}

CM_EXPORT void cmalloc_pool_destroy(cmalloc_pool *pool)
{
    if (pool == NULL)
        return;
    for (void *slab = pool->slabs, *next; slab; slab = next) {
        next = *(void **)slab;
        cm_free(slab);
    }
    cm_free(pool);
}
