/* tls_module.c - a plugin with thread-local storage (built as libtls_module.so and dlopen'd by
 * fork_dlopen_tls): glibc allocates each thread's copy of a dlopen'd module's TLS with malloc
 * on the thread's first touch, and frees it when the thread's stack is reused (allocatestack.c
 * get_cached_stack) - from inside pthread_create of another thread. */
__thread char tls_buffer[200];

int tls_touch(int x)
{
    tls_buffer[x % 200]++;
    return tls_buffer[0];
}
