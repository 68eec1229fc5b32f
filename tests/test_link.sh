#!/bin/sh
# test_link.sh - a program linked with cmalloc gets cmalloc's malloc.
#
# Run from the top directory (make test does). One small C program is built three ways:
#   1. dynamic:   cc -Iinclude prog.c -Lbuild -lcmalloc, run with LD_LIBRARY_PATH=build;
#   2. static:    cc -Iinclude prog.c build/libcmalloc.a (the library inside the executable);
#   3. installed: make install PREFIX=$tmp, then cc prog.c $(pkg-config --cflags --libs cmalloc)
#                 with PKG_CONFIG_PATH=$tmp/lib/pkgconfig, run with LD_LIBRARY_PATH=$tmp/lib.
# Each time the program checks from the inside that
#   - cmalloc_stats_get() sees bytes_in_use grow by 1 MiB after malloc(1 MiB), and shrink after
#     free (its malloc is cmalloc's, not only its header);
#   - an allocation made inside libc (strdup of a 1 MiB string) is counted by cmalloc and can be
#     freed by free() (libc's internal calls reach cmalloc too);
#   - malloc, as the dynamic linker resolves it (dlsym(RTLD_DEFAULT)) and as the program's own
#     &malloc, lies in the expected object (dladdr): libcmalloc.so.0 from the expected directory,
#     or the executable itself when linked statically.
# The dynamic executable must also record libcmalloc.so.0 (the soname) as NEEDED.
# With g++, a C++ program is linked both ways too, and every operator new/delete variant
# (plain, array, nothrow, sized, aligned) must resolve to cmalloc's, not libstdc++'s. And a C++
# program linked with build/libcmalloc.a and libstdc++'s static archive (-static-libstdc++, and
# -static) that uses nothing of libstdc++'s thrower itself still gets std::bad_alloc from a
# failing new (a weak name pulls no member out of an archive: it aborted), its new-handler
# called until it gives up, and NULL from the nothrow form. And a C++ program with its own
# operator new and delete links with build/libcmalloc.a and runs as without cmalloc.
set -u

top=$(pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cmalloc-link.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
CC=${CC:-cc}
MAKE=${MAKE:-make}

failures=0
failed_names=""
fail() {
    echo "  FAIL: $*"
    failures=$((failures + 1))
    failed_names="$failed_names
  $*"
}

for f in build/libcmalloc.so build/libcmalloc.a include/cmalloc.h; do
    if [ ! -f "$f" ]; then
        echo "test_link: $f is missing (run make first)"
        exit 1
    fi
done

cat >"$tmp/prog.c" <<'EOF'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmalloc.h>

#define MiB (1024u * 1024u)

static int failed;
#define CHECK(cond, ...)                                                                      \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            printf("prog: check failed: %s: ", #cond);                                       \
            printf(__VA_ARGS__);                                                              \
            printf("\n");                                                                     \
            failed = 1;                                                                       \
        }                                                                                     \
    } while (0)

static size_t in_use(void)
{
    cmalloc_stats s;
    memset(&s, 0, sizeof s);
    if (cmalloc_stats_get(&s) != 0)
        printf("prog: cmalloc_stats_get failed\n");
    return s.bytes_in_use;
}

/* Where does the code at address live? */
static const char *object_of(void *address, void **base)
{
    Dl_info info;
    memset(&info, 0, sizeof info);
    if (dladdr(address, &info) == 0 || info.dli_fname == NULL)
        return "?";
    *base = info.dli_fbase;
    return info.dli_fname;
}

