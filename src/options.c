/* options.c - cmalloc's tunables: one table (name, type, default, range, doc), read once from
 * the environment.
 *
 * Two ways to set option <NAME>, read at init straight from environ (getenv may allocate or
 * take locale locks), never with malloc:
 *   CMALLOC_CONF=name:value,name:value   every option in one string, names in lower case
 *   CMALLOC_<NAME>=value                 one option; wins over CMALLOC_CONF whatever the order
 *                                        of the two in the environment
 * Values are numbers with an optional K, M or G suffix (switches: 0 or 1 only), an option's
 * keyword (STATS: json), or text (paths, a signal). Every number option has a range (min..max
 * in the table) and MMAP_THRESHOLD <= MMAP_THRESHOLD_MAX holds between two of them. Within
 * CMALLOC_CONF a later item wins over an earlier one. An unknown name, or a value that does
 * not parse or lies outside its range, gets exactly one warning line on stderr of one shape:
 *   cmalloc: <source>: bad value in '<item as written>' (want <what the option takes>); keeping <value>
 * and the option keeps the value it had (its default unless set before): never a crash, never
 * silence, never a refused value in force. CMALLOC_VERBOSE=1 prints the options in force once
 * every layer has started (cm_options_announce), so that a value a layer refused is not listed.
 * The README's option table is written from this table (tests/test_readme_options.sh keeps the
 * two alike; tests/test_options.c walks every range).
 */
#include "internal.h"
#include "cmalloc.h"

#include <string.h>

cm_option_values cm_option;

typedef struct option_entry {
    const char *name; /* after the CMALLOC_ prefix; lower case in CMALLOC_CONF */
    void *field;      /* into cm_option */
    int kind;         /* what the field is: OPTION_SIZE, _SIGNED, _BOOL or _TEXT */
    int64_t default_value;
    const char *doc;
    int64_t min, max;    /* the values taken, both included; max 0 means no upper bound */
    const char *keyword; /* a word accepted for keyword_value (outside min..max), or NULL */
    int64_t keyword_value;
} option_entry;
enum {
    OPTION_SIZE,   /* size_t: a count or bytes, with K, M, G suffixes */
    OPTION_SIGNED, /* int64_t: may be negative */
    OPTION_BOOL,   /* bool: 0 or 1, anything else is a bad value */
    OPTION_TEXT,   /* const char *: a string kept as given (a path, a signal's name) */
};
#define NO_MAX 0

