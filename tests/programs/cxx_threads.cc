// cxx_threads.cc - C++ runtime allocation from many threads: 40 waves of 8 std::threads that
// (a) throw and catch exceptions carrying std::string payloads (libstdc++ allocates exception
// objects with malloc, and falls back to an emergency pool), (b) throw one that main rethrows
// from a std::exception_ptr (allocated by one thread, freed by another), (c) allocate with
// every form of operator new - plain, array, nothrow, aligned (16 B to 64 KiB alignment) - and
// release with the matching delete, sized where the size is known, checking the alignment and
// the usable bytes, and (d) write to std::ostringstream and to a shared std::ofstream under a
// mutex (a file in $TMPDIR or /tmp, named by the process id). Exit 0 when every check held and the file has the right line count; "FAIL ..." and
// exit 1 otherwise; a hang ends with status 124 (watchdog).
#include "../watchdog.h"
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <mutex>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

static std::atomic<int> failures{0};
static void check(bool ok, const char *what)
{
    if (!ok && failures++ < 10)
        std::fprintf(stderr, "FAIL %s\n", what);
}

static std::mutex file_lock;
static std::ofstream *shared_file;

static void news(unsigned seed)
{
    for (int round = 0; round < 30; round++) {
        size_t size = 1 + (seed = seed * 1103515245u + 12345u) % 20000;
        for (size_t alignment = 16; alignment <= 65536; alignment *= 4) {
            std::align_val_t a{alignment};
            void *p = ::operator new(size, a);
            check(reinterpret_cast<std::uintptr_t>(p) % alignment == 0, "aligned new alignment");
            std::memset(p, 0x5a, size);
            if (round % 2)
                ::operator delete(p, size, a);
            else
                ::operator delete(p, a);
            void *q = ::operator new[](size, a, std::nothrow);
            check(q != nullptr && reinterpret_cast<std::uintptr_t>(q) % alignment == 0,
                  "aligned nothrow new[]");
            std::memset(q, 0x5a, size);
            ::operator delete[](q, size, a);
        }
        char *c = new char[size];
        std::memset(c, 1, size);
        delete[] c;
        void *s = ::operator new(size);
        std::memset(s, 2, size);
        ::operator delete(s, size);
        int *n = new (std::nothrow) int[size];
        check(n != nullptr, "nothrow new[]");
        delete[] n;
    }
}

static void worker(int id, std::exception_ptr *out)
{
    unsigned seed = unsigned(id) + 1;
    for (int i = 0; i < 20; i++) {
        try {
            throw std::runtime_error(std::string(size_t(i * 50 + 1), char('a' + id % 26)));
        } catch (const std::runtime_error &e) {
            check(std::strlen(e.what()) == size_t(i * 50 + 1), "exception payload");
        }
    }
    news(seed);
    std::ostringstream text;
    for (int i = 0; i < 50; i++)
        text << "thread " << id << " line " << i << ' ' << std::string(size_t(i), 'x') << '\n';
    check(text.str().size() > 1000, "ostringstream");
    {
        std::lock_guard<std::mutex> hold(file_lock);
        *shared_file << "thread " << id << '\n' << std::flush;
    }
    try {
        throw std::out_of_range("from thread " + std::to_string(id));
    } catch (...) {
        *out = std::current_exception();
    }
}

int main(int argc, char **argv)
{
    start_watchdog("cxx_threads", 25);
    const char *dir = argc > 1 ? argv[1] : std::getenv("TMPDIR");
    std::string path = std::string(dir ? dir : "/tmp") + "/cxx_threads." +
                       std::to_string(getpid()) + ".out";
    shared_file = new std::ofstream(path);
    int started = 0;
    for (int wave = 0; wave < 40; wave++) {
        std::vector<std::thread> threads;
        std::vector<std::exception_ptr> errors(8);
        for (int i = 0; i < 8; i++)
            threads.emplace_back(worker, wave * 8 + i, &errors[size_t(i)]);
        started += 8;
        for (auto &t : threads)
            t.join();
        for (int i = 0; i < 8; i++) {
            try {
                std::rethrow_exception(errors[size_t(i)]);
            } catch (const std::out_of_range &e) {
                check(std::string(e.what()) == "from thread " + std::to_string(wave * 8 + i),
                      "exception_ptr across threads");
            }
        }
    }
    delete shared_file;
    std::ifstream in(path);
    int lines = 0;
    for (std::string line; std::getline(in, line);)
        lines++;
    std::remove(path.c_str());
    check(lines == started, "lines in the shared file");
    return failures.load() ? 1 : 0;
}
