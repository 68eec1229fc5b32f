/* prof_plugin.c - a shared library tests/test_prof.sh builds for prof_program's dlopen mode: it
 * is loaded and unloaded again and again while other threads' allocations are sampled, and it
 * allocates itself (so its own frames are on sampled stacks while it is loaded). */
#include <stdlib.h>

__attribute__((noinline)) void *plugin_alloc(size_t size)
{
    return malloc(size);
}