static const option_entry options[] = {
    {"MMAP_THRESHOLD", &cm_option.mmap_threshold, OPTION_SIZE, CM_DEFAULT_MMAP_THRESHOLD,
     .doc = "requests above this many bytes get their own mmap (and mremap on realloc); at most "
            "MMAP_THRESHOLD_MAX",
     .min = CM_MAX_SMALL, .max = NO_MAX},
    {"MMAP_THRESHOLD_MAX", &cm_option.mmap_threshold_max, OPTION_SIZE,
     CM_DEFAULT_MMAP_THRESHOLD_MAX,
     .doc =
         "freeing a mapped block raises the threshold to its size, up to this, so blocks churned "
         "again and again stay in the page heap (as glibc does); equal to MMAP_THRESHOLD: fixed",
     .min = CM_MAX_SMALL, .max = NO_MAX},
    {"THREAD_CACHE_MAX", &cm_option.thread_cache_max, OPTION_SIZE, CM_DEFAULT_THREAD_CACHE_MAX,
     .doc = "one thread's cache budget: the bytes its lists hold as of its slow paths (frees "
            "between two slow paths can add up to three budgets more)",
     .min = CM_THREAD_START_BUDGET, .max = NO_MAX},
    {"THREAD_CACHE_TOTAL", &cm_option.thread_cache_total, OPTION_SIZE,
     CM_DEFAULT_THREAD_CACHE_TOTAL, .doc = "most bytes all thread caches together may hold",
     .min = CM_THREAD_START_BUDGET, .max = NO_MAX},
    {"RELEASE_DELAY_MS", &cm_option.release_delay_ms, OPTION_SIGNED, CM_DEFAULT_RELEASE_DELAY_MS,
     .doc = "free pages idle this long are returned to the OS, and a thread's cache gives back "
            "lists it left unused this long (0: at once, -1: never)",
     .min = -1, .max = NO_MAX},
    {"BACKGROUND_RELEASE", &cm_option.background_release, OPTION_BOOL, 0,
     .doc = "1: a helper thread, started when the library loads, returns idle pages even when the "
            "program makes no calls; 0: allocator calls do it (no thread is ever started)",
     .min = 0, .max = 1},
    {"STATS", &cm_option.stats_at_exit, OPTION_SIZE, 0,
     .doc = "1: print the stats report at exit (to stderr, or STATS_FILE); json: the same as one "
            "JSON object",
     .min = 0, .max = 1, .keyword = "json", .keyword_value = CM_STATS_JSON},
    {"STATS_FILE", &cm_option.stats_file, OPTION_TEXT, 0,
     .doc = "a path: the report at exit goes there instead of stderr (%p: the process id, %e: "
            "the program's name)"},
    {"CHECK", &cm_option.check, OPTION_BOOL, 0,
     .doc = "1: debug mode: canaries, freed-memory patterns, quarantine, mismatched frees; "
            "several times slower",
     .min = 0, .max = 1},
    {"ABORT_ON_ERROR", &cm_abort_on_error, OPTION_BOOL, 1,
     .doc = "1: abort after reporting an invalid or double free; 0: leak the pointer and go on",
     .min = 0, .max = 1},
    {"VERBOSE", &cm_option.verbose, OPTION_BOOL, 0,
     .doc = "1: print the options in force to stderr at start", .min = 0, .max = 1},
    {"PROF", &cm_option.prof, OPTION_BOOL, 0,
     .doc = "1: sampling heap profiler on (implied by PROF_LEAKS, PROF_DUMP, PROF_SIGNAL)",
     .min = 0, .max = 1},
    {"PROF_RATE", &cm_option.prof_rate, OPTION_SIZE, CM_DEFAULT_PROF_RATE,
     .doc = "the profiler samples on average one allocation per this many bytes allocated",
     .min = 1, .max = NO_MAX},
    {"PROF_LEAKS", &cm_option.prof_leaks, OPTION_BOOL, 0,
     .doc =
         "1: at exit, print the sampled allocations still live, grouped by stack, largest first",
     .min = 0, .max = 1},
    {"PROF_DUMP", &cm_option.prof_dump, OPTION_TEXT, 0,
     .doc = "a path: write the heap profile (pprof's legacy text format) there at exit; %p "
            "the pid, %e the program; a file holding another process's samples: <path>.<pid>"},
    {"PROF_SIGNAL", &cm_option.prof_signal, OPTION_TEXT, 0,
     .doc = "a catchable signal (SIGUSR2, INT, SIGRTMIN+3, or its number): write a heap "
            "profile when it arrives"},
    {"GUARD_RATE", &cm_option.guard_rate, OPTION_SIZE, 0,
     .doc =
         "N: on average one small allocation in N gets its own page before a guard page (0: off)",
     .min = 0, .max = NO_MAX},
    {"GUARD_SLOTS", &cm_option.guard_slots, OPTION_SIZE, 256,
     .doc = "guarded allocations live at once, freed ones kept inaccessible, at most (4 KiB each)",
     .min = 1, .max = CM_GUARD_SLOTS_MAX},
    {"GUARD_MARKERS", &cm_option.guard_markers, OPTION_BOOL, 1,
     .doc = "1: kernel guard markers (Linux 6.13+) on the guard pages, so that freed slots are "
            "opened 16 at a time; 0: one mprotect per slot, as on older kernels",
     .min = 0, .max = 1},
};
enum { OPTION_COUNT = sizeof options / sizeof options[0] };

/* Where each option was last set (the item as written, for a warning about it found only once
 * every item is read); source NULL while it has its default. */
static struct {
    const char *source, *item;
    size_t length;
} set_by[OPTION_COUNT];

static void store(const option_entry *o, int64_t value)
{
    switch (o->kind) {
    case OPTION_TEXT: *(const char **)o->field = NULL; break; /* the default: none */
    case OPTION_SIGNED: *(int64_t *)o->field = value; break;
    case OPTION_BOOL: *(bool *)o->field = value != 0; break;
    default: *(size_t *)o->field = (size_t)value; break;
    }
}