/* argv[1]: "static", or the directory libcmalloc.so.0 must be loaded from. */
int main(int argc, char **argv)
{
    if (argc != 2) {
        printf("usage: prog static|DIR\n");
        return 2;
    }
    size_t before = in_use();
    char *volatile p = malloc(MiB);
    CHECK(p != NULL, "malloc(1 MiB) failed");
    memset(p, 1, MiB);
    size_t during = in_use();
    CHECK(during >= before + MiB, "bytes_in_use %zu -> %zu after malloc(1 MiB)", before, during);
    free(p);
    size_t after = in_use();
    CHECK(after + MiB <= during, "bytes_in_use %zu -> %zu after free(1 MiB)", during, after);

    /* libc allocates internally through the same malloc. */
    char *text = malloc(MiB + 1);
    memset(text, 'a', MiB);
    text[MiB] = '\0';
    before = in_use();
    char *volatile copy = strdup(text);
    during = in_use();
    CHECK(copy != NULL && strlen(copy) == MiB, "strdup failed");
    CHECK(during >= before + MiB, "strdup(1 MiB) inside libc not counted by cmalloc: %zu -> %zu",
          before, during);
    free(copy);
    free(text);

    void *main_base = NULL, *resolved_base = NULL, *own_base = NULL;
    object_of((void *)main, &main_base);
    const char *resolved = object_of(dlsym(RTLD_DEFAULT, "malloc"), &resolved_base);
    void *(*volatile own)(size_t) = malloc;
    const char *own_file = object_of((void *)own, &own_base);
    if (strcmp(argv[1], "static") == 0) {
        CHECK(resolved_base == main_base,
              "dlsym(RTLD_DEFAULT, \"malloc\") is in %s, not in the executable", resolved);
        CHECK(own_base == main_base, "&malloc is in %s, not in the executable", own_file);
    } else {
        char want[4096];
        snprintf(want, sizeof want, "%s/libcmalloc.so.0", argv[1]);
        CHECK(strcmp(resolved, want) == 0, "dlsym(RTLD_DEFAULT, \"malloc\") is in %s, not %s",
              resolved, want);
        CHECK(strcmp(own_file, want) == 0, "&malloc is in %s, not %s", own_file, want);
    }
    if (!failed)
        printf("prog: malloc from %s\n", strcmp(argv[1], "static") == 0 ? "the executable"
                                                                          : resolved);
    return failed;
}
EOF

# run_prog LABEL ARG [env assignments...] EXECUTABLE: runs it, reports.
run_prog() {
    label=$1
    shift
    if out=$(env "$@" 2>&1); then
        echo "  ok: $out"
    else
        fail "$label: the program says:
$out"
    fi
}

echo "-- dynamic: -Iinclude -Lbuild -lcmalloc"
if $CC -std=gnu11 -Wall -Iinclude "$tmp/prog.c" -o "$tmp/prog-dynamic" -Lbuild -lcmalloc -ldl \
    2>"$tmp/cc.err"; then
    if command -v readelf >/dev/null 2>&1; then
        if readelf -d "$tmp/prog-dynamic" | grep NEEDED | grep -q 'libcmalloc\.so\.0'; then
            echo "  ok: NEEDED libcmalloc.so.0"
        else
            fail "dynamic: the executable does not need libcmalloc.so.0 (soname):
$(readelf -d "$tmp/prog-dynamic" | grep NEEDED)"
        fi
    fi
    run_prog dynamic LD_LIBRARY_PATH="$top/build" "$tmp/prog-dynamic" "$top/build"
else
    fail "dynamic: cannot build with -Lbuild -lcmalloc:
$(sed -n '1,10p' "$tmp/cc.err")"
fi

echo "-- static: build/libcmalloc.a"
if $CC -std=gnu11 -Wall -Iinclude "$tmp/prog.c" -o "$tmp/prog-static" build/libcmalloc.a -ldl \
    -pthread 2>"$tmp/cc.err"; then
    run_prog static "$tmp/prog-static" static
else
    fail "static: cannot build with build/libcmalloc.a:
$(sed -n '1,10p' "$tmp/cc.err")"
fi

cat >"$tmp/prog.cc" <<'EOF'
// Every operator new and delete of the program resolves to cmalloc's own (DESIGN.md: C++
// operator new/delete exported with their mangled names, so C++ programs skip a layer).
#include <cstdio>
#include <cstring>
#include <dlfcn.h>
#include <new>
#include <string>
#include <vector>

