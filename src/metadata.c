/* metadata.c - memory for cmalloc's own structures (spans, thread caches), never from malloc.
 *
 * A bump allocator over 64 KiB chunks from the OS; its users recycle what they free themselves
 * (page_heap.c keeps dead span structs). Nothing allocated here is ever unmapped. Lock:
 * metadata_lock, the innermost lock of all (see internal.h), guards the chunk and the byte count.
 */
#include "internal.h"

#define CHUNK_SIZE ((size_t)64 << 10)

static cm_lock metadata_lock = CM_LOCK_INIT;
static char *chunk_next; /* first free byte of the current chunk */
static char *chunk_end;
static size_t metadata_bytes; /* total taken from the OS */

/* Returns zeroed memory aligned to 64 bytes, or NULL when the OS refuses. */
static void *bump_locked(size_t size)
{
    size = (size + 63) & ~(size_t)63;
    if ((size_t)(chunk_end - chunk_next) < size) {
        size_t chunk =
            size > CHUNK_SIZE ? (size + CM_PAGE_SIZE - 1) & ~(CM_PAGE_SIZE - 1) : CHUNK_SIZE;
        char *fresh = cm_os_map(chunk);
        if (fresh == NULL)
            return NULL;
        metadata_bytes += chunk;
        chunk_next = fresh;
        chunk_end = fresh + chunk;
    }
    void *p = chunk_next;
    chunk_next += size;
    return p;
}

void *cm_metadata_alloc(size_t size)
{
    cm_lock_acquire(&metadata_lock);
    void *p = bump_locked(size);
    cm_lock_release(&metadata_lock);
    return p;
}

size_t cm_metadata_bytes(void)
{
    cm_lock_acquire(&metadata_lock);
    size_t bytes = metadata_bytes;
    cm_lock_release(&metadata_lock);
    return bytes;
}

void cm_metadata_fork(int phase)
{
    cm_lock_fork(&metadata_lock, phase);
}
