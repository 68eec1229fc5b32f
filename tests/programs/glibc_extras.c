/* glibc_extras.c - the glibc malloc extras and error paths programs rely on, and libc functions
 * that allocate inside: every check prints "FAIL what" and the program exits 1 if any failed.
 * - posix_memalign: EINVAL for 0, 3, 24 and other non-powers of two; ENOMEM (and *out left
 *   alone) for 2^62 and 2^63 alignments and for SIZE_MAX bytes; odd but valid alignments work;
 * - memalign rounds a non-power-of-two alignment up; valloc/pvalloc give page-aligned blocks,
 *   pvalloc a whole page's usable size; malloc_usable_size >= the request on memalign'd and
 *   realloc'd blocks and the usable bytes can be written;
 * - malloc(SIZE_MAX), calloc and reallocarray overflows, realloc to SIZE_MAX - 4096 and to
 *   2^62 fail with errno ENOMEM and leave the old block intact and usable;
 * - realloc(p, 0) frees p and returns NULL (glibc); realloc(NULL, 0) and malloc(0) return
 *   distinct freeable blocks; a successful call leaves errno alone;
 * - mallinfo2 counts 8 MiB held; malloc_info(0) writes <malloc, malloc_info(1) is EINVAL;
 *   mallopt accepts M_MMAP_THRESHOLD, M_ARENA_MAX, M_TRIM_THRESHOLD; malloc_trim and
 *   malloc_stats return;
 * - C23's free_sized and free_aligned_sized, looked up as a program built against glibc 2.43
 *   finds them: under LD_PRELOAD of cmalloc they are cmalloc's (not a libc's, which would get
 *   cmalloc's blocks), and they free blocks of malloc, calloc, realloc and aligned_alloc;
 *   without cmalloc, a libc's when it has them;
 * - strdup, strndup, asprintf, getline, qsort of 1 MB, open_memstream, regcomp/regexec,
 *   setlocale, iconv, getaddrinfo("localhost"), glob, scandir, obstack, tsearch give the same
 *   results as without cmalloc (checked against fixed answers). */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <errno.h>
#include <glob.h>
#include <iconv.h>
#include <locale.h>
#include <malloc.h>
#include <netdb.h>
#include <obstack.h>
#include <regex.h>
#include <search.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The impossible sizes below are the point, and a failed realloc leaves the old block live. */
#pragma GCC diagnostic ignored "-Walloc-size-larger-than="
#if __GNUC__ >= 12
#pragma GCC diagnostic ignored "-Wuse-after-free"
#endif

static int failures;
#define CHECK(cond, ...)                                                                       \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            printf("FAIL " __VA_ARGS__);                                                       \
            printf("  (%s, line %d)\n", #cond, __LINE__);                                      \
            failures++;                                                                        \
        }                                                                                      \
    } while (0)

#define obstack_chunk_alloc malloc
#define obstack_chunk_free  free

static int aligned(const void *p, size_t alignment)
{
    return ((uintptr_t)p & (alignment - 1)) == 0;
}

static int filled(const unsigned char *p, size_t n, unsigned char value)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != value)
            return 0;
    return 1;
}

static int compare_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static void sized_frees(void)
{
    void (*sized)(void *, size_t) = (void (*)(void *, size_t))dlsym(RTLD_DEFAULT, "free_sized");
    void (*aligned_sized)(void *, size_t, size_t) =
        (void (*)(void *, size_t, size_t))dlsym(RTLD_DEFAULT, "free_aligned_sized");
    const char *preload = getenv("LD_PRELOAD");
    if (preload != NULL && strstr(preload, "libcmalloc") != NULL) {
        Dl_info where, where_aligned;
        CHECK(sized != NULL && aligned_sized != NULL, "free_sized under cmalloc: not found\n");
        if (sized == NULL || aligned_sized == NULL)
            return;
        CHECK(dladdr((void *)sized, &where) && strstr(where.dli_fname, "libcmalloc") != NULL &&
                  dladdr((void *)aligned_sized, &where_aligned) &&
                  strstr(where_aligned.dli_fname, "libcmalloc") != NULL,
              "free_sized and free_aligned_sized resolve into %s and %s, not cmalloc\n",
              where.dli_fname, where_aligned.dli_fname);
    }
    if (sized == NULL || aligned_sized == NULL)
        return; /* a libc before 2.43, alone */
    for (size_t n = 0; n < 1 << 22; n = n * 2 + 24) {
        char *p = malloc(n);
        memset(p, 1, n);
        sized(p, n);
        p = calloc(3, n);
        sized(p, 3 * n);
        p = realloc(malloc(n + 100), n + 1);
        sized(p, n + 1);
        p = aligned_alloc(256, n + 256);
        memset(p, 2, n + 256);
        aligned_sized(p, 256, n + 256);
    }
}

