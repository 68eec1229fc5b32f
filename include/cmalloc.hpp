// cmalloc.hpp - C++17 front ends over cmalloc's arenas and pools (header-only; needs cmalloc.h
// and libcmalloc, linked or preloaded).
//
//   cmalloc::pool<T>            a pool of T: construct/destroy, make() -> pool<T>::handle, a
//                               unique_ptr whose deleter runs ~T and returns the memory
//   cmalloc::arena              RAII arena: alloc, make<T>, mark/rewind/reset, scoped_mark;
//                               destructors of objects made with make<T> run (newest first) when
//                               a rewind, reset or the arena's end frees them
//   cmalloc::arena_allocator<T> STL allocator on an arena (deallocate does nothing: a rewind or
//                               reset frees)
//   cmalloc::pool_allocator<T>  STL allocator for node containers (std::list, std::map, ...):
//                               single objects come from a shared growing thread-safe pool per
//                               object size, or from a pool given to it when that pool's objects
//                               are big enough; arrays (n != 1) from operator new
// Costs and thread-safety are the C API's (cmalloc.h). Errors throw: std::bad_alloc when memory
// (or a FIXED pool) runs out, std::invalid_argument for arguments the C API rejects with EINVAL.
// Invariant kept by arena: `cleanups_` lists, newest first, every object made with make<T>
// whose type has a non-trivial destructor and whose memory the arena has not freed yet.
#ifndef CMALLOC_HPP
#define CMALLOC_HPP

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "cmalloc.h"

namespace cmalloc
{

namespace detail
{

[[noreturn]] inline void throw_error(const char *what)
{
    if (errno == EINVAL)
        throw std::invalid_argument(what);
    throw std::bad_alloc();
}

// The shared pool of pool_allocator for objects of Size bytes: created on first use, never
// destroyed (containers with static lifetime may still free into it at exit).
template <std::size_t Size> cmalloc_pool *shared_pool()
{
    static cmalloc_pool *const pool = [] {
        cmalloc_pool *p =
            cmalloc_pool_create(Size, 0, CMALLOC_POOL_GROW | CMALLOC_POOL_THREAD_SAFE);
        if (p == nullptr)
            throw_error("cmalloc::pool_allocator: cmalloc_pool_create failed");
        return p;
    }();
    return pool;
}

// The alignment of a pool's objects (cmalloc.h: the object size's natural alignment, 16..64).
inline std::size_t pool_alignment(const cmalloc_pool *pool)
{
    std::size_t size = cmalloc_pool_object_size(pool), low = size & (~size + 1);
    return low < 16 ? 16 : low > 64 ? 64 : low;
}

} // namespace detail

template <class T> class pool
{
    static_assert(alignof(T) <= 64, "cmalloc pools align objects to 64 bytes at most");

  public:
    struct deleter {
        cmalloc_pool *from = nullptr;
        void operator()(T *object) const noexcept
        {
            object->~T();
            cmalloc_pool_free(from, object);
        }
    };
    using handle = std::unique_ptr<T, deleter>;

    explicit pool(std::size_t capacity, unsigned flags = CMALLOC_POOL_GROW)
        : pool_(cmalloc_pool_create(sizeof(T), capacity, flags))
    {
        if (pool_ == nullptr)
            detail::throw_error("cmalloc::pool: cmalloc_pool_create failed");
    }
    // Frees the memory of every object; their destructors are not run (destroy or drop the
    // handles first).
    ~pool()
    {
        cmalloc_pool_destroy(pool_);
    }
    pool(const pool &) = delete;
    pool &operator=(const pool &) = delete;
    pool(pool &&other) noexcept : pool_(std::exchange(other.pool_, nullptr))
    {
    }
    pool &operator=(pool &&other) noexcept
    {
        if (this != &other) {
            cmalloc_pool_destroy(pool_);
            pool_ = std::exchange(other.pool_, nullptr);
        }
        return *this;
    }

    // A new T from args; nullptr when a FIXED pool is full. A throwing constructor gives the
    // memory back before the exception leaves.
    template <class... Args> T *try_construct(Args &&...args)
    {
        void *memory = cmalloc_pool_alloc(pool_);
        if (memory == nullptr)
            return nullptr;
        try {
            return ::new (memory) T(std::forward<Args>(args)...);
        } catch (...) {
            cmalloc_pool_free(pool_, memory);
            throw;
        }
    }
    template <class... Args> T *construct(Args &&...args)
    {
        T *object = try_construct(std::forward<Args>(args)...);
        if (object == nullptr)
            throw std::bad_alloc();
        return object;
    }
    void destroy(T *object) noexcept
    {
        if (object != nullptr)
            deleter{pool_}(object);
    }
    template <class... Args> handle make(Args &&...args)
    {
        return handle(construct(std::forward<Args>(args)...), deleter{pool_});
    }
    // An empty handle when a FIXED pool is full.
    template <class... Args> handle try_make(Args &&...args)
    {
        return handle(try_construct(std::forward<Args>(args)...), deleter{pool_});
    }

    std::size_t capacity() const noexcept
    {
        return cmalloc_pool_capacity(pool_);
    }
    std::size_t in_use() const noexcept
    {
        return cmalloc_pool_in_use(pool_);
    }
    cmalloc_pool *get() const noexcept
    {
        return pool_;
    }

  private:
    cmalloc_pool *pool_;
};

class arena
{
    struct cleanup {
        void (*destroy)(void *object);
        void *object;
        cleanup *next;
    };

