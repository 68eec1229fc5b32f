/* background.c - the release thread (CMALLOC_BACKGROUND_RELEASE=1): every half release delay
 * it ages the central caches' transfer batches (cm_central_tick) and gives idle free spans back
 * to the OS (cm_page_heap_release), so a program that goes idle without calling the allocator
 * gives memory back too. It sits above both layers it drives, so neither calls the other up.
 *
 * Started once, by the library's constructor (init.c), and never from an entry point: glibc
 * calls malloc and free while holding locks that pthread_create takes (the stack-cache lock in
 * pthread_join, the TLS lock in dlopen), so a thread started from inside one of them could
 * wait forever on its own caller. A forked child has no release thread; it releases on its own
 * allocator calls. Holds no lock of its own.
 */
#include "internal.h"

static void *release_thread(void *unused)
{
    (void)unused;
    for (;;) {
        uint64_t delay = (uint64_t)cm_option.release_delay_ms;
        cm_os_sleep_ms(delay / 2 > CM_RELEASE_CHECK_MIN_MS ? delay / 2 : CM_RELEASE_CHECK_MIN_MS);
        cm_central_tick(cm_os_now_ms());
        cm_page_heap_release(false);
    }
    return NULL;
}

/* Starts the release thread when the options ask for one; the constructor's call only. */
void cm_background_start(void)
{
    if (cm_option.background_release && cm_option.release_delay_ms >= 0)
        cm_os_start_thread(release_thread);
}
