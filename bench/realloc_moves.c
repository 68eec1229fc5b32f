/* realloc_moves - counts the reallocs that move their block (a helper, not a workload).
 *
 *   LD_PRELOAD="build/bench/realloc_moves.so [ALLOCATOR.so]" PROGRAM [args...]
 *
 * Preloaded before the allocator under test (or alone, for glibc), it wraps realloc: each call
 * with a block is counted by the power of two of its new size, as kept in place or moved, with
 * the bytes a move had to copy (the smaller of the old usable size and the new size). At exit
 * it prints one line per size range to stderr:
 *   realloc_moves: 2^15 B: 67 reallocs, 64 moved, 2676 KiB copied
 * README's figure on CPython's growing buffers comes from it. It allocates nothing itself.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <stdio.h>
#include <unistd.h>

enum { RANGES = 64 };
static size_t calls[RANGES], moves[RANGES], copied[RANGES];
static void *(*next_realloc)(void *, size_t);

void *realloc(void *p, size_t size)
{
    if (next_realloc == NULL)
        next_realloc = (void *(*)(void *, size_t))dlsym(RTLD_NEXT, "realloc");
    size_t old = p != NULL ? malloc_usable_size(p) : 0;
    void *q = next_realloc(p, size);
    if (p != NULL && q != NULL) {
        unsigned range = 63 - (unsigned)__builtin_clzll(size | 1);
        calls[range]++;
        if (q != p) {
            moves[range]++;
            copied[range] += old < size ? old : size;
        }
    }
    return q;
}

__attribute__((destructor)) static void report(void)
{
    for (unsigned range = 0; range < RANGES; range++) {
        if (calls[range] == 0)
            continue;
        char line[128];
        int length = snprintf(line, sizeof line,
                              "realloc_moves: 2^%u B: %zu reallocs, %zu moved, %zu KiB copied\n",
                              range, calls[range], moves[range], copied[range] >> 10);
        if (length > 0 && write(2, line, (size_t)length) < 0)
            return;
    }
}