#include <cmalloc.h>

static void *base_of(void *address, const char **file)
{
    Dl_info info;
    std::memset(&info, 0, sizeof info);
    if (address == nullptr || dladdr(address, &info) == 0 || info.dli_fname == nullptr) {
        *file = "?";
        return nullptr;
    }
    *file = info.dli_fname;
    return info.dli_fbase;
}

static size_t in_use()
{
    cmalloc_stats s;
    std::memset(&s, 0, sizeof s);
    cmalloc_stats_get(&s);
    return s.bytes_in_use;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    static const char *const symbols[] = {
        "_Znwm", "_Znam", "_ZnwmRKSt9nothrow_t", "_ZnamRKSt9nothrow_t",
        "_ZnwmSt11align_val_t", "_ZnamSt11align_val_t",
        "_ZnwmSt11align_val_tRKSt9nothrow_t", "_ZnamSt11align_val_tRKSt9nothrow_t",
        "_ZdlPv", "_ZdaPv", "_ZdlPvm", "_ZdaPvm", "_ZdlPvRKSt9nothrow_t",
        "_ZdaPvRKSt9nothrow_t", "_ZdlPvSt11align_val_t", "_ZdaPvSt11align_val_t",
        "_ZdlPvmSt11align_val_t", "_ZdaPvmSt11align_val_t",
        "_ZdlPvSt11align_val_tRKSt9nothrow_t", "_ZdaPvSt11align_val_tRKSt9nothrow_t",
    };
    const char *main_file;
    void *main_base = base_of(reinterpret_cast<void *>(&main), &main_file);
    bool is_static = std::strcmp(argv[1], "static") == 0;
    std::string want = std::string(argv[1]) + "/libcmalloc.so.0";
    int failed = 0;
    for (const char *symbol : symbols) {
        const char *file;
        void *base = base_of(dlsym(RTLD_DEFAULT, symbol), &file);
        bool ok = is_static ? base == main_base : want == file;
        if (!ok) {
            std::printf("prog.cc: %s resolves into %s, not %s\n", symbol, file,
                        is_static ? "the executable" : want.c_str());
            failed = 1;
        }
    }
    size_t before = in_use();
    char *volatile block = new char[1 << 20];
    std::memset(block, 1, 1 << 20);
    std::vector<char> vector(1 << 20, 'v');
    size_t during = in_use();
    if (during < before + (2u << 20)) {
        std::printf("prog.cc: bytes_in_use %zu -> %zu after 2 MiB of new\n", before, during);
        failed = 1;
    }
    delete[] block;
    if (!failed)
        std::printf("prog.cc: every operator new/delete from %s\n",
                    is_static ? "the executable" : want.c_str());
    return failed;
}
EOF

if command -v g++ >/dev/null 2>&1; then
    CXX=${CXX:-g++}
    echo "-- C++ dynamic: operator new/delete from libcmalloc.so.0"
    if $CXX -std=c++17 -Wall -Iinclude "$tmp/prog.cc" -o "$tmp/prog-cxx-dynamic" -Lbuild -lcmalloc \
        -ldl 2>"$tmp/cc.err"; then
        run_prog c++-dynamic LD_LIBRARY_PATH="$top/build" "$tmp/prog-cxx-dynamic" "$top/build"
    else
        fail "C++ dynamic: cannot build with -Lbuild -lcmalloc:
$(sed -n '1,10p' "$tmp/cc.err")"
    fi
    echo "-- C++ static: operator new/delete from build/libcmalloc.a"
    if $CXX -std=c++17 -Wall -Iinclude "$tmp/prog.cc" -o "$tmp/prog-cxx-static" build/libcmalloc.a \
        -ldl -pthread 2>"$tmp/cc.err"; then
        run_prog c++-static "$tmp/prog-cxx-static" static
    else
        fail "C++ static: cannot build with build/libcmalloc.a:
