/* override.c - the exported entry points and nothing else: the malloc family, glibc's extras
 * and internal aliases (C++ operator new/delete are operator_new.c's). Each is a thin wrapper
 * over internal.h.
 *
 * Behaviour that differs between libcs follows glibc: realloc(p, 0) frees p and returns NULL;
 * memalign rounds a non-power-of-two alignment up; aligned_alloc rejects one with EINVAL;
 * valloc/pvalloc align to 4096 bytes; mallopt honours M_MMAP_THRESHOLD and accepts (and
 * ignores) glibc's other parameters, answering as glibc 2.36 does (1, but 0 for an M_MXFAST
 * outside 0..160).
 *
 * Built with -DCM_PREFIX=name_ (the sanitizer build), the C entry points are exported as
 * name_malloc, name_free, ... and glibc's aliases and the C++ operators are left out, so the
 * library can run beside another allocator (ThreadSanitizer's) instead of replacing it.
 */
#define _GNU_SOURCE
#include "fastpath.h"
#include "cmalloc.h"

#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#ifdef CM_PREFIX
#define CM_GLUE(prefix, name)        prefix##name
#define CM_EXPAND_GLUE(prefix, name) CM_GLUE(prefix, name)
#define CM_ENTRY(name)               CM_EXPAND_GLUE(CM_PREFIX, name)
#else
#define CM_ENTRY(name) name
#endif

/* malloc and free start on a cache line: otherwise where their hot paths fall across lines
 * shifts with every change to the rest of the library, and the benchmarks with it. */
#define CM_LINE_ALIGNED __attribute__((aligned(CM_CACHE_LINE)))
CM_EXPORT CM_LINE_ALIGNED void *CM_ENTRY(malloc)(size_t size)
{
    return cm_alloc(size);
}
CM_EXPORT CM_LINE_ALIGNED void CM_ENTRY(free)(void *p)
{
    cm_free(p);
}
CM_EXPORT void CM_ENTRY(cfree)(void *p);
CM_EXPORT void CM_ENTRY(cfree)(void *p)
{
    cm_free(p);
}
CM_EXPORT void *CM_ENTRY(calloc)(size_t count, size_t size)
{
    return cm_calloc(count, size);
}
CM_EXPORT void *CM_ENTRY(realloc)(void *p, size_t size)
{
    return cm_realloc(p, size);
}
CM_EXPORT size_t CM_ENTRY(malloc_usable_size)(void *p)
{
    return cm_malloc_usable_size(p);
}

/* C23's sized frees, not declared by glibc before 2.43: compound.c's cm_free_sized says what
 * they check. */
CM_EXPORT void CM_ENTRY(free_sized)(void *p, size_t size);
CM_EXPORT void CM_ENTRY(free_sized)(void *p, size_t size)
{
    cm_free_sized(p, 1, size, "free_sized");
}
CM_EXPORT void CM_ENTRY(free_aligned_sized)(void *p, size_t alignment, size_t size);
CM_EXPORT void CM_ENTRY(free_aligned_sized)(void *p, size_t alignment, size_t size)
{
    cm_free_sized(p, alignment, size, "free_aligned_sized");
}