static int64_t load(const option_entry *o)
{
    switch (o->kind) {
    case OPTION_SIGNED: return *(int64_t *)o->field;
    case OPTION_BOOL: return *(bool *)o->field;
    default: return (int64_t) * (size_t *)o->field;
    }
}

/* ASCII, so no locale is consulted. */
static char upper(char c)
{
    return c >= 'a' && c <= 'z' ? (char)(c - 'a' + 'A') : c;
}

/* True when text[0..length) is word, ignoring ASCII case. */
static bool same_word(const char *text, size_t length, const char *word)
{
    for (size_t i = 0; i < length; i++)
        if (word[i] == '\0' || upper(text[i]) != upper(word[i]))
            return false;
    return word[length] == '\0';
}

static const option_entry *find(const char *name, size_t length)
{
    for (int i = 0; i < OPTION_COUNT; i++)
        if (same_word(name, length, options[i].name))
            return &options[i];
    return NULL;
}

/* Parses text[0..length) as the option's keyword or [-]digits[KMG], in the option's range;
 * returns 0 on success. */
static int parse_value(const option_entry *o, const char *text, size_t length, int64_t *out)
{
    const char *end = text + length;
    if (o->keyword && same_word(text, length, o->keyword)) {
        *out = o->keyword_value;
        return 0;
    }
    int negative = 0;
    if (text < end && *text == '-' && o->kind == OPTION_SIGNED) {
        negative = 1;
        text++;
    }
    if (text == end || *text < '0' || *text > '9')
        return -1;
    uint64_t value = 0;
    for (; text < end && *text >= '0' && *text <= '9'; text++) {
        if (value > (UINT64_MAX / 2 - 9) / 10)
            return -1;
        value = value * 10 + (uint64_t)(*text - '0');
    }
    unsigned shift = 0;
    if (text < end && o->kind != OPTION_BOOL) {
        switch (*text) {
        case 'k':
        case 'K':
            shift = 10;
            text++;
            break;
        case 'm':
        case 'M':
            shift = 20;
            text++;
            break;
        case 'g':
        case 'G':
            shift = 30;
            text++;
            break;
        default: break;
        }
    }
    if (text != end || value > ((uint64_t)INT64_MAX >> shift))
        return -1;
    int64_t number = negative ? -(int64_t)(value << shift) : (int64_t)(value << shift);
    if (number < o->min || (o->max != NO_MAX && number > o->max))
        return -1;
    *out = number;
    return 0;
}

static void message_part(cm_message *m, const char *text, size_t length)
{
    for (size_t i = 0; i < length && m->length < sizeof m->text; i++)
        m->text[m->length++] = text[i];
}

/* A text option's value for printing: "" when unset. */
static const char *text_value(const option_entry *o)
{
    const char *text = *(const char **)o->field;
    return text ? text : "";
}

static void message_number(cm_message *m, int64_t value)
{
    if (value < 0)
        cm_message_str(m, "-");
    cm_message_uint(m, value < 0 ? (uint64_t)-value : (uint64_t)value);
}

/* The option's value as it is written in the environment: its keyword, or a number. */
static void message_value(cm_message *m, const option_entry *o)
{
    if (o->kind == OPTION_TEXT) {
        cm_message_str(m, text_value(o));
        return;
    }
    int64_t value = load(o);
    if (o->keyword && value == o->keyword_value)
        cm_message_str(m, o->keyword);
    else
        message_number(m, value);
}

/* A bound as a person would write it: 262144 as 256K. */
static void message_bound(cm_message *m, int64_t value)
{
    static const char suffixes[] = "GMK";
    for (int i = 0; i < 3; i++) {
        int64_t unit = (int64_t)1 << (30 - 10 * i);
        if (value >= unit && value % unit == 0) {
            message_number(m, value / unit);
            message_part(m, &suffixes[i], 1);
            return;
        }
    }
    message_number(m, value);
}

/* The values an option takes: its own range, or one bounded by another option's value. */
typedef struct range {
    int64_t min, max;       /* max NO_MAX: none */
    const char *bound_name; /* the option whose value is the bound that differs, or NULL */
} range;

static void message_bound_of(cm_message *m, int64_t value, bool other, const char *name)
{
    message_bound(m, value);
    if (other) {
        cm_message_str(m, " (");
        cm_message_str(m, name);
        cm_message_str(m, ")");
    }
}