  public:
    // A position to rewind to: the C mark and the destructors to run down to.
    struct mark_type {
        std::size_t position;
        cleanup *cleanups;
    };

    // Rewinds the arena when it leaves scope, running the destructors of what was made since.
    class scoped_mark
    {
      public:
        explicit scoped_mark(arena &owner) noexcept : arena_(owner), mark_(owner.mark())
        {
        }
        ~scoped_mark()
        {
            arena_.rewind(mark_);
        }
        scoped_mark(const scoped_mark &) = delete;
        scoped_mark &operator=(const scoped_mark &) = delete;

      private:
        arena &arena_;
        mark_type mark_;
    };

    explicit arena(std::size_t initial_bytes = 64 * 1024)
        : arena_(cmalloc_arena_create(initial_bytes))
    {
        if (arena_ == nullptr)
            detail::throw_error("cmalloc::arena: cmalloc_arena_create failed");
    }
    ~arena()
    {
        run_cleanups(nullptr);
        cmalloc_arena_destroy(arena_);
    }
    arena(const arena &) = delete;
    arena &operator=(const arena &) = delete;
    arena(arena &&other) noexcept
        : arena_(std::exchange(other.arena_, nullptr)),
          cleanups_(std::exchange(other.cleanups_, nullptr))
    {
    }
    arena &operator=(arena &&other) noexcept
    {
        if (this != &other) {
            run_cleanups(nullptr);
            cmalloc_arena_destroy(arena_);
            arena_ = std::exchange(other.arena_, nullptr);
            cleanups_ = std::exchange(other.cleanups_, nullptr);
        }
        return *this;
    }

    void *alloc(std::size_t size, std::size_t align = alignof(std::max_align_t))
    {
        void *p = cmalloc_arena_alloc(arena_, size, align);
        if (p == nullptr)
            detail::throw_error("cmalloc::arena::alloc: bad size or alignment");
        return p;
    }

    template <class T, class... Args> T *make(Args &&...args)
    {
        if constexpr (std::is_trivially_destructible_v<T>) {
            return ::new (alloc(sizeof(T), alignof(T))) T(std::forward<Args>(args)...);
        } else {
            // The node first: if T's constructor throws, both stay unused until a rewind.
            auto *node = static_cast<cleanup *>(alloc(sizeof(cleanup), alignof(cleanup)));
            T *object = ::new (alloc(sizeof(T), alignof(T))) T(std::forward<Args>(args)...);
            *node = cleanup{[](void *p) { static_cast<T *>(p)->~T(); }, object, cleanups_};
            cleanups_ = node;
            return object;
        }
    }

