/* fastpath_pair.c - malloc(size) then free, n times, after a warm-up that creates the thread
 * cache and fills its list: the thread-cache hit path only. Run twice under callgrind (n = 0
 * and n = N); the difference over N is the instructions per malloc+free pair, loop included. */
#include <stdlib.h>

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 0;
    size_t size = argc > 2 ? (size_t)atol(argv[2]) : 64;
    void *volatile sink;
    for (int i = 0; i < 1000; i++) {
        sink = malloc(size);
        free(sink);
    }
    for (long i = 0; i < n; i++) {
        sink = malloc(size);
        free(sink);
    }
    return 0;
}