CM_EXPORT void *CM_ENTRY(reallocarray)(void *p, size_t count, size_t size)
{
    size_t total;
    if (__builtin_mul_overflow(count, size, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    return cm_realloc(p, total);
}

CM_EXPORT int CM_ENTRY(posix_memalign)(void **out, size_t alignment, size_t size)
{
    if (alignment < sizeof(void *) || !cm_is_power_of_two(alignment))
        return EINVAL;
    int saved = errno;
    void *p = cm_alloc_aligned(alignment, size);
    errno = saved;
    if (p == NULL)
        return ENOMEM;
    *out = p;
    return 0;
}

CM_EXPORT void *CM_ENTRY(aligned_alloc)(size_t alignment, size_t size)
{
    if (!cm_is_power_of_two(alignment)) {
        errno = EINVAL;
        return NULL;
    }
    return cm_alloc_aligned(alignment, size);
}

CM_EXPORT void *CM_ENTRY(memalign)(size_t alignment, size_t size)
{
    if (alignment > SIZE_MAX / 2 + 1) { /* no power of two is that large: glibc says EINVAL */
        errno = EINVAL;
        return NULL;
    }
    size_t rounded = 1;
    while (rounded < alignment)
        rounded <<= 1;
    return cm_alloc_aligned(rounded, size);
}

CM_EXPORT void *CM_ENTRY(valloc)(size_t size)
{
    return cm_alloc_aligned(CM_SYSTEM_PAGE, size);
}

CM_EXPORT void *CM_ENTRY(pvalloc)(size_t size)
{
    size_t rounded = (size + CM_SYSTEM_PAGE - 1) & ~(size_t)(CM_SYSTEM_PAGE - 1);
    if (rounded < size) {
        errno = ENOMEM;
        return NULL;
    }
    return cm_alloc_aligned(CM_SYSTEM_PAGE, rounded ? rounded : CM_SYSTEM_PAGE);
}

CM_EXPORT int CM_ENTRY(malloc_trim)(size_t pad)
{
    (void)pad;
    return cmalloc_release() > 0;
}

CM_EXPORT void CM_ENTRY(malloc_stats)(void)
{
    cmalloc_stats_print(2);
}

/* glibc's meanings: arena is the heap's size, uordblks + fordblks (cmalloc: everything but
 * the blocks with their own mapping); hblks/hblkhd count those mapped blocks, which are in no
 * other field; fordblks is free memory held in every cache, fsmblks its thread-cache part
 * (glibc's fast bins), keepcost what trimming could give back. One snapshot of counters,
 * clamped, so no field underflows while other threads allocate. */
CM_EXPORT struct mallinfo2 CM_ENTRY(mallinfo2)(void)
{
    cmalloc_stats s;
    cmalloc_stats_get(&s);
    size_t mapped_count, mapped_bytes = cm_mapped_live_bytes(&mapped_count);
    struct mallinfo2 info = {0};
    info.hblks = mapped_count;
    info.hblkhd = mapped_bytes;
    info.uordblks = s.bytes_in_use > mapped_bytes ? s.bytes_in_use - mapped_bytes : 0;
    info.fordblks = s.bytes_page_heap_free + s.bytes_central_cache + s.bytes_thread_caches;
    info.fsmblks = s.bytes_thread_caches;
    info.keepcost = s.bytes_page_heap_free;
    info.arena = info.uordblks + info.fordblks;
    return info;
}

CM_EXPORT struct mallinfo CM_ENTRY(mallinfo)(void)
{
    struct mallinfo2 wide = CM_ENTRY(mallinfo2)();
    struct mallinfo info = {.arena = (int)wide.arena,
                            .hblks = (int)wide.hblks,
                            .hblkhd = (int)wide.hblkhd,
                            .uordblks = (int)wide.uordblks,
                            .fordblks = (int)wide.fordblks,
                            .fsmblks = (int)wide.fsmblks,
                            .keepcost = (int)wide.keepcost};
    return info;
}

/* glibc's XML report, in glibc's shape, with cmalloc's numbers: one heap, its free memory as
 * "rest", the mapped blocks as "mmap". options must be 0. Writes through stdio, as glibc
 * does: an entry point, holding no allocator lock, may let stdio allocate. */
CM_EXPORT int CM_ENTRY(malloc_info)(int options, FILE *stream)
{
    if (options != 0)
        return EINVAL;
    struct mallinfo2 info = CM_ENTRY(mallinfo2)();
    cmalloc_stats s;
    cmalloc_stats_get(&s);
    size_t system = s.bytes_mapped - (s.bytes_mapped > s.bytes_released ? s.bytes_released : 0);
    fprintf(stream,
            "<malloc version=\"1\">\n<heap nr=\"0\">\n<sizes>\n</sizes>\n"
            "<total type=\"fast\" count=\"0\" size=\"0\"/>\n"
            "<total type=\"rest\" count=\"0\" size=\"%zu\"/>\n"
            "<system type=\"current\" size=\"%zu\"/>\n<system type=\"max\" size=\"%zu\"/>\n"
            "<aspace type=\"total\" size=\"%zu\"/>\n<aspace type=\"mprotect\" size=\"%zu\"/>\n"
            "</heap>\n"
            "<total type=\"fast\" count=\"0\" size=\"0\"/>\n"
            "<total type=\"rest\" count=\"0\" size=\"%zu\"/>\n"
            "<total type=\"mmap\" count=\"%zu\" size=\"%zu\"/>\n"
            "<system type=\"current\" size=\"%zu\"/>\n<system type=\"max\" size=\"%zu\"/>\n"
            "<aspace type=\"total\" size=\"%zu\"/>\n<aspace type=\"mprotect\" size=\"%zu\"/>\n"
            "</malloc>\n",
            info.fordblks, info.arena, info.arena, s.bytes_mapped, s.bytes_mapped, info.fordblks,
            info.hblks, info.hblkhd, system, system, s.bytes_mapped, s.bytes_mapped);
    return 0;
}

/* Answers as glibc 2.36 does, as programs check it (some stop when mallopt(M_MMAP_THRESHOLD)
 * is not 1): every parameter, known or not, is 1, but for an M_MXFAST glibc's fastbins cannot
 * take (above 160 bytes, or negative). A threshold is taken as glibc takes it, a negative one
 * as the size_t it converts to (no block gets its own mapping), and fixed: no longer raised by
 * frees of mapped blocks. */
CM_EXPORT int CM_ENTRY(mallopt)(int parameter, int value)
{
    enum { GLIBC_MXFAST_MAX = 160 }; /* glibc's MAX_FAST_SIZE on 64-bit targets */
    switch (parameter) {
    case M_MMAP_THRESHOLD: {
        size_t threshold = (size_t)(ptrdiff_t)value;
        if (!cm_is_initialized())
            cm_init();
        threshold = threshold > CM_MAX_SMALL ? threshold : CM_MAX_SMALL;
        __atomic_store_n(&cm_option.mmap_threshold, threshold, __ATOMIC_RELAXED);
        cm_option.mmap_threshold_max = threshold;
        return 1;
    }
    case M_MXFAST: return value >= 0 && value <= GLIBC_MXFAST_MAX;
    default: return 1;
    }
}

#ifndef CM_PREFIX
/* glibc's internal names, called directly by some programs and libraries. (The aliases lack
 * the attributes glibc's header puts on the public names; they are the same functions.) */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-attributes"
CM_EXPORT void *__libc_malloc(size_t size) __attribute__((alias("malloc")));
CM_EXPORT void __libc_free(void *p) __attribute__((alias("free")));
CM_EXPORT void *__libc_calloc(size_t count, size_t size) __attribute__((alias("calloc")));
CM_EXPORT void *__libc_realloc(void *p, size_t size) __attribute__((alias("realloc")));
CM_EXPORT void *__libc_memalign(size_t alignment, size_t size) __attribute__((alias("memalign")));
CM_EXPORT void *__libc_valloc(size_t size) __attribute__((alias("valloc")));
CM_EXPORT void *__libc_pvalloc(size_t size) __attribute__((alias("pvalloc")));
CM_EXPORT int __posix_memalign(void **out, size_t alignment, size_t size)
    __attribute__((alias("posix_memalign")));
/* A program that tunes or reads malloc through these must reach cmalloc's: glibc's own malloc
 * serves nothing here, so a threshold set there would be lost and its figures all zero. */
CM_EXPORT int __libc_mallopt(int parameter, int value) __attribute__((alias("mallopt")));
CM_EXPORT struct mallinfo __libc_mallinfo(void) __attribute__((alias("mallinfo")));
#pragma GCC diagnostic pop
#endif /* CM_PREFIX */