/* What the option takes, for a warning: "0 or 1", "0, 1 or json", "a number of at least 64K,
 * with an optional K, M or G suffix", "a number from 256K to 2M (MMAP_THRESHOLD_MAX), ...". */
static void message_wanted(cm_message *m, const option_entry *o, const range *r)
{
    if (o->kind == OPTION_BOOL || (r->max != NO_MAX && r->max - r->min == 1)) {
        message_number(m, r->min);
        cm_message_str(m, o->keyword ? ", " : " or ");
        message_number(m, r->max);
        if (o->keyword) {
            cm_message_str(m, " or ");
            cm_message_str(m, o->keyword);
        }
        return;
    }
    cm_message_str(m, "a number");
    if (r->max != NO_MAX) {
        cm_message_str(m, " from ");
        message_bound_of(m, r->min, r->min != o->min, r->bound_name);
        cm_message_str(m, " to ");
        message_bound_of(m, r->max, r->max != o->max, r->bound_name);
    } else if (r->min != 0) {
        cm_message_str(m, " of at least ");
        message_bound_of(m, r->min, r->min != o->min, r->bound_name);
    }
    cm_message_str(m, r->max != NO_MAX || r->min != 0 ? ", with an optional K, M or G suffix"
                                                      : " with an optional K, M or G suffix");
    if (o->keyword) {
        cm_message_str(m, ", or ");
        cm_message_str(m, o->keyword);
    }
}

/* One warning line naming the item as written: "cmalloc: <source>: <problem> '<item>'", then
 * what happens: ignored, or (a bad value) what the option takes (wanted, or NULL for its own
 * range) and the value it keeps. */
static void warn(const char *source, const char *problem, const char *item, size_t length,
                 const option_entry *kept, const range *wanted)
{
    cm_message m = {.length = 0};
    cm_message_str(&m, "cmalloc: ");
    cm_message_str(&m, source);
    cm_message_str(&m, ": ");
    cm_message_str(&m, problem);
    cm_message_str(&m, " '");
    message_part(&m, item, length);
    if (kept) {
        range own = {kept->min, kept->max, NULL};
        cm_message_str(&m, "' (want ");
        message_wanted(&m, kept, wanted ? wanted : &own);
        cm_message_str(&m, "); keeping ");
        message_value(&m, kept);
    } else {
        cm_message_str(&m, "'; ignored");
    }
    cm_message_str(&m, "\n");
    cm_message_write(&m, 2);
}

/* A text option's value, copied with a terminating NUL (CMALLOC_CONF's items have none) into
 * storage of its own: nothing may be malloc'ed this early. False when it is full. */
static bool store_text(const option_entry *o, const char *text, size_t length)
{
    static char storage[1024];
    static size_t used;
    if (length + 1 > sizeof storage - used)
        return false;
    memcpy(storage + used, text, length);
    storage[used + length] = '\0';
    *(const char **)o->field = storage + used;
    used += length + 1;
    return true;
}

/* Sets an option from one item, item[0..length): the name runs from name to separator, the
 * value from separator + 1 to the end. Warnings quote the item as written. */
static void assign(const char *source, const char *item, size_t length, const char *name,
                   const char *separator)
{
    const option_entry *o = find(name, (size_t)(separator - name));
    const char *value = separator + 1;
    size_t value_length = length - (size_t)(value - item);
    int64_t parsed;
    if (o == NULL) {
        warn(source, "unknown option", item, (size_t)(separator - item), NULL, NULL);
        return;
    }
    if (o->kind == OPTION_TEXT) {
        if (!store_text(o, value, value_length)) {
            warn(source, "too long a value in", item, length, NULL, NULL);
            return;
        }
    } else if (parse_value(o, value, value_length, &parsed) != 0) {
        warn(source, "bad value in", item, length, o, NULL);
        return;
    } else {
        store(o, parsed);
    }
    size_t index = (size_t)(o - options);
    set_by[index].source = source;
    set_by[index].item = item;
    set_by[index].length = length;
}

/* CMALLOC_CONF: name:value items separated by commas; empty items are skipped. */
static void apply_conf(const char *conf)
{
    while (*conf) {
        const char *end = strchr(conf, ',');
        if (end == NULL)
            end = conf + strlen(conf);
        const char *colon = memchr(conf, ':', (size_t)(end - conf));
        if (colon)
            assign("CMALLOC_CONF", conf, (size_t)(end - conf), conf, colon);
        else if (end > conf)
            warn("CMALLOC_CONF", "not name:value", conf, (size_t)(end - conf), NULL, NULL);
        conf = *end ? end + 1 : end;
    }
}

