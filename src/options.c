/* options.c - cmalloc's tunables: one table (name, default, doc), read once from the environment.
 *
 * CMALLOC_<NAME>=<value> sets option <name>. Sizes take K, M or G suffixes. Read at init straight
 * from environ (getenv may allocate or take locale locks); a bad value gets a one-line warning
 * on stderr and the default. The README's option list is written from this table.
 */
#include "internal.h"

#include <string.h>

cm_options cm_option;

typedef struct option_entry {
    const char *name;          /* after the CMALLOC_ prefix */
    void *field;               /* into cm_option */
    int is_signed;             /* int64_t field (else size_t) */
    int64_t default_value;
    const char *doc;
} option_entry;

static const option_entry options[] = {
    {"MMAP_THRESHOLD", &cm_option.mmap_threshold, 0, 1 << 20,
     "requests above this many bytes get their own mmap (and mremap on realloc)"},
    {"MMAP_THRESHOLD_MAX", &cm_option.mmap_threshold_max, 0, 32 << 20,
     "freeing a mapped block raises the threshold to its size, up to this, so blocks churned "
     "again and again stay in the page heap (as glibc does); equal to MMAP_THRESHOLD: fixed"},
    {"THREAD_CACHE_MAX", &cm_option.thread_cache_max, 0, 2 << 20,
     "most bytes one thread's cache may hold"},
    {"THREAD_CACHE_TOTAL", &cm_option.thread_cache_total, 0, 64 << 20,
     "most bytes all thread caches together may hold"},
    {"RELEASE_DELAY_MS", &cm_option.release_delay_ms, 1, 1000,
     "free pages idle this long are returned to the OS (0: at once, -1: never)"},
    {"BACKGROUND_RELEASE", &cm_option.background_release, 0, 1,
     "1: once 8 MiB of free pages are resident, a helper thread returns idle ones even when "
     "the program makes no calls; 0: only allocator calls do"},
    {"STATS", &cm_option.stats_at_exit, 0, 0, "1: print the stats report to stderr at exit"},
    {"CHECK", &cm_option.check, 0, 0,
     "1: debug mode: canaries, freed-memory patterns, quarantine; several times slower"},
    {"ABORT_ON_ERROR", &cm_option.abort_on_error, 0, 1,
     "1: abort after reporting an invalid or double free; 0: leak the pointer and go on"},
};
enum { OPTION_COUNT = sizeof options / sizeof options[0] };

static void store(const option_entry *o, int64_t value)
{
    if (o->is_signed)
        *(int64_t *)o->field = value;
    else
        *(size_t *)o->field = (size_t)value;
}

/* Parses [-]digits[KMG]; returns 0 on success. */
static int parse_value(const char *text, int allow_negative, int64_t *out)
{
    int negative = 0;
    if (*text == '-' && allow_negative) {
        negative = 1;
        text++;
    }
    if (*text < '0' || *text > '9')
        return -1;
    uint64_t value = 0;
    for (; *text >= '0' && *text <= '9'; text++) {
        if (value > (UINT64_MAX / 2 - 9) / 10)
            return -1;
        value = value * 10 + (uint64_t)(*text - '0');
    }
    unsigned shift = 0;
    switch (*text) {
    case 'k': case 'K': shift = 10; text++; break;
    case 'm': case 'M': shift = 20; text++; break;
    case 'g': case 'G': shift = 30; text++; break;
    default: break;
    }
    if (*text != '\0' || value > ((uint64_t)INT64_MAX >> shift))
        return -1;
    *out = negative ? -(int64_t)(value << shift) : (int64_t)(value << shift);
    return 0;
}

static void warn_bad(const char *assignment, const char *why)
{
    cm_message m = {.length = 0};
    cm_message_str(&m, "cmalloc: warning: ignoring ");
    cm_message_str(&m, assignment);
    cm_message_str(&m, " (");
    cm_message_str(&m, why);
    cm_message_str(&m, "); using the default\n");
    cm_message_write(&m, 2);
}

void cm_options_init(char **environment)
{
    for (int i = 0; i < OPTION_COUNT; i++)
        store(&options[i], options[i].default_value);
    for (char **entry = environment; entry && *entry; entry++) {
        if (strncmp(*entry, "CMALLOC_", 8) != 0)
            continue;
        const char *name = *entry + 8, *equals = strchr(name, '=');
        if (equals == NULL)
            continue;
        int i = 0;
        while (i < OPTION_COUNT && !(strncmp(options[i].name, name, (size_t)(equals - name)) == 0 &&
                                     options[i].name[equals - name] == '\0'))
            i++;
        if (i == OPTION_COUNT) {
            warn_bad(*entry, "unknown option");
            continue;
        }
        int64_t value;
        if (parse_value(equals + 1, options[i].is_signed, &value) != 0)
            warn_bad(*entry, "not a number with an optional K, M or G suffix");
        else
            store(&options[i], value);
    }
}

void cm_options_print(int fd)
{
    cm_message m = {.length = 0};
    for (int i = 0; i < OPTION_COUNT; i++) {
        cm_message_str(&m, "  CMALLOC_");
        cm_message_str(&m, options[i].name);
        cm_message_str(&m, "=");
        int64_t value = options[i].is_signed ? *(int64_t *)options[i].field
                                             : (int64_t) * (size_t *)options[i].field;
        if (value < 0) {
            cm_message_str(&m, "-");
            value = -value;
        }
        cm_message_uint(&m, (uint64_t)value);
        cm_message_str(&m, "  ");
        cm_message_str(&m, options[i].doc);
        cm_message_str(&m, "\n");
        cm_message_write(&m, fd);
    }
}