    mark_type mark() const noexcept
    {
        return {cmalloc_arena_mark(arena_), cleanups_};
    }
    void rewind(const mark_type &to) noexcept
    {
        run_cleanups(to.cleanups);
        cmalloc_arena_rewind(arena_, to.position);
    }
    void reset() noexcept
    {
        run_cleanups(nullptr);
        cmalloc_arena_reset(arena_);
    }
    std::size_t used() const noexcept
    {
        return cmalloc_arena_used(arena_);
    }
    cmalloc_arena *get() const noexcept
    {
        return arena_;
    }

  private:
    // Destroys, newest first, what was made after `stop` (a list entry, or nullptr: all).
    void run_cleanups(cleanup *stop) noexcept
    {
        while (cleanups_ != stop && cleanups_ != nullptr) {
            cleanup *node = cleanups_;
            cleanups_ = node->next;
            node->destroy(node->object);
        }
    }

    cmalloc_arena *arena_;
    cleanup *cleanups_ = nullptr;
};

template <class T> class arena_allocator
{
  public:
    using value_type = T;

    explicit arena_allocator(arena &from) noexcept : arena_(&from)
    {
    }
    template <class U>
    arena_allocator(const arena_allocator<U> &other) noexcept : arena_(other.source())
    {
    }

    T *allocate(std::size_t n)
    {
        if (n > SIZE_MAX / sizeof(T))
            throw std::bad_array_new_length();
        return static_cast<T *>(arena_->alloc(n ? n * sizeof(T) : 1, alignof(T)));
    }
    void deallocate(T *, std::size_t) noexcept
    {
    } // the arena's rewind or reset frees
    arena *source() const noexcept
    {
        return arena_;
    }

    template <class U> bool operator==(const arena_allocator<U> &other) const noexcept
    {
        return arena_ == other.source();
    }
    template <class U> bool operator!=(const arena_allocator<U> &other) const noexcept
    {
        return arena_ != other.source();
    }

  private:
    arena *arena_;
};

template <class T> class pool_allocator
{
    static_assert(alignof(T) <= 64, "cmalloc pools align objects to 64 bytes at most");

  public:
    using value_type = T;

    pool_allocator() noexcept = default;
    // Single objects from `from` when its objects fit a T (size and alignment), else from the
    // shared pool of their size. The pool must outlive every container using it.
    explicit pool_allocator(cmalloc_pool *from) noexcept : given_(from)
    {
    }
    template <class U>
    pool_allocator(const pool_allocator<U> &other) noexcept : given_(other.given())
    {
    }

    T *allocate(std::size_t n)
    {
        if (n != 1) {
            if (n > SIZE_MAX / sizeof(T))
                throw std::bad_array_new_length();
            return static_cast<T *>(::operator new(n * sizeof(T), std::align_val_t(alignof(T))));
        }
        void *object = cmalloc_pool_alloc(pool_for_one());
        if (object == nullptr)
            throw std::bad_alloc();
        return static_cast<T *>(object);
    }
    void deallocate(T *object, std::size_t n) noexcept
    {
        if (n != 1)
            ::operator delete(object, std::align_val_t(alignof(T)));
        else
            cmalloc_pool_free(pool_for_one(), object);
    }
    cmalloc_pool *given() const noexcept
    {
        return given_;
    }

    template <class U> bool operator==(const pool_allocator<U> &other) const noexcept
    {
        return given_ == other.given();
    }
    template <class U> bool operator!=(const pool_allocator<U> &other) const noexcept
    {
        return given_ != other.given();
    }

  private:
    // The same answer for allocate and deallocate: it depends on the type and given_ only.
    cmalloc_pool *pool_for_one() const
    {
        if (given_ != nullptr && cmalloc_pool_object_size(given_) >= sizeof(T) &&
            detail::pool_alignment(given_) >= alignof(T))
            return given_;
        return detail::shared_pool<sizeof(T)>();
    }

    cmalloc_pool *given_ = nullptr;
};

} // namespace cmalloc

#endif // CMALLOC_HPP