static void alignment_calls(void)
{
    void *p = (void *)0x1234;
    size_t bad[] = {0, 1, 2, 3, 4, 12, 24, 48, 100, 4095, (size_t)1 << 63 | 8};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = posix_memalign(&p, bad[i], 16);
        CHECK(rc == EINVAL, "posix_memalign(alignment %zu) = %d, want EINVAL\n", bad[i], rc);
    }
    CHECK(p == (void *)0x1234, "posix_memalign changed *out on failure\n");
    size_t huge[] = {(size_t)1 << 62, (size_t)1 << 63};
    for (size_t i = 0; i < 2; i++) {
        errno = 0;
        int rc = posix_memalign(&p, huge[i], 16);
        CHECK(rc == ENOMEM, "posix_memalign(alignment 2^%d) = %d, want ENOMEM\n", 62 + (int)i,
              rc);
        CHECK(p == (void *)0x1234, "posix_memalign changed *out on failure\n");
    }
    int rc = posix_memalign(&p, 64, SIZE_MAX);
    CHECK(rc == ENOMEM, "posix_memalign(64, SIZE_MAX) = %d\n", rc);
    rc = posix_memalign(&p, 4096, SIZE_MAX - 4096);
    CHECK(rc == ENOMEM, "posix_memalign(4096, SIZE_MAX - 4096) = %d\n", rc);
    for (size_t alignment = 8; alignment <= ((size_t)1 << 24); alignment *= 2) {
        for (size_t size = 0; size < 3 * alignment && size < 40000; size += alignment / 2 + 7) {
            void *q = NULL;
            rc = posix_memalign(&q, alignment, size);
            CHECK(rc == 0 && aligned(q, alignment), "posix_memalign(%zu, %zu)\n", alignment,
                  size);
            if (rc != 0)
                continue;
            size_t usable = malloc_usable_size(q);
            CHECK(usable >= size, "usable %zu < %zu (posix_memalign %zu)\n", usable, size,
                  alignment);
            memset(q, 0x33, usable);
            free(q);
        }
    }
    size_t odd[] = {3, 5, 24, 48, 100, 1000, 3000, 5000, 100000};
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        size_t want = 1;
        while (want < odd[i])
            want <<= 1;
        void *q = memalign(odd[i], 100);
        CHECK(q != NULL && aligned(q, want), "memalign(%zu) not aligned to %zu\n", odd[i], want);
        if (q) {
            CHECK(malloc_usable_size(q) >= 100, "memalign usable\n");
            memset(q, 1, malloc_usable_size(q));
            void *r = realloc(q, 5000);
            CHECK(r != NULL && filled(r, 100, 1), "realloc of a memalign'd block lost data\n");
            CHECK(malloc_usable_size(r) >= 5000, "realloc'd usable\n");
            memset(r, 2, malloc_usable_size(r));
            free(r);
        }
    }
    void *v = valloc(1);
    CHECK(v != NULL && aligned(v, 4096), "valloc(1)\n");
    free(v);
    v = pvalloc(1);
    CHECK(v != NULL && aligned(v, 4096) && malloc_usable_size(v) >= 4096, "pvalloc(1)\n");
    if (v)
        memset(v, 1, 4096);
    free(v);
    v = pvalloc(0);
    CHECK(v != NULL && aligned(v, 4096), "pvalloc(0)\n");
    free(v);
    errno = 0;
    v = pvalloc(SIZE_MAX - 100);
    CHECK(v == NULL && errno == ENOMEM, "pvalloc(SIZE_MAX - 100): %p errno %d\n", v, errno);
    errno = 0;
    v = aligned_alloc(64, 200);
    CHECK(v != NULL && aligned(v, 64) && errno == 0, "aligned_alloc(64, 200)\n");
    free(v);
    v = aligned_alloc(4096, 1);
    CHECK(v != NULL && aligned(v, 4096), "aligned_alloc(4096, 1)\n");
    free(v);
    errno = 0;
    v = aligned_alloc((size_t)1 << 62, 1);
    CHECK(v == NULL && errno == ENOMEM, "aligned_alloc(2^62, 1): %p errno %d\n", v, errno);
    errno = 0;
    v = memalign(64, SIZE_MAX - 10);
    CHECK(v == NULL && errno == ENOMEM, "memalign(64, SIZE_MAX - 10): %p errno %d\n", v, errno);
}

