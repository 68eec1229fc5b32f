// test_cmalloc_hpp.cc - the C++ front ends (include/cmalloc.hpp) with standard containers.
//
//   pool_make_and_destroy       make() constructs with arguments, the handle's deleter runs ~T
//                               and returns the memory (in_use), construct/destroy likewise
//   pool_fixed_full             a FIXED pool<T>: make throws bad_alloc when full, try_make gives
//                               an empty handle; a throwing constructor leaves in_use unchanged
//   pool_bad_arguments          capacity 0 for a FIXED pool: std::invalid_argument
//   arena_make_and_marks        make<T> for trivial and non-trivial T; a scoped_mark rewinds and
//                               runs the destructors made inside it, newest first; reset and the
//                               arena's end run the rest
//   arena_allocator_containers  vector, string and map on an arena: contents right, nothing
//                               taken from the general heap's counters for their elements
//   pool_allocator_list         std::list<T, pool_allocator<T>> as a drop-in: push, sort, erase,
//                               splice between lists; a given pool serves the nodes (in_use)
//   pool_allocator_map_vector   std::map on the shared pools; vector's arrays take operator new
// Built with -std=c++17 -Wall -Wextra -Werror and linked with build/libcmalloc.a.
#include <algorithm>
#include <cstdarg>
#include <cstddef>
#include <csetjmp>
#include <cstdint>
#include <list>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "cmalloc.hpp" // before cmocka.h, whose fail() macro breaks <ios>

extern "C" { // this cmocka.h declares its functions with C linkage only for C
#include <cmocka.h>
}

