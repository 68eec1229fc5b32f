// tls_destructors.cc - heap-owning thread-local objects destroyed at thread and process exit:
// a C++ thread_local with std::string/std::vector/std::map members, and pthread keys whose
// destructors free the value, allocate a new one and set it again (glibc runs the destructors
// up to 4 rounds), so the allocator is called after its own per-thread cleanup may have run.
// 300 threads in waves of 30 (std::thread, joined) and 30 detached ones; main's own
// thread_local and a key value are destroyed at exit, and 8 threads are still inside their
// loops when main returns. Each destructor checks its object's contents (a block freed early
// or reused under it prints "corrupt" and exits 1). A hang ends with status 124 (watchdog).
#include "../watchdog.h"
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <pthread.h>
#include <string>
#include <thread>
#include <vector>

static std::atomic<int> destroyed{0}, key_rounds{0};
static pthread_key_t key;

struct Heavy {
    std::string name;
    std::vector<std::string> items;
    std::map<int, std::vector<char>> table;
    Heavy() : name(std::string(100, 'n'))
    {
        for (int i = 0; i < 50; i++) {
            items.push_back(std::string(10 + i * 7, char('a' + i % 26)));
            table[i] = std::vector<char>(i * 40 + 1, char(i));
        }
    }
    ~Heavy()
    {
        bool ok = name == std::string(100, 'n') && items.size() == 50;
        for (int i = 0; ok && i < 50; i++)
            ok = items[i].size() == size_t(10 + i * 7) && items[i][0] == char('a' + i % 26) &&
                 table[i].size() == size_t(i * 40 + 1) && table[i].back() == char(i);
        if (!ok) {
            std::fprintf(stderr, "corrupt thread_local\n");
            std::_Exit(1);
        }
        // allocate while being destroyed, as logging destructors do
        std::string farewell = "bye " + name + std::to_string(items.size());
        destroyed++;
    }
};

thread_local Heavy heavy;

struct KeyValue {
    int rounds;
    char text[200];
};

static void key_destructor(void *value)
{
    KeyValue *v = static_cast<KeyValue *>(value);
    if (v->text[0] != 'k' || v->text[199] != 'k') {
        std::fprintf(stderr, "corrupt key value\n");
        std::_Exit(1);
    }
    int rounds = v->rounds;
    std::free(v);
    key_rounds++;
    if (rounds < 3) { // set a fresh value: glibc calls the destructor again
        KeyValue *next = static_cast<KeyValue *>(std::malloc(sizeof(KeyValue) + rounds * 5000));
        next->rounds = rounds + 1;
        std::memset(next->text, 'k', sizeof next->text);
        pthread_setspecific(key, next);
    }
}

static void use_both(int n)
{
    heavy.items[n % 50].size(); // constructs this thread's Heavy
    KeyValue *v = static_cast<KeyValue *>(std::malloc(sizeof(KeyValue)));
    v->rounds = 0;
    std::memset(v->text, 'k', sizeof v->text);
    pthread_setspecific(key, v);
    std::vector<std::string> junk;
    for (int i = 0; i < 200; i++)
        junk.push_back(std::string(i % 90 + 1, 'j'));
}

int main()
{
    start_watchdog("tls_destructors", 25);
    if (pthread_key_create(&key, key_destructor) != 0)
        return 2;
    use_both(0);
    int joined = 0;
    for (int wave = 0; wave < 10; wave++) {
        std::vector<std::thread> threads;
        for (int i = 0; i < 30; i++)
            threads.emplace_back(use_both, wave * 30 + i);
        for (auto &t : threads)
            t.join();
        joined += 30;
        std::thread(use_both, wave).detach();
        std::thread(use_both, wave + 1).detach();
        std::thread(use_both, wave + 2).detach();
    }
    // every joined thread ran its thread_local destructor and 4 key destructor rounds
    int want = joined;
    if (destroyed.load() < want || key_rounds.load() < 4 * want) {
        std::fprintf(stderr, "destructors: %d thread_local, %d key rounds for %d threads\n",
                     destroyed.load(), key_rounds.load(), joined);
        return 1;
    }
    static std::atomic<bool> go{true};
    for (int i = 0; i < 8; i++)
        std::thread([i] {
            while (go.load())
                use_both(i);
        }).detach();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return 0; // exit: main's thread_local destroyed while 8 threads still allocate
}