static void failing_sizes(void)
{
    errno = 0;
    void *p = malloc(SIZE_MAX);
    CHECK(p == NULL && errno == ENOMEM, "malloc(SIZE_MAX): %p errno %d\n", p, errno);
    errno = 0;
    p = malloc((size_t)PTRDIFF_MAX + 1);
    CHECK(p == NULL && errno == ENOMEM, "malloc(PTRDIFF_MAX + 1): %p errno %d\n", p, errno);
    errno = 0;
    p = calloc(SIZE_MAX / 2, 3);
    CHECK(p == NULL && errno == ENOMEM, "calloc overflow: %p errno %d\n", p, errno);
    errno = 0;
    p = calloc((size_t)1 << 33, (size_t)1 << 31);
    CHECK(p == NULL && errno == ENOMEM, "calloc 2^33 * 2^31: %p errno %d\n", p, errno);

    size_t sizes[] = {24, 1000, 100000, 5 << 20};
    for (size_t i = 0; i < 4; i++) {
        size_t n = sizes[i];
        unsigned char *old = malloc(n);
        memset(old, 0x77, n);
        size_t bad[] = {SIZE_MAX, SIZE_MAX - 4096, (size_t)PTRDIFF_MAX + 1, (size_t)1 << 62};
        for (size_t k = 0; k < 4; k++) {
            errno = 0;
            void *q = realloc(old, bad[k]);
            CHECK(q == NULL && errno == ENOMEM, "realloc(%zu B, %#zx): %p errno %d\n", n, bad[k],
                  q, errno);
            if (q != NULL)
                old = q;
        }
        errno = 0;
        void *q = reallocarray(old, SIZE_MAX / 4, 8);
        CHECK(q == NULL && errno == ENOMEM, "reallocarray overflow: %p errno %d\n", q, errno);
        CHECK(filled(old, n, 0x77), "the old block of %zu B changed after failed reallocs\n",
              n);
        errno = 0;
        q = reallocarray(old, n / 4 + 1, 8);
        CHECK(q != NULL && errno == 0 && filled(q, n, 0x77), "reallocarray %zu B\n", n);
        free(q);
    }

    errno = 0;
    void *a = malloc(0), *b = malloc(0), *c = realloc(NULL, 0);
    CHECK(a && b && c && a != b && b != c && a != c && errno == 0, "malloc(0) blocks\n");
    free(a);
    free(b);
    free(c);
    char *d = malloc(100);
    memset(d, 1, 100);
    errno = 0;
    void *e = realloc(d, 0);
    CHECK(e == NULL, "realloc(p, 0) returned %p (glibc frees p and returns NULL)\n", e);
    free(e);
}

static void extras(void)
{
    enum { N = 64 };
    void *blocks[N];
    for (int i = 0; i < N; i++) {
        blocks[i] = malloc(128 << 10);
        memset(blocks[i], 1, 128 << 10);
    }
    struct mallinfo2 info = mallinfo2();
    size_t in_use = info.uordblks + info.hblkhd;
    CHECK(in_use >= (size_t)N * (128 << 10), "mallinfo2: %zu bytes in use with 8 MiB held\n",
          in_use);
    CHECK(info.arena >= info.uordblks, "mallinfo2: arena %zu < uordblks %zu\n", info.arena,
          info.uordblks);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    struct mallinfo old = mallinfo();
#pragma GCC diagnostic pop
    CHECK(old.uordblks + old.hblkhd > 0, "mallinfo: nothing in use\n");
    for (int i = 0; i < N; i++)
        free(blocks[i]);

    char *text = NULL;
    size_t length = 0;
    FILE *f = open_memstream(&text, &length);
    CHECK(malloc_info(0, f) == 0, "malloc_info(0)\n");
    fclose(f);
    CHECK(text && strncmp(text, "<malloc", 7) == 0, "malloc_info output: %.20s\n", text);
    free(text);
    f = fopen("/dev/null", "w");
    CHECK(malloc_info(1, f) == EINVAL, "malloc_info(1) is not EINVAL\n");
    fclose(f);
    CHECK(mallopt(M_MMAP_THRESHOLD, 1 << 20) == 1, "mallopt(M_MMAP_THRESHOLD, 1 MiB)\n");
    CHECK(mallopt(M_ARENA_MAX, 1) == 1, "mallopt(M_ARENA_MAX)\n");
    CHECK(mallopt(M_TRIM_THRESHOLD, 1 << 20) == 1, "mallopt(M_TRIM_THRESHOLD)\n");
    int trimmed = malloc_trim(0);
    CHECK(trimmed == 0 || trimmed == 1, "malloc_trim returned %d\n", trimmed);
    int saved = dup(2), null = open("/dev/null", 1);
    dup2(null, 2);
    malloc_stats();
    dup2(saved, 2);
    close(null);
    close(saved);
    CHECK(malloc_usable_size(NULL) == 0, "malloc_usable_size(NULL)\n");
}