namespace
{

int live_objects = 0;
std::vector<int> destroyed_order;

struct tracked {
    int value;
    explicit tracked(int v, bool fail = false) : value(v)
    {
        if (fail)
            throw std::runtime_error("constructor failed");
        live_objects++;
    }
    ~tracked()
    {
        live_objects--;
        destroyed_order.push_back(value);
    }
};

void pool_make_and_destroy(void **)
{
    cmalloc::pool<tracked> pool(10);
    {
        auto a = pool.make(1);
        auto b = pool.make(2);
        assert_int_equal(a->value, 1);
        assert_int_equal(b->value, 2);
        assert_int_equal(live_objects, 2);
        assert_int_equal(pool.in_use(), 2);
        a.reset();
        assert_int_equal(live_objects, 1);
        assert_int_equal(pool.in_use(), 1);
    }
    assert_int_equal(live_objects, 0);
    assert_int_equal(pool.in_use(), 0);
    tracked *raw = pool.construct(7);
    assert_int_equal(raw->value, 7);
    assert_int_equal(reinterpret_cast<std::uintptr_t>(raw) % 16, 0);
    pool.destroy(raw);
    pool.destroy(nullptr);
    assert_int_equal(live_objects, 0);
    assert_int_equal(pool.in_use(), 0);
}

void pool_fixed_full(void **)
{
    cmalloc::pool<tracked> pool(3, CMALLOC_POOL_FIXED);
    assert_int_equal(pool.capacity(), 3);
    std::vector<cmalloc::pool<tracked>::handle> held;
    for (int i = 0; i < 3; i++)
        held.push_back(pool.make(i));
    bool threw = false;
    try {
        pool.make(9);
    } catch (const std::bad_alloc &) {
        threw = true;
    }
    assert_true(threw);
    assert_null(pool.try_make(9).get());
    held.pop_back();
    threw = false;
    try {
        pool.make(5, true);
    } catch (const std::runtime_error &) {
        threw = true;
    }
    assert_true(threw);
    assert_int_equal(pool.in_use(), 2); // the failed construction gave its memory back
    assert_non_null(pool.try_make(4).get());
    held.clear();
    assert_int_equal(live_objects, 0);
}

void pool_bad_arguments(void **)
{
    bool threw = false;
    try {
        cmalloc::pool<int> pool(0, CMALLOC_POOL_FIXED);
    } catch (const std::invalid_argument &) {
        threw = true;
    }
    assert_true(threw);
    cmalloc::arena arena(100);
    threw = false;
    try {
        arena.alloc(16, 3);
    } catch (const std::invalid_argument &) {
        threw = true;
    }
    assert_true(threw);
}

void arena_make_and_marks(void **)
{
    destroyed_order.clear();
    {
        cmalloc::arena arena(4096);
        int *number = arena.make<int>(41);
        assert_int_equal(*number, 41);
        arena.make<tracked>(1);
        {
            cmalloc::arena::scoped_mark scope(arena);
            for (int i = 2; i <= 4; i++)
                arena.make<tracked>(i);
            std::uint64_t *wide = arena.make<std::uint64_t>(5u);
            assert_int_equal(reinterpret_cast<std::uintptr_t>(wide) % alignof(std::uint64_t), 0);
            assert_int_equal(live_objects, 4);
        }
        assert_int_equal(live_objects, 1);
        assert_int_equal(destroyed_order.size(), 3);
        assert_int_equal(destroyed_order[0], 4); // newest first
        assert_int_equal(destroyed_order[2], 2);
        std::size_t used = arena.used();
        auto mark = arena.mark();
        arena.make<tracked>(6);
        arena.rewind(mark);
        assert_int_equal(arena.used(), used);
        assert_int_equal(live_objects, 1);
        arena.reset();
        assert_int_equal(live_objects, 0);
        assert_int_equal(arena.used(), 0);
        arena.make<tracked>(7);
        cmalloc::arena moved(std::move(arena));
        assert_int_equal(live_objects, 1);
    }
    assert_int_equal(live_objects, 0); // the arena's end ran the last destructor
}

void arena_allocator_containers(void **)
{
    cmalloc::arena arena(1 << 16);
    std::size_t before = arena.used();
    {
        std::vector<int, cmalloc::arena_allocator<int>> numbers{
            cmalloc::arena_allocator<int>(arena)};
        for (int i = 0; i < 10000; i++)
            numbers.push_back(i);
        assert_int_equal(numbers[9999], 9999);
        using text =
            std::basic_string<char, std::char_traits<char>, cmalloc::arena_allocator<char>>;
        text s("a string long enough to leave the small-string buffer",
               cmalloc::arena_allocator<char>(arena));
        s += s;
        assert_int_equal(s.size(), 106);
        std::map<int, int, std::less<int>, cmalloc::arena_allocator<std::pair<const int, int>>>
            squares{cmalloc::arena_allocator<std::pair<const int, int>>(arena)};
        for (int i = 0; i < 1000; i++)
            squares[i] = i * i;
        assert_int_equal(squares[999], 998001);
    }
    assert_true(arena.used() > before + 10000 * sizeof(int)); // the elements were the arena's
    cmalloc::arena_allocator<int> a(arena);
    cmalloc::arena_allocator<long> b(a);
    assert_true(a == b);
    cmalloc::arena other(100);
    assert_true(a != cmalloc::arena_allocator<int>(other));
}

void pool_allocator_list(void **)
{
    std::list<int, cmalloc::pool_allocator<int>> numbers;
    for (int i = 0; i < 100000; i++)
        numbers.push_back((i * 7919) % 100003);
    numbers.sort();
    assert_true(std::is_sorted(numbers.begin(), numbers.end()));
    numbers.remove_if([](int v) { return v % 2 == 0; });
    std::list<int, cmalloc::pool_allocator<int>> more{1, 3, 5};
    numbers.splice(numbers.begin(), more);
    assert_true(more.empty());
    assert_int_equal(numbers.front(), 1);

    // A given pool serves the nodes when they fit (a list node: two pointers and the value).
    cmalloc_pool *nodes = cmalloc_pool_create(64, 100, CMALLOC_POOL_GROW);
    assert_non_null(nodes);
    {
        std::list<std::string, cmalloc::pool_allocator<std::string>> words{
            cmalloc::pool_allocator<std::string>(nodes)};
        for (int i = 0; i < 1000; i++)
            words.push_back(std::to_string(i));
        assert_int_equal(cmalloc_pool_in_use(nodes), 1000);
        assert_string_equal(words.back().c_str(), "999");
    }
    assert_int_equal(cmalloc_pool_in_use(nodes), 0);
    // Too small a pool: the shared pool of the node's size serves instead.
    cmalloc_pool *tiny = cmalloc_pool_create(8, 10, CMALLOC_POOL_FIXED);
    {
        std::list<double, cmalloc::pool_allocator<double>> values{
            cmalloc::pool_allocator<double>(tiny)};
        for (int i = 0; i < 100; i++)
            values.push_back(i);
        assert_int_equal(cmalloc_pool_in_use(tiny), 0);
    }
    cmalloc_pool_destroy(tiny);
    cmalloc_pool_destroy(nodes);
}

void pool_allocator_map_vector(void **)
{
    std::map<int, std::string, std::less<int>,
             cmalloc::pool_allocator<std::pair<const int, std::string>>>
        names;
    for (int i = 0; i < 20000; i++)
        names.emplace(i, std::to_string(i));
    for (int i = 0; i < 20000; i += 2)
        names.erase(i);
    assert_int_equal(names.size(), 10000);
    assert_string_equal(names.at(19999).c_str(), "19999");
    std::vector<int, cmalloc::pool_allocator<int>> numbers(1000, 3); // arrays: operator new
    numbers.resize(5000, 4);
    assert_int_equal(numbers[999], 3);
    assert_int_equal(numbers[4999], 4);
}

} // namespace

int main()
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(pool_make_and_destroy),      cmocka_unit_test(pool_fixed_full),
        cmocka_unit_test(pool_bad_arguments),         cmocka_unit_test(arena_make_and_marks),
        cmocka_unit_test(arena_allocator_containers), cmocka_unit_test(pool_allocator_list),
        cmocka_unit_test(pool_allocator_map_vector),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
