/* stats.c - the public statistics: cmalloc_stats_get and cmalloc_stats_print.
 *
 * Counters are read from each layer under its own lock, one layer at a time, so the result
 * is a snapshot that may be off by what other threads did meanwhile, never a torn number.
 * cm_heap_check walks every layer's invariants. Nothing here allocates: the report is formatted on
 * the stack and written with write(2). Every report (text or JSON) starts with the process id
 * and the program's name, so the reports of a command that runs other programs tell apart.
 * The report at exit (CMALLOC_STATS=1 or json) is stats_exit.c's.
 */
#include "internal.h"
#include "cmalloc.h"

#include <stdlib.h>
#include <string.h>

CM_EXPORT int cmalloc_stats_get(cmalloc_stats *stats)
{
    memset(stats, 0, sizeof *stats);
    if (!cm_is_initialized())
        return 0;
    size_t small_out = 0, small_cached = 0;
    for (unsigned c = 1; c < cm_class_count; c++) {
        size_t cached;
        small_out += cm_central_objects_out(c, &cached) * cm_classes[c].size;
        small_cached += cached * cm_classes[c].size;
    }
    size_t large_bytes, mapped_count;
    stats->bytes_thread_caches = cm_thread_cache_bytes(&stats->thread_caches);
    stats->bytes_central_cache = small_cached;
    cm_page_heap_counters(&stats->bytes_page_heap_free, &stats->bytes_released, &large_bytes,
                          &stats->large_allocations);
    size_t mapped_live = cm_mapped_live_bytes(&mapped_count);
    /* Freed sample pages the profiler keeps for its next samples are spans to the page heap but
     * not allocations, nor in use; nor are freed blocks in the debug mode's quarantine. */
    size_t stashed = cm_prof_stashed_pages(); /* read apart from the heap's counters: clamp */
    stats->large_allocations =
        (stats->large_allocations > stashed ? stats->large_allocations - stashed : 0) +
        mapped_count;
    size_t held = small_cached + stats->bytes_thread_caches + cm_check_quarantined_bytes() +
                  (stashed << CM_PAGE_SHIFT);
    size_t out = small_out + large_bytes + mapped_live;
    stats->bytes_in_use = out > held ? out - held : 0;
    stats->bytes_mapped = cm_os_mapped_bytes();
    stats->bytes_metadata = cm_metadata_bytes() + cm_pagemap_bytes();
    return 0;
}

static void line(cm_message *m, int fd, const char *label, size_t value, const char *unit)
{
    cm_message_str(m, label);
    cm_message_uint(m, value);
    cm_message_str(m, unit);
    cm_message_write(m, fd);
}

CM_EXPORT void cmalloc_stats_print(int fd)
{
    cmalloc_stats s;
    cm_message m = {.length = 0};
    cmalloc_stats_get(&s);
    cm_message_str(&m, "cmalloc stats (version " CMALLOC_VERSION "): pid ");
    cm_message_uint(&m, (uint64_t)cm_os_process_id());
    cm_message_str(&m, ", program ");
    cm_message_str(&m, cm_os_program_name());
    cm_message_str(&m, "\n");
    line(&m, fd, "  in use:            ", s.bytes_in_use, " bytes\n");
    line(&m, fd, "  mapped:            ", s.bytes_mapped, " bytes\n");
    line(&m, fd, "  released to OS:    ", s.bytes_released, " bytes (mapped, not resident)\n");
    line(&m, fd, "  page heap free:    ", s.bytes_page_heap_free, " bytes\n");
    line(&m, fd, "  central caches:    ", s.bytes_central_cache, " bytes\n");
    line(&m, fd, "  thread caches:     ", s.bytes_thread_caches, " bytes\n");
    line(&m, fd, "  metadata:          ", s.bytes_metadata, " bytes\n");
    line(&m, fd, "  large allocations: ", s.large_allocations, "\n");
    line(&m, fd, "  live threads:      ", s.thread_caches, " with a cache\n");
    cm_message_str(&m, "  options:\n");
    cm_message_write(&m, fd);
    cm_options_print(fd);
    cm_prof_stats_print(fd);
    cm_message_str(&m, "  class     size  pages  batch   objects out\n");
    cm_message_write(&m, fd);
    if (!cm_is_initialized())
        return;
    for (unsigned c = 1; c < cm_class_count; c++) {
        size_t cached, out = cm_central_objects_out(c, &cached);
        if (out == 0)
            continue;
        cm_message_str(&m, "  ");
        cm_message_uint(&m, c);
        cm_message_str(&m, "\t");
        cm_message_uint(&m, cm_classes[c].size);
        cm_message_str(&m, "\t");
        cm_message_uint(&m, cm_classes[c].pages);
        cm_message_str(&m, "\t");
        cm_message_uint(&m, cm_classes[c].batch);
        cm_message_str(&m, "\t");
        cm_message_uint(&m, out);
        cm_message_str(&m, "\n");
        cm_message_write(&m, fd);
    }
}

CM_EXPORT size_t cmalloc_release(void)
{
    if (!cm_is_initialized())
        return 0;
    cm_thread_cache_flush_current();
    cm_central_drain();
    cm_prof_release_stash();
    return cm_page_heap_release(true);
}

/* The whole-heap consistency walk used by the fuzzer and tests: every layer's invariants
 * (page heap lists and coalescing, central spans and batches, this thread's cache). */
bool cm_heap_check(void)
{
    if (!cm_is_initialized())
        return true;
    return cm_thread_cache_valid() && cm_central_valid() && cm_page_heap_valid();
}

#ifdef CM_DEBUG
void cm_assert_failed(const char *file, int line, const char *what)
{
    cm_message m = {.length = 0};
    cm_message_str(&m, "cmalloc: internal check failed at ");
    cm_message_str(&m, file);
    cm_message_str(&m, ":");
    cm_message_uint(&m, (uint64_t)line);
    cm_message_str(&m, ": ");
    cm_message_str(&m, what);
    cm_message_str(&m, "; aborting\n");
    cm_message_write(&m, 2);
    abort();
}

/* Called by the slow paths with no allocator lock held. */
void cm_debug_walk(void)
{
    static _Atomic unsigned long calls;
    if (__atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED) % CM_DEBUG_WALK_EVERY == 0)
        CM_ASSERT(cm_heap_check());
}
#endif
