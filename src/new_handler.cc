/* new_handler.cc - the one piece of C++ in cmalloc: calling the program's new-handler, or its
 * own operator new (plain or aligned), from the nothrow forms of operator new, which must
 * return NULL when that throws (the standard has them behave as if they called the throwing
 * form inside a try block), and may not let the exception out: their callers are compiled as
 * noexcept, so an escaping bad_alloc ends the program in std::terminate.
 *
 * The C++ runtime symbols this needs (__gxx_personality_v0, __cxa_begin_catch,
 * __cxa_end_catch) are made weak when the object is built (Makefile: objcopy), so a C program
 * loads libcmalloc without libstdc++; they are only reached when a handler throws, which only
 * a C++ program with its runtime loaded can do.
 */
#include <stddef.h>

extern "C" {
#pragma GCC visibility push(hidden)
typedef void (*cm_new_handler)(void);
bool cm_call_new_handler_nothrow(cm_new_handler handler);
void *cm_call_new_nothrow(void *(*new_fn)(size_t), size_t size);
void *cm_call_new_aligned_nothrow(void *(*new_fn)(size_t, size_t), size_t size,
                                  size_t alignment);
#pragma GCC visibility pop
}

/* True when the handler returned (the caller retries), false when it threw. */
bool cm_call_new_handler_nothrow(cm_new_handler handler)
{
    try {
        handler();
        return true;
    } catch (...) {
        return false;
    }
}

/* new_fn(args...), a program's own operator new (plain or aligned), or NULL when it throws:
 * the nothrow news' default (operator_new.c). */
template <class... Args> static void *new_nothrow(void *(*new_fn)(Args...), Args... args)
{
    try {
        return new_fn(args...);
    } catch (...) {
        return nullptr;
    }
}

void *cm_call_new_nothrow(void *(*new_fn)(size_t), size_t size)
{
    return new_nothrow(new_fn, size);
}

void *cm_call_new_aligned_nothrow(void *(*new_fn)(size_t, size_t), size_t size, size_t alignment)
{
    return new_nothrow(new_fn, size, alignment);
}