$(sed -n '1,10p' "$tmp/cc.err")"
    fi
    # A C++ program with its own operator new and delete (plain and aligned, over an arena)
    # links with build/libcmalloc.a, where cmalloc's operators are weak: each strong one was a
    # second definition of the program's and failed the link at a45993c. Its other operators
    # (sized, array, nothrow) are cmalloc's and hand the arena's blocks to the program's, so
    # it prints what it prints without cmalloc; CMALLOC_STATS=1 shows cmalloc served it.
    cat >"$tmp/own_ops.cc" <<'EOF'
#include <cstdio>
#include <cstdlib>
#include <new>
alignas(64) static char arena[1 << 20];
static std::size_t used;
static long live;
static void *bump(std::size_t n, std::size_t a)
{
    std::size_t at = (used + a - 1) & ~(a - 1);
    if (n > sizeof arena || at + n > sizeof arena)
        throw std::bad_alloc();
    used = at + n;
    live++;
    return arena + at;
}
void *operator new(std::size_t n) { return bump(n, 16); }
void operator delete(void *p) noexcept { live -= p != nullptr; }
void *operator new(std::size_t n, std::align_val_t al) { return bump(n, std::size_t(al)); }
void operator delete(void *p, std::align_val_t) noexcept { live -= p != nullptr; }
struct Node { long v; Node *next; };
struct alignas(64) Line { long v[8]; ~Line() {} };
template <class T> static T *opaque(T *p) { __asm__ volatile("" : "+r"(p)); return p; }
int main()
{
    delete opaque(new Node{1, nullptr});          // sized delete
    delete[] opaque(new Node[4]);                 // new[] and delete[]: the program's via defaults
    delete opaque(new (std::nothrow) Node{});     // nothrow new
    delete opaque(new Line{});                    // sized aligned delete
    delete[] opaque(new Line[2]);                 // aligned new[] and delete[]
    void *m = std::malloc(100);                   // malloc is cmalloc's
    std::free(m);
    std::printf("own_ops.cc: live %ld\n", live);
    return live != 0;
}
EOF
    echo "-- C++ static: a program's own operator new and delete beside build/libcmalloc.a"
    if $CXX -std=c++17 -O1 "$tmp/own_ops.cc" -o "$tmp/own_ops_base" 2>"$tmp/cc.err" &&
        $CXX -std=c++17 -O1 "$tmp/own_ops.cc" -o "$tmp/own_ops_static" build/libcmalloc.a \
            -pthread 2>"$tmp/cc.err"; then
        base=$("$tmp/own_ops_base" 2>&1)
        for mode in 0 1; do
            out=$(CMALLOC_CHECK=$mode CMALLOC_STATS=1 "$tmp/own_ops_static" 2>"$tmp/own_ops.err")
            rc=$?
            if [ "$rc" -ne 0 ] || [ "$out" != "$base" ] ||
                ! grep -q '^cmalloc stats' "$tmp/own_ops.err"; then
                fail "own operators, CMALLOC_CHECK=$mode: exit $rc, '$out' (without cmalloc:" \
                    "'$base'), $(grep -c '^cmalloc stats' "$tmp/own_ops.err") stats reports;" \
                    "$(grep '^cmalloc:' "$tmp/own_ops.err" | head -n 1)"
            else
                echo "  ok (CMALLOC_CHECK=$mode): $out, served by cmalloc"
            fi
        done
    else
        fail "C++ static with its own operators: cannot build:
$(sed -n '1,6p' "$tmp/cc.err")"
    fi
    cat >"$tmp/oom.cc" <<'EOF'
// A request no machine can meet (2^50 bytes, from argc so that the compiler cannot fold it).
#include <cstddef>
#include <cstdio>
#include <new>

static int handler_calls;
static char *reserve;

static void give_back()
{
    handler_calls++;
    if (reserve != nullptr) { // first call: free the reserve and let new try again
        delete[] reserve;
        reserve = nullptr;
    } else {
        std::set_new_handler(nullptr); // then give up: new throws
    }
}