static int tree_compare(const void *a, const void *b)
{
    return strcmp(a, b);
}
static void free_node(void *p)
{
    free(p);
}

static void libc_internals(void)
{
    char long_text[3000];
    memset(long_text, 'q', sizeof long_text - 1);
    long_text[sizeof long_text - 1] = '\0';
    char *s = strdup(long_text);
    CHECK(s && strcmp(s, long_text) == 0, "strdup\n");
    free(s);
    s = strndup(long_text, 77);
    CHECK(s && strlen(s) == 77, "strndup\n");
    free(s);
    CHECK(asprintf(&s, "%d-%s-%.3f", 42, "x", 1.5) == 10 && strcmp(s, "42-x-1.500") == 0,
          "asprintf\n");
    free(s);

    char *lines = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&lines, &size);
    for (int i = 0; i < 300; i++)
        fprintf(f, "%0*d\n", i * 10 + 1, i);
    fclose(f);
    f = fmemopen(lines, size, "r");
    char *line = NULL;
    size_t capacity = 0;
    ssize_t n;
    int count = 0;
    while ((n = getline(&line, &capacity, f)) > 0)
        count += n == (ssize_t)(count * 10 + 2);
    CHECK(count == 300, "getline read %d right lines of 300\n", count);
    free(line);
    fclose(f);
    free(lines);

    enum { M = 250000 };
    int *values = malloc(M * sizeof *values);
    for (int i = 0; i < M; i++)
        values[i] = (int)((i * 7919u) % M);
    qsort(values, M, sizeof *values, compare_int);
    int sorted = 1;
    for (int i = 0; i < M; i++)
        sorted &= values[i] == i;
    CHECK(sorted, "qsort of 1 MB\n");
    free(values);

    regex_t re;
    regmatch_t match[2];
    CHECK(regcomp(&re, "([a-z]+)[0-9]{3}$", REG_EXTENDED) == 0, "regcomp\n");
    CHECK(regexec(&re, "xx abcde123", 2, match, 0) == 0 && match[1].rm_so == 3 &&
              match[1].rm_eo == 8,
          "regexec\n");
    regfree(&re);

    const char *locale = setlocale(LC_ALL, "C.UTF-8");
    CHECK(locale != NULL, "setlocale(C.UTF-8)\n");
    iconv_t cd = iconv_open("UTF-16LE", "UTF-8");
    CHECK(cd != (iconv_t)-1, "iconv_open\n");
    if (cd != (iconv_t)-1) {
        char in[] = "h\xc3\xa9llo", out[32];
        char *ip = in, *op = out;
        size_t il = strlen(in), ol = sizeof out;
        CHECK(iconv(cd, &ip, &il, &op, &ol) == 0 && op - out == 10, "iconv\n");
        iconv_close(cd);
    }
    setlocale(LC_ALL, "C");

    struct addrinfo hints = {0}, *result = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo("localhost", "80", &hints, &result);
    /* a machine without a localhost entry answers EAI_NONAME or EAI_AGAIN: not ours to judge */
    CHECK(rc == 0 ? result != NULL : rc == EAI_NONAME || rc == EAI_AGAIN,
          "getaddrinfo(localhost): %s\n", gai_strerror(rc));
    if (rc == 0)
        freeaddrinfo(result);

    glob_t g;
    CHECK(glob("/etc/*", 0, NULL, &g) == 0 && g.gl_pathc > 3, "glob\n");
    globfree(&g);
    struct dirent **entries;
    int k = scandir("/etc", &entries, NULL, alphasort);
    CHECK(k > 3, "scandir\n");
    for (int i = 0; i < k; i++)
        free(entries[i]);
    if (k >= 0)
        free(entries);

    struct obstack stack;
    obstack_init(&stack);
    for (int i = 0; i < 5000; i++)
        obstack_grow(&stack, "abcdefgh", 8);
    obstack_1grow(&stack, 0);
    char *grown = obstack_finish(&stack);
    CHECK(strlen(grown) == 40000, "obstack\n");
    for (int i = 0; i < 2000; i++)
        obstack_alloc(&stack, (size_t)(i % 300 + 1));
    obstack_free(&stack, NULL);

    void *root = NULL;
    for (int i = 0; i < 2000; i++) {
        char *key;
        if (asprintf(&key, "key%05d", (i * 37) % 2000) < 0)
            break;
        tsearch(key, &root, tree_compare);
    }
    CHECK(tfind("key01999", &root, tree_compare) != NULL, "tsearch\n");
    tdestroy(root, free_node);
}

int main(void)
{
    alignment_calls();
    sized_frees();
    failing_sizes();
    extras();
    libc_internals();
    if (failures)
        printf("%d check(s) failed\n", failures);
    return failures ? 1 : 0;
}