/* Puts option index back to its default, with the warning for the item that set it, which is
 * outside wanted (a range bounded by another option). */
static void refuse_set(int index, const range *wanted)
{
    const option_entry *o = &options[index];
    store(o, o->default_value);
    warn(set_by[index].source, "bad value in", set_by[index].item, set_by[index].length, o,
         wanted);
    set_by[index].source = NULL;
}

static int index_of(const void *field)
{
    for (int i = 0; i < OPTION_COUNT; i++)
        if (options[i].field == field)
            return i;
    return -1;
}

/* The one bound between two options: MMAP_THRESHOLD <= MMAP_THRESHOLD_MAX, checked once all
 * are read, so the order they are given in does not matter. The threshold gives way when it
 * was set, else the maximum (which can only be set below the default threshold), each back
 * to its default, which keeps the bound. */
static void check_bounds(void)
{
    int threshold = index_of(&cm_option.mmap_threshold);
    int threshold_max = index_of(&cm_option.mmap_threshold_max);
    if (cm_option.mmap_threshold <= cm_option.mmap_threshold_max)
        return;
    if (set_by[threshold].source) {
        range r = {options[threshold].min, (int64_t)cm_option.mmap_threshold_max,
                   "MMAP_THRESHOLD_MAX"};
        refuse_set(threshold, &r);
    }
    if (cm_option.mmap_threshold > cm_option.mmap_threshold_max) {
        range r = {(int64_t)cm_option.mmap_threshold, options[threshold_max].max,
                   "MMAP_THRESHOLD"};
        refuse_set(threshold_max, &r);
    }
}

void cm_options_init(char **environment)
{
    static const char conf_name[] = "CMALLOC_CONF=";
    for (int i = 0; i < OPTION_COUNT; i++) {
        store(&options[i], options[i].default_value);
        set_by[i].source = NULL;
    }
    /* The string first, so that a CMALLOC_<NAME> variable overrides it wherever it stands. */
    for (char **entry = environment; entry && *entry; entry++)
        if (strncmp(*entry, conf_name, sizeof conf_name - 1) == 0)
            apply_conf(*entry + sizeof conf_name - 1);
    for (char **entry = environment; entry && *entry; entry++) {
        const char *equals = strchr(*entry, '=');
        if (strncmp(*entry, "CMALLOC_", 8) != 0 || equals == NULL ||
            strncmp(*entry, conf_name, sizeof conf_name - 1) == 0)
            continue;
        assign("environment", *entry, strlen(*entry), *entry + 8, equals);
    }
    check_bounds();
}

/* Printed by cm_init once every layer has started, not as soon as the options are read: a layer
 * may still refuse a value only it can judge (prof.c, a CMALLOC_PROF_SIGNAL it cannot catch),
 * and the list shows what is in force after that. */
void cm_options_announce(void)
{
    if (!cm_option.verbose)
        return;
    cm_message m = {.length = 0};
    cm_message_str(&m, "cmalloc " CMALLOC_VERSION ": options in force\n");
    cm_message_write(&m, 2);
    cm_options_print(2);
}

bool cm_option_at(unsigned index, const char **name, int64_t *value, const char **keyword)
{
    if (index >= OPTION_COUNT)
        return false;
    const option_entry *o = &options[index];
    *name = o->name;
    if (o->kind == OPTION_TEXT) { /* as a string ("" when unset) */
        *value = 0;
        *keyword = text_value(o);
        return true;
    }
    *value = load(o);
    *keyword = o->keyword && *value == o->keyword_value ? o->keyword : NULL;
    return true;
}

void cm_options_print(int fd)
{
    cm_message m = {.length = 0};
    for (int i = 0; i < OPTION_COUNT; i++) {
        cm_message_str(&m, "  CMALLOC_");
        cm_message_str(&m, options[i].name);
        cm_message_str(&m, "=");
        message_value(&m, &options[i]);
        cm_message_str(&m, "  ");
        cm_message_str(&m, options[i].doc);
        cm_message_str(&m, "\n");
        cm_message_write(&m, fd);
    }
}