int main(int argc, char **)
{
    std::size_t huge = std::size_t(1) << (40 + 10 * argc);
    int failed = 0;
    try {
        char *p = new char[huge];
        std::printf("oom.cc: new of 2^50 bytes returned %p\n", static_cast<void *>(p));
        failed = 1;
    } catch (const std::bad_alloc &) {
    }
    if (new (std::nothrow) char[huge] != nullptr) {
        std::printf("oom.cc: nothrow new of 2^50 bytes did not return NULL\n");
        failed = 1;
    }
    reserve = new char[1 << 20];
    std::set_new_handler(give_back);
    try {
        char *p = new char[huge];
        std::printf("oom.cc: new with a handler returned %p\n", static_cast<void *>(p));
        failed = 1;
    } catch (const std::bad_alloc &) {
    }
    if (handler_calls != 2) {
        std::printf("oom.cc: the new-handler ran %d times, not 2\n", handler_calls);
        failed = 1;
    }
    if (!failed)
        std::printf("oom.cc: bad_alloc, NULL and the new-handler as the standard has them\n");
    return failed;
}
EOF
    for how in -static-libstdc++ -static; do
        echo "-- C++ $how: a failing new throws std::bad_alloc"
        if $CXX -std=c++17 -O1 -Wall "$tmp/oom.cc" -o "$tmp/oom$how" $how build/libcmalloc.a \
            -pthread 2>"$tmp/cc.err"; then
            if out=$("$tmp/oom$how" 2>&1); then
                echo "  $out"
            else
                fail "C++ $how: $(echo "$out" | head -n 3)"
            fi
        else
            fail "C++ $how: cannot build with build/libcmalloc.a:
$(grep -v 'requires at runtime the shared libraries' "$tmp/cc.err" | sed -n '1,10p')"
        fi
    done
else
    echo "-- C++: SKIP, g++ is not installed"
fi

echo "-- installed: make install PREFIX=\$tmp, pkg-config --cflags --libs cmalloc"
prefix="$tmp/prefix"
if ! $MAKE -s install PREFIX="$prefix" >"$tmp/install.log" 2>&1; then
    fail "make install PREFIX=$prefix failed:
$(tail -n 10 "$tmp/install.log")"
else
    for f in lib/libcmalloc.so lib/libcmalloc.so.0 lib/libcmalloc.a include/cmalloc.h \
        lib/pkgconfig/cmalloc.pc; do
        [ -e "$prefix/$f" ] || fail "installed: $f is missing under PREFIX"
    done
    if ! command -v pkg-config >/dev/null 2>&1; then
        fail "installed: pkg-config is not installed (scripts/deps.sh installs it)"
    else
        export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
        if flags=$(pkg-config --cflags --libs cmalloc 2>&1); then
            echo "  pkg-config: $flags"
            header_version=$(sed -n 's/^#define CMALLOC_VERSION "\(.*\)"/\1/p' include/cmalloc.h)
            pc_version=$(pkg-config --modversion cmalloc)
            [ "$pc_version" = "$header_version" ] ||
                fail "installed: cmalloc.pc says version $pc_version, cmalloc.h $header_version"
            # Built outside the source tree, so only the installed header and library can be found.
            # $flags is split into words on purpose.
            # shellcheck disable=SC2086
            if (cd "$tmp" && $CC -std=gnu11 -Wall prog.c -o prog-installed $flags -ldl) \
                2>"$tmp/cc.err"; then
                run_prog installed LD_LIBRARY_PATH="$prefix/lib" "$tmp/prog-installed" "$prefix/lib"
            else
                fail "installed: cannot build with \$(pkg-config --cflags --libs cmalloc):
$(sed -n '1,10p' "$tmp/cc.err")"
            fi
        else
            fail "installed: pkg-config --cflags --libs cmalloc: $flags"
        fi
    fi
fi

if [ "$failures" -ne 0 ]; then
    echo "test_link: FAIL:$failed_names"
    exit 1
fi
echo "test_link: all passed"
