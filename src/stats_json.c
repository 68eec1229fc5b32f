/* stats_json.c - cmalloc_stats_print_json: the statistics as one JSON object, for programs
 * (CMALLOC_STATS=json prints it at exit; scripts/cmalloc-stats reads it).
 *
 * Owns only the format; the numbers come from the layers' own counters (cmalloc_stats_get,
 * cm_central_objects_out, cm_page_heap_counters, cm_mapped_live_bytes) and from a lock-free
 * walk of the pagemap to count each class's spans. Each layer is read under its own lock, one at
 * a time, so the object is a snapshot that other threads may move meanwhile, as with
 * cmalloc_stats_get. Nothing here allocates: text goes through a cm_message on the stack,
 * written out whenever it is nearly full, so the object may span several write(2) calls but
 * is one line. The fields are described in docs/DESIGN.md ("Statistics"); in a process where
 * only the calling thread has a cache they add up:
 *   totals.in_use == sum over classes of in_use * size + large.bytes + mapped_blocks.bytes
 *                    - layers.quarantine - layers.sample_stash
 *   layers.central_caches == sum of central_cache * size
 *   layers.calling_thread_cache == sum of thread_cache * size      (always, any thread count)
 */
#include "internal.h"
#include "cmalloc.h"

#include <string.h>

typedef struct json_writer {
    cm_message message;
    int fd;
    bool need_comma; /* a member or element was written at this level: the next needs a comma */
} json_writer;

/* Every piece written at once is far shorter than this margin, so nothing is ever cut. */
enum { FLUSH_MARGIN = 128 };

static void put(json_writer *w, const char *text)
{
    if (w->message.length > sizeof w->message.text - FLUSH_MARGIN)
        cm_message_write(&w->message, w->fd);
    cm_message_str(&w->message, text);
}

/* Starts a member: a comma when needed, then "name": (name NULL for an array element). Names
 * are written in lower case, which turns option names (MMAP_THRESHOLD) into CMALLOC_CONF's. */
static void member(json_writer *w, const char *name)
{
    put(w, w->need_comma ? "," : "");
    w->need_comma = true;
    if (name == NULL)
        return;
    char quoted[64];
    size_t n = 0;
    quoted[n++] = '"';
    for (; *name && n < sizeof quoted - 3; name++)
        quoted[n++] = *name >= 'A' && *name <= 'Z' ? (char)(*name - 'A' + 'a') : *name;
    quoted[n++] = '"';
    quoted[n++] = ':';
    quoted[n] = '\0';
    put(w, quoted);
}

static void begin(json_writer *w, const char *name, const char *bracket)
{
    member(w, name);
    put(w, bracket);
    w->need_comma = false;
}

static void end(json_writer *w, const char *bracket)
{
    put(w, bracket);
    w->need_comma = true;
}

static void number(json_writer *w, const char *name, int64_t value)
{
    member(w, name);
    if (value < 0)
        put(w, "-");
    put(w, ""); /* flushes first if needed, so the digits below always fit */
    cm_message_uint(&w->message, value < 0 ? (uint64_t)-value : (uint64_t)value);
}

/* A string as JSON: quotes, backslashes and control characters escaped (a program's name may
 * hold any of them); one piece at a time, so that a long one is flushed as it goes. */
static void string(json_writer *w, const char *name, const char *value)
{
    member(w, name);
    put(w, "\"");
    for (; *value; value++) {
        unsigned char c = (unsigned char)*value;
        char piece[7] = {(char)c, '\0'};
        if (c == '"' || c == '\\') {
            piece[0] = '\\';
            piece[1] = (char)c;
            piece[2] = '\0';
        } else if (c < 0x20) {
            memcpy(piece, "\\u00", 4);
            piece[4] = "0123456789abcdef"[c >> 4];
            piece[5] = "0123456789abcdef"[c & 15];
            piece[6] = '\0';
        }
        put(w, piece);
    }
    put(w, "\"");
}

/* SMALL spans per class: the pagemap has an entry for every page of a SMALL span, and only
 * its first page has page-in-span 0. Lock-free, like free's own reads of the pagemap. */
