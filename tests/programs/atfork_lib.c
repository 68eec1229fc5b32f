/* atfork_lib.c - a shared library (built as libatfork_lib.so) whose constructor registers
 * pthread_atfork handlers that allocate, before the allocator has initialised: prepare
 * handlers run in reverse order of registration, so the allocator's runs first. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static void *kept;

static void prepare(void)
{
    kept = malloc(300000);
    memset(kept, 1, 300000);
    free(malloc(40));
}

static void parent(void)
{
    free(kept);
    free(malloc(500));
}

static void child(void)
{
    free(kept);
    free(malloc(70000));
}

__attribute__((constructor)) static void register_handlers(void)
{
    pthread_atfork(prepare, parent, child);
}
