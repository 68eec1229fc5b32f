/* arena_rewind.c - an arena's loop of mark, one allocation, rewind to the mark, n times, after a
 * warm-up: what a parser or a request handler does with a scratch arena. Run twice under
 * callgrind (n = 0 and n = N); the difference over N is the instructions of one mark, one
 * (inline) allocation and one rewind that frees it, loop included. Linked with libcmalloc.a. */
#include <stdlib.h>

#include "cmalloc.h"

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 0;
    cmalloc_arena *arena = cmalloc_arena_create(1 << 16);
    if (arena == NULL)
        return 1;
    void *volatile sink = cmalloc_arena_alloc(arena, 100, 16); /* the mark is not the start */
    for (long i = 0; i < 1000 + n; i++) {
        size_t mark = cmalloc_arena_mark(arena);
        sink = cmalloc_arena_alloc(arena, 64, 16);
        cmalloc_arena_rewind(arena, mark);
    }
    (void)sink;
    cmalloc_arena_destroy(arena);
    return 0;
}