static void count_spans(size_t spans[CM_CLASSES_MAX])
{
    for (size_t root = 0; root < ((size_t)1 << CM_PAGEMAP_ROOT_BITS); root++) {
        cm_pagemap_leaf *leaf = __atomic_load_n(&cm_pagemap_root[root], __ATOMIC_ACQUIRE);
        if (leaf == NULL)
            continue;
        for (size_t page = 0; page < CM_PAGEMAP_CLASS_PAGES; page++) {
            if (!cm_pagemap_written(leaf, page))
                continue; /* not written since given back: zeros */
            const cm_page_class *entries = &leaf->classes[page * CM_PAGEMAP_CLASSES_PER_PAGE];
            for (size_t i = 0; i < CM_PAGEMAP_CLASSES_PER_PAGE; i++) {
                unsigned size_class = __atomic_load_n(&entries[i].size_class, __ATOMIC_RELAXED);
                if (size_class != 0 && size_class < CM_CLASSES_MAX &&
                    __atomic_load_n(&entries[i].span_pages, __ATOMIC_RELAXED) == 0)
                    spans[size_class]++;
            }
        }
    }
}

static void size_classes(json_writer *w)
{
    size_t spans[CM_CLASSES_MAX] = {0};
    count_spans(spans);
    begin(w, "size_classes", "[");
    for (unsigned c = 1; c < cm_class_count; c++) {
        size_t central, out = cm_central_objects_out(c, &central);
        size_t cached = cm_thread_cache_objects(c);
        if (out == 0 && spans[c] == 0)
            continue;
        begin(w, NULL, "{");
        number(w, "class", c);
        number(w, "size", cm_classes[c].size);
        number(w, "pages", cm_classes[c].pages);
        number(w, "batch", cm_classes[c].batch);
        number(w, "spans", (int64_t)spans[c]);
        number(w, "objects_out", (int64_t)out);
        number(w, "central_cache", (int64_t)central);
        number(w, "thread_cache", (int64_t)cached);
        number(w, "in_use", out > central + cached ? (int64_t)(out - central - cached) : 0);
        end(w, "}");
    }
    end(w, "]");
}

static void options(json_writer *w)
{
    const char *name, *keyword;
    int64_t value;
    begin(w, "options", "{");
    for (unsigned i = 0; cm_option_at(i, &name, &value, &keyword); i++) {
        if (keyword)
            string(w, name, keyword);
        else
            number(w, name, value);
    }
    end(w, "}");
}

CM_EXPORT void cmalloc_stats_print_json(int fd)
{
    json_writer w = {.message = {.length = 0}, .fd = fd, .need_comma = false};
    cmalloc_stats s;
    size_t heap_free, released, large_bytes, large_count, mapped_count, own_bytes = 0;
    cmalloc_stats_get(&s);
    begin(&w, NULL, "{");
    string(&w, "cmalloc", CMALLOC_VERSION);
    number(&w, "pid", cm_os_process_id());
    string(&w, "program", cm_os_program_name());
    number(&w, "page_size", CM_PAGE_SIZE);
    number(&w, "initialized", cm_is_initialized());
    if (cm_is_initialized()) {
        cm_page_heap_counters(&heap_free, &released, &large_bytes, &large_count);
        size_t mapped_bytes = cm_mapped_live_bytes(&mapped_count);
        for (unsigned c = 1; c < cm_class_count; c++)
            own_bytes += cm_thread_cache_objects(c) * cm_classes[c].size;
        begin(&w, "totals", "{");
        number(&w, "in_use", (int64_t)s.bytes_in_use);
        number(&w, "mapped", (int64_t)s.bytes_mapped);
        number(&w, "released", (int64_t)s.bytes_released);
        number(&w, "metadata", (int64_t)s.bytes_metadata);
        number(&w, "thread_caches_live", (int64_t)s.thread_caches);
        end(&w, "}");
        begin(&w, "layers", "{");
        number(&w, "thread_caches", (int64_t)s.bytes_thread_caches);
        number(&w, "calling_thread_cache", (int64_t)own_bytes);
        number(&w, "central_caches", (int64_t)s.bytes_central_cache);
        number(&w, "page_heap_free", (int64_t)s.bytes_page_heap_free);
        number(&w, "released", (int64_t)s.bytes_released);
        number(&w, "quarantine", (int64_t)cm_check_quarantined_bytes());
        number(&w, "sample_stash", (int64_t)(cm_prof_stashed_pages() << CM_PAGE_SHIFT));
        number(&w, "metadata", (int64_t)s.bytes_metadata);
        end(&w, "}");
        begin(&w, "large", "{");
        number(&w, "count", (int64_t)large_count);
        number(&w, "bytes", (int64_t)large_bytes);
        end(&w, "}");
        begin(&w, "mapped_blocks", "{");
        number(&w, "count", (int64_t)mapped_count);
        number(&w, "bytes", (int64_t)mapped_bytes);
        end(&w, "}");
        size_classes(&w);
    }
    options(&w);
    end(&w, "}");
    put(&w, "\n");
    cm_message_write(&w.message, fd);
}
