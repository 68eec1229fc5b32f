/* fastpath_pair.c - one allocator call pattern, n times, after 1000 of them that create the
 * thread cache and fill its lists: the thread-cache hit paths only. Run twice under callgrind
 * (n = 0 and n = N); the difference over N is the instructions per iteration, loop included.
 *   fastpath_pair N SIZE            malloc(SIZE), free
 *   fastpath_pair N SIZE realloc    realloc of one block to 3 * SIZE and back (two moves: the
 *                                   copies are counted too)
 *   fastpath_pair N SIZE aligned    posix_memalign(64, SIZE), free
 *   fastpath_pair N SIZE usable     malloc_usable_size of a block of SIZE
 *   fastpath_pair N SIZE sized      malloc(SIZE), free_sized(p, SIZE) (C23: looked up with dlsym,
 *                                   as glibc before 2.43 declares none; exits 2 without one) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

static void *volatile sink;
static volatile size_t usable;

int main(int argc, char **argv)
{
    long n = 1000 + (argc > 1 ? atol(argv[1]) : 0);
    size_t size = argc > 2 ? (size_t)atol(argv[2]) : 64;
    const char *mode = argc > 3 ? argv[3] : "pair";
    void *p;
    sink = malloc(size);
    if (strcmp(mode, "realloc") == 0) {
        for (long i = 0; i < n; i++) {
            sink = realloc(sink, 3 * size);
            sink = realloc(sink, size);
        }
    } else if (strcmp(mode, "aligned") == 0) {
        for (long i = 0; i < n; i++)
            if (posix_memalign(&p, 64, size) == 0)
                free(p);
    } else if (strcmp(mode, "usable") == 0) {
        for (long i = 0; i < n; i++)
            usable = malloc_usable_size(sink);
    } else if (strcmp(mode, "sized") == 0) {
        void (*free_sized)(void *, size_t) =
            (void (*)(void *, size_t))dlsym(RTLD_DEFAULT, "free_sized");
        if (free_sized == NULL)
            return 2;
        for (long i = 0; i < n; i++) {
            sink = malloc(size);
            free_sized(sink, size);
        }
    } else {
        for (long i = 0; i < n; i++) {
            sink = malloc(size);
            free(sink);
        }
    }
    return 0;
}
