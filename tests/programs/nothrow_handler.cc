// nothrow_handler.cc - C++ new-handlers as programs write them: a handler that throws
// std::bad_alloc makes every nothrow form of new (plain, array, aligned, aligned array) return
// nullptr, the throwing forms throw bad_alloc to the caller, and a handler that frees a
// reserve lets the retry succeed. Exit 0 when all hold; prints what failed otherwise.
#include <cstdio>
#include <cstdlib>
#include <new>

static int failures;
static void check(bool ok, const char *what)
{
    if (!ok) {
        std::printf("FAIL %s\n", what);
        failures++;
    }
}

static int handler_calls;
static void throwing_handler()
{
    handler_calls++;
    throw std::bad_alloc();
}

static void *reserve;
static void releasing_handler()
{
    handler_calls++;
    std::free(reserve);
    reserve = nullptr;
    std::set_new_handler(nullptr);
}

int main()
{
    const std::size_t huge = std::size_t(1) << 62;
    const std::align_val_t align{64};
    std::set_new_handler(throwing_handler);
    check(operator new(huge, std::nothrow) == nullptr, "new(nothrow) with a throwing handler");
    check(operator new[](huge, std::nothrow) == nullptr, "new[](nothrow) with a throwing handler");
    check(operator new(huge, align, std::nothrow) == nullptr, "aligned new(nothrow)");
    check(operator new[](huge, align, std::nothrow) == nullptr, "aligned new[](nothrow)");
    check(handler_calls == 4, "the handler is called once by each nothrow form");
    bool thrown = false;
    try {
        void *p = operator new(huge);
        std::printf("got %p\n", p);
    } catch (const std::bad_alloc &) {
        thrown = true;
    }
    check(thrown, "throwing new passes the handler's bad_alloc on");
    reserve = std::malloc(1000);
    std::set_new_handler(releasing_handler);
    handler_calls = 0;
    void *p = operator new(huge, std::nothrow);
    check(p == nullptr && handler_calls == 1, "a handler that uninstalls itself ends the loop");
    std::set_new_handler(nullptr);
    check(operator new(huge, std::nothrow) == nullptr, "nothrow without a handler");
    int *ok = new (std::nothrow) int[100];
    check(ok != nullptr, "a small nothrow new succeeds");
    delete[] ok;
    return failures ? 1 : 0;
}
