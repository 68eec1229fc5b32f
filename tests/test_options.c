/* test_options.c - reading the options (src/options.c): CMALLOC_CONF=name:value,... and
 * CMALLOC_<NAME>=value.
 *
 * cm_options_init is called with made-up environments; its stderr is captured in a file, so
 * each case checks both the values in force and the exact warnings: good items apply, K/M/G
 * suffixes (either case) scale up to exactly the largest value that fits and a value past it
 * (or a number of 2^63 and more, or a malformed suffix) is refused, a minus sign is taken by
 * signed options only (once, before the digits), a switch takes only 0 or 1, a
 * CMALLOC_<NAME> variable wins over the string in either order, a later item wins over an
 * earlier one, only whole names are known (a prefix or an extension of one is not), and every
 * unknown name or bad value gives exactly one line naming it while the option keeps its value.
 * Every option's range is walked (every_option_refuses_values_outside_its_range: the ends of
 * the range apply, values past them get the one warning), and MMAP_THRESHOLD stays at most
 * MMAP_THRESHOLD_MAX whatever the order they are given in. CMALLOC_VERBOSE lists the values in
 * force, after a layer's refusal too (a CMALLOC_PROF_SIGNAL the profiler cannot catch).
 * Each case ends by reading an empty environment, which puts every default back for the rest
 * of the process.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "cmalloc.h"

static char captured[8192];

/* Reads env (NULL-terminated) as the environment as cm_init does: the options, then (with
 * start_profiler) prof.c's start, which may refuse a value, then CMALLOC_VERBOSE's list. Returns
 * the number of lines written to stderr, whose text is left in captured. The profiler starts in
 * a child process, so that this one's allocations are never sampled. */
static int read_options_as_init(char **env, bool start_profiler)
{
    FILE *file = tmpfile();
    assert_non_null(file);
    int saved = dup(2);
    assert_true(saved >= 0);
    assert_true(dup2(fileno(file), 2) >= 0);
    pid_t child = start_profiler ? fork() : 0;
    if (child == 0) {
        cm_options_init(env);
        if (start_profiler)
            cm_prof_init();
        cm_options_announce();
        if (start_profiler)
            _exit(0);
    }
    int status = 0;
    if (start_profiler)
        assert_int_equal(waitpid(child, &status, 0), child);
    assert_int_equal(status, 0);
    assert_true(dup2(saved, 2) >= 0);
    close(saved);
    rewind(file);
    size_t n = fread(captured, 1, sizeof captured - 1, file);
    captured[n] = '\0';
    fclose(file);
    int lines = 0;
    for (size_t i = 0; i < n; i++)
        lines += captured[i] == '\n';
    return lines;
}

static int read_options(char **env)
{
    return read_options_as_init(env, false);
}

static int restore_defaults(void **state)
{
    (void)state;
    char *env[] = {NULL};
    read_options(env);
    return 0;
}

static void good_items_apply_with_suffixes(void **state)
{
    (void)state;
    char *env[] = {"HOME=/x",
                   "CMALLOC_CONF=mmap_threshold:2M,thread_cache_max:512k,thread_cache_total:1G,"
                   "release_delay_ms:-1,mmap_threshold_max:4M,stats:json,check:0",
                   NULL};
    assert_int_equal(read_options(env), 0);
    assert_int_equal(cm_option.mmap_threshold, 2 << 20);
    assert_int_equal(cm_option.thread_cache_max, 512 << 10);
    assert_int_equal(cm_option.thread_cache_total, (size_t)1 << 30);
    assert_int_equal(cm_option.release_delay_ms, -1);
    assert_int_equal(cm_option.mmap_threshold_max, 4 << 20);
    assert_int_equal(cm_option.stats_at_exit, CM_STATS_JSON);
    assert_int_equal(cm_abort_on_error, 1); /* untouched: default */
}

static void names_and_keywords_ignore_case_empty_items_are_skipped(void **state)
{
    (void)state;
    char *env[] = {"CMALLOC_CONF=,MMAP_Threshold:3m,,stats:JSON,", NULL};
    assert_int_equal(read_options(env), 0);
    assert_int_equal(cm_option.mmap_threshold, 3 << 20);
    assert_int_equal(cm_option.stats_at_exit, CM_STATS_JSON);
}

static void unknown_name_warns_once_and_the_rest_applies(void **state)
{
    (void)state;
    char *env[] = {"CMALLOC_CONF=x:1,mmap_threshold:512k", NULL};
    assert_int_equal(read_options(env), 1);
    assert_string_equal(captured, "cmalloc: CMALLOC_CONF: unknown option 'x'; ignored\n");
    assert_int_equal(cm_option.mmap_threshold, 512 << 10);
}

static void bad_values_warn_once_each_and_keep_the_default(void **state)
{
    (void)state;
    char *env[] = {"CMALLOC_CONF=mmap_threshold:lots,thread_cache_max:12Q,check:,"
                   "thread_cache_total:-5,mmap_threshold_max:99999999999999999999,stats:yaml",
                   NULL};
    assert_int_equal(read_options(env), 6);
    assert_non_null(strstr(captured,
                           "cmalloc: CMALLOC_CONF: bad value in 'mmap_threshold:lots' (want "
                           "a number of at least 256K, with an optional K, M or G suffix); "
                           "keeping 1048576\n"));
    assert_non_null(strstr(captured, "'thread_cache_max:12Q'"));
    assert_non_null(strstr(captured, "'check:'"));
    assert_non_null(strstr(captured, "'thread_cache_total:-5'")); /* unsigned: no minus */
    assert_non_null(strstr(captured, "'mmap_threshold_max:99999999999999999999'"));
    assert_non_null(strstr(captured, "bad value in 'stats:yaml' (want 0, 1 or json); keeping 0\n"));
    assert_int_equal(cm_option.mmap_threshold, 1 << 20);
    assert_int_equal(cm_option.thread_cache_max, 2 << 20);
    assert_int_equal(cm_option.check, 0);
    assert_int_equal(cm_option.thread_cache_total, 64 << 20);
    assert_int_equal(cm_option.mmap_threshold_max, 32 << 20);
    assert_int_equal(cm_option.stats_at_exit, 0);
}

/* A switch is 0 or 1: another number is a bad value, not "on". */
static void switches_take_0_or_1(void **state)
{
    (void)state;
    char *env[] = {"CMALLOC_CONF=check:2,verbose:1k", "CMALLOC_ABORT_ON_ERROR=0", NULL};
    assert_int_equal(read_options(env), 2);
    assert_non_null(strstr(captured, "cmalloc: CMALLOC_CONF: bad value in 'check:2' (want 0 or 1); "
                                     "keeping 0\n"));
    assert_non_null(strstr(captured, "'verbose:1k' (want 0 or 1); keeping 0\n"));
    assert_false(cm_option.check);
    assert_false(cm_option.verbose);
    assert_false(cm_abort_on_error);
}

static void item_without_colon_warns(void **state)
{
    (void)state;
    char *env[] = {"CMALLOC_CONF=check=1,abort_on_error:0", NULL};
    assert_int_equal(read_options(env), 1);
    assert_string_equal(captured, "cmalloc: CMALLOC_CONF: not name:value 'check=1'; ignored\n");
    assert_int_equal(cm_option.check, 0);
    assert_int_equal(cm_abort_on_error, 0);
}

static void later_item_wins_and_a_bad_one_keeps_the_value_in_force(void **state)
{
    (void)state;
    char *env[] = {"CMALLOC_CONF=mmap_threshold:300k,mmap_threshold:400k,mmap_threshold:junk",
                   NULL};
    assert_int_equal(read_options(env), 1);
    assert_non_null(strstr(captured, "keeping 409600\n"));
    assert_int_equal(cm_option.mmap_threshold, 400 << 10);
}

/* The variable wins whether it comes before or after CMALLOC_CONF in the environment. */
static void variable_overrides_string_in_either_order(void **state)
{
    (void)state;
    char *before[] = {"CMALLOC_MMAP_THRESHOLD=3M", "CMALLOC_CONF=mmap_threshold:2M,check:1", NULL};
    assert_int_equal(read_options(before), 0);
    assert_int_equal(cm_option.mmap_threshold, 3 << 20);
    assert_int_equal(cm_option.check, 1);
    char *after[] = {"CMALLOC_CONF=mmap_threshold:2M,check:1", "CMALLOC_MMAP_THRESHOLD=3M", NULL};
    assert_int_equal(read_options(after), 0);
    assert_int_equal(cm_option.mmap_threshold, 3 << 20);
    char *bad_variable[] = {"CMALLOC_CONF=mmap_threshold:2M", "CMALLOC_MMAP_THRESHOLD=3X", NULL};
    assert_int_equal(read_options(bad_variable), 1);
    assert_string_equal(captured,
                        "cmalloc: environment: bad value in 'CMALLOC_MMAP_THRESHOLD=3X' (want "
                        "a number of at least 256K, with an optional K, M or G suffix); keeping "
                        "2097152\n");
    assert_int_equal(cm_option.mmap_threshold, 2 << 20);
}

static void unknown_variable_warns(void **state)
{
    (void)state;
    char *env[] = {"CMALLOC_NOPE=1", "CMALLOC_STATS=json", "NOT_CMALLOC_X=1", NULL};
    assert_int_equal(read_options(env), 1);
    assert_string_equal(captured, "cmalloc: environment: unknown option 'CMALLOC_NOPE'; ignored\n");
    assert_int_equal(cm_option.stats_at_exit, CM_STATS_JSON);
}

static void verbose_prints_every_option_in_force(void **state)
{
    (void)state;
    char *env[] = {"CMALLOC_CONF=verbose:1,mmap_threshold:2M,stats:json", NULL};
    const char *name, *keyword;
    int64_t value;
    unsigned count = 0;
    while (cm_option_at(count, &name, &value, &keyword))
        count++;
    assert_int_equal(read_options(env), 1 + count);
    assert_non_null(strstr(captured, "cmalloc " CMALLOC_VERSION ": options in force\n"));
    assert_non_null(strstr(captured, "  CMALLOC_MMAP_THRESHOLD=2097152  "));
    assert_non_null(strstr(captured, "  CMALLOC_STATS=json  "));
    assert_non_null(strstr(captured, "  CMALLOC_VERBOSE=1  "));
    char *quiet[] = {"CMALLOC_CONF=mmap_threshold:2M", NULL};
    assert_int_equal(read_options(quiet), 0);
    /* A refused value is not listed as in force: the value kept is. */
    char *refused[] = {"CMALLOC_CONF=verbose:1,stats:2,guard_slots:0", NULL};
    assert_int_equal(read_options(refused), 2 + 1 + count);
    assert_non_null(strstr(captured, "  CMALLOC_STATS=0  "));
    assert_non_null(strstr(captured, "  CMALLOC_GUARD_SLOTS=256  "));
    /* Nor is a signal the profiler refuses (after the options were read): the list comes after. */
    char *signal[] = {"CMALLOC_CONF=verbose:1", "CMALLOC_PROF_SIGNAL=SIGKILL", NULL};
    assert_int_equal(read_options_as_init(signal, true), 1 + 1 + count);
    assert_non_null(strstr(captured, "ignoring CMALLOC_PROF_SIGNAL=SIGKILL (this signal cannot"));
    assert_non_null(strstr(captured, "  CMALLOC_PROF_SIGNAL=  "));
    assert_null(strstr(captured, "  CMALLOC_PROF_SIGNAL=SIGKILL  "));
    char *kept[] = {"CMALLOC_CONF=verbose:1", "CMALLOC_PROF_SIGNAL=SIGUSR2", NULL};
    assert_int_equal(read_options_as_init(kept, true), 1 + count);
    assert_non_null(strstr(captured, "  CMALLOC_PROF_SIGNAL=SIGUSR2  "));
}

/* cm_option_at (what the JSON stats list) walks the same table with the values in force. */
static void option_at_reports_values_and_keywords(void **state)
{
    (void)state;
    char *env[] = {"CMALLOC_CONF=stats:json,release_delay_ms:-1", NULL};
    read_options(env);
    const char *name, *keyword;
    int64_t value;
    bool saw_stats = false, saw_delay = false;
    for (unsigned i = 0; cm_option_at(i, &name, &value, &keyword); i++) {
        if (strcmp(name, "STATS") == 0) {
            saw_stats = true;
            assert_int_equal(value, CM_STATS_JSON);
            assert_string_equal(keyword, "json");
        } else if (strcmp(name, "RELEASE_DELAY_MS") == 0) {
            saw_delay = true;
            assert_int_equal(value, -1);
            assert_null(keyword);
        }
    }
    assert_true(saw_stats && saw_delay);
}

/* Reads CMALLOC_CONF=first,bad[0],bad[1],...: first applies, and each bad item gives exactly
 * the line that refuses it, in order, saying what the option takes (want) and naming the
 * value kept (first's). */
static void expect_refused(const char *first, const char *const *bad, size_t count,
                           const char *want, const char *keeping)
{
    static char conf[2048], expected[8192];
    size_t c = (size_t)snprintf(conf, sizeof conf, "CMALLOC_CONF=%s", first), e = 0;
    expected[0] = '\0';
    for (size_t i = 0; i < count; i++) {
        c += (size_t)snprintf(conf + c, sizeof conf - c, ",%s", bad[i]);
        e += (size_t)snprintf(expected + e, sizeof expected - e,
                              "cmalloc: CMALLOC_CONF: bad value in '%s' (want %s); keeping %s\n",
                              bad[i], want, keeping);
    }
    assert_true(c < sizeof conf && e < sizeof expected);
    char *env[] = {conf, NULL};
    assert_int_equal(read_options(env), (int)count);
    assert_string_equal(captured, expected);
}

/* The largest number a suffix allows is INT64_MAX shifted down by it; one more is refused
 * (the shifted value would not fit), as is a number of 2^63 or more. PROF_RATE takes them
 * because it changes nothing while the profiler is off. (The eight plain numbers just below
 * 2^63 are refused too, by the digit loop's guard against overflow; nothing here pins that.) */
static void suffixes_scale_up_to_the_exact_limit(void **state)
{
    (void)state;
    char *lower[] = {"CMALLOC_CONF=prof_rate:2g", NULL};
    assert_int_equal(read_options(lower), 0);
    assert_int_equal(cm_option.prof_rate, (size_t)2 << 30);
    static const struct {
        const char *item;
        size_t value;
    } limits[] = {
        {"CMALLOC_CONF=prof_rate:8589934591G", (size_t)8589934591 << 30},
        {"CMALLOC_CONF=prof_rate:8796093022207M", (size_t)8796093022207 << 20},
        {"CMALLOC_CONF=prof_rate:9007199254740991K", (size_t)9007199254740991 << 10},
        {"CMALLOC_CONF=prof_rate:9000000000000000000", (size_t)9000000000000000000u},
    };
    for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
        char *env[] = {(char *)limits[i].item, NULL};
        assert_int_equal(read_options(env), 0);
        assert_int_equal(cm_option.prof_rate, limits[i].value);
    }
    static const char *const over[] = {"prof_rate:8589934592G",
                                       "prof_rate:8796093022208M",
                                       "prof_rate:9007199254740992K",
                                       "prof_rate:9223372036854775808",
                                       "prof_rate:18446744073709551617",
                                       "prof_rate:1KB",
                                       "prof_rate:1 K",
                                       "prof_rate:K"};
    expect_refused("prof_rate:4k", over, sizeof over / sizeof over[0],
                   "a number of at least 1, with an optional K, M or G suffix", "4096");
    assert_int_equal(cm_option.prof_rate, 4096);
}

/* A minus sign is taken by signed options only, once, before the digits; RELEASE_DELAY_MS,
 * the one signed option, takes no value below -1 (scaled by a suffix or not). */
static void negatives_only_where_signed(void **state)
{
    (void)state;
    char *never[] = {"CMALLOC_CONF=release_delay_ms:-1", NULL};
    assert_int_equal(read_options(never), 0);
    assert_int_equal(cm_option.release_delay_ms, -1);
    static const char *const bad[] = {"release_delay_ms:--1", "release_delay_ms:-",
                                      "release_delay_ms:-k",  "release_delay_ms:1-",
                                      "release_delay_ms:-2",  "release_delay_ms:-1k",
                                      "release_delay_ms:-9223372036854775808"};
    expect_refused("release_delay_ms:-1", bad, sizeof bad / sizeof bad[0],
                   "a number of at least -1, with an optional K, M or G suffix", "-1");
    assert_int_equal(cm_option.release_delay_ms, -1);
    /* Unsigned: refused as a variable too, and the value in force stays. */
    char *variable[] = {"CMALLOC_CONF=prof_rate:1k", "CMALLOC_PROF_RATE=-1", NULL};
    assert_int_equal(read_options(variable), 1);
    assert_string_equal(captured, "cmalloc: environment: bad value in 'CMALLOC_PROF_RATE=-1' (want "
                                  "a number of at least 1, with an optional K, M or G suffix); "
                                  "keeping 1024\n");
    assert_int_equal(cm_option.prof_rate, 1024);
}

/* Every option of the table, walked through cm_option_at (a new option fails here until it is
 * listed): the values at the ends of its range apply without a word, and each value just past
 * them, or of the wrong kind, is refused with the one line every option's refusal has, saying
 * what it takes, and the default stays in force. Text options take any text. */
static const struct option_case {
    const char *name;
    const char *want; /* NULL: a text option */
    const char *good[3];
    int64_t good_value[3];
    const char *bad[6];
} option_cases[] = {
    {"MMAP_THRESHOLD", "a number of at least 256K, with an optional K, M or G suffix",
     {"256K", "32M"}, {256 << 10, 32 << 20}, {"0", "1", "262143", "-1", "x"}},
    {"MMAP_THRESHOLD_MAX", "a number of at least 256K, with an optional K, M or G suffix",
     {"1M", "1G"}, {1 << 20, 1 << 30}, {"0", "262143", "1k"}},
    {"THREAD_CACHE_MAX", "a number of at least 64K, with an optional K, M or G suffix",
     {"64K", "1G"}, {64 << 10, 1 << 30}, {"0", "65535", "63k"}},
    {"THREAD_CACHE_TOTAL", "a number of at least 64K, with an optional K, M or G suffix",
     {"64K", "4G"}, {64 << 10, (int64_t)4 << 30}, {"0", "1", "65535"}},
    {"RELEASE_DELAY_MS", "a number of at least -1, with an optional K, M or G suffix",
     {"-1", "0", "1M"}, {-1, 0, 1 << 20}, {"-2", "-7", "-1k", "never"}},
    {"BACKGROUND_RELEASE", "0 or 1", {"0", "1"}, {0, 1}, {"2", "-1", "1k", "yes"}},
    {"STATS", "0, 1 or json", {"0", "1", "json"}, {0, 1, CM_STATS_JSON}, {"2", "5", "1K", "yaml"}},
    {"STATS_FILE", NULL, {"/tmp/x.%p"}, {0}, {0}},
    {"CHECK", "0 or 1", {"0", "1"}, {0, 1}, {"2", "1k", "on"}},
    {"ABORT_ON_ERROR", "0 or 1", {"0", "1"}, {0, 1}, {"2", "-1"}},
    {"VERBOSE", "0 or 1", {"0"}, {0}, {"2", "10"}},
    {"PROF", "0 or 1", {"0", "1"}, {0, 1}, {"2", "1G"}},
    {"PROF_RATE", "a number of at least 1, with an optional K, M or G suffix", {"1", "1G"},
     {1, 1 << 30}, {"0", "-1", "0k"}},
    {"PROF_LEAKS", "0 or 1", {"0", "1"}, {0, 1}, {"2"}},
    {"PROF_DUMP", NULL, {"/tmp/profile"}, {0}, {0}},
    {"PROF_SIGNAL", NULL, {"SIGUSR2"}, {0}, {0}},
    {"GUARD_RATE", "a number with an optional K, M or G suffix", {"0", "1", "1M"},
     {0, 1, 1 << 20}, {"-1", "x"}},
    {"GUARD_SLOTS", "a number from 1 to 64K, with an optional K, M or G suffix", {"1", "64K"},
     {1, 65536}, {"0", "65537", "1M"}},
    {"GUARD_MARKERS", "0 or 1", {"0", "1"}, {0, 1}, {"2"}},
};

static const struct option_case *option_case_named(const char *name)
{
    for (size_t i = 0; i < sizeof option_cases / sizeof option_cases[0]; i++)
        if (strcmp(option_cases[i].name, name) == 0)
            return &option_cases[i];
    return NULL;
}

/* The value option name has now (cm_option_at), and its default (read from no environment). */
static int64_t value_of(const char *name)
{
    const char *n, *keyword;
    int64_t value;
    for (unsigned i = 0; cm_option_at(i, &n, &value, &keyword); i++)
        if (strcmp(n, name) == 0)
            return value;
    fail_msg("no option %s", name);
    return 0;
}

static void every_option_refuses_values_outside_its_range(void **state)
{
    (void)state;
    const char *name, *keyword;
    int64_t value;
    unsigned walked = 0;
    for (unsigned i = 0; cm_option_at(i, &name, &value, &keyword); i++, walked++) {
        const struct option_case *c = option_case_named(name);
        if (c == NULL)
            fail_msg("option %s has no case in option_cases", name);
        char variable[256], item[256], expected[1024];
        for (int g = 0; g < 3 && c->good[g]; g++) {
            snprintf(variable, sizeof variable, "CMALLOC_%s=%s", name, c->good[g]);
            char *env[] = {variable, NULL};
            if (read_options(env) != 0)
                fail_msg("%s warned: %s", variable, captured);
            if (c->want)
                assert_int_equal(value_of(name), c->good_value[g]);
        }
        if (c->want == NULL)
            continue;
        char *none[] = {NULL};
        read_options(none);
        int64_t default_value = value_of(name);
        char kept[64];
        snprintf(kept, sizeof kept, "%lld", (long long)default_value);
        assert_non_null(c->bad[0]);
        for (int b = 0; b < 6 && c->bad[b]; b++) {
            /* as a variable */
            snprintf(variable, sizeof variable, "CMALLOC_%s=%s", name, c->bad[b]);
            char *env[] = {variable, NULL};
            assert_int_equal(read_options(env), 1);
            snprintf(expected, sizeof expected,
                     "cmalloc: environment: bad value in '%s' (want %s); keeping %s\n", variable,
                     c->want, kept);
            assert_string_equal(captured, expected);
            assert_int_equal(value_of(name), default_value);
            /* in CMALLOC_CONF, in lower case */
            int n = snprintf(item, sizeof item, "CMALLOC_CONF=");
            for (const char *p = name; *p; p++)
                item[n++] = (char)(*p >= 'A' && *p <= 'Z' ? *p - 'A' + 'a' : *p);
            snprintf(item + n, sizeof item - (size_t)n, ":%s", c->bad[b]);
            char *conf[] = {item, NULL};
            assert_int_equal(read_options(conf), 1);
            snprintf(expected, sizeof expected,
                     "cmalloc: CMALLOC_CONF: bad value in '%s' (want %s); keeping %s\n",
                     item + strlen("CMALLOC_CONF="), c->want, kept);
            assert_string_equal(captured, expected);
            assert_int_equal(value_of(name), default_value);
        }
    }
    assert_int_equal(walked, sizeof option_cases / sizeof option_cases[0]);
}

/* MMAP_THRESHOLD <= MMAP_THRESHOLD_MAX, whatever the order the two are given in: the threshold
 * gives way when it was set (back to its default), else the maximum; each warning says which
 * option's value was the bound. */
static void threshold_stays_at_most_its_maximum(void **state)
{
    (void)state;
    static const char *const orders[] = {"CMALLOC_CONF=mmap_threshold:8M,mmap_threshold_max:2M",
                                         "CMALLOC_CONF=mmap_threshold_max:2M,mmap_threshold:8M"};
    for (int i = 0; i < 2; i++) {
        char *env[] = {(char *)orders[i], NULL};
        assert_int_equal(read_options(env), 1);
        assert_string_equal(captured, "cmalloc: CMALLOC_CONF: bad value in 'mmap_threshold:8M' "
                                      "(want a number from 256K to 2M (MMAP_THRESHOLD_MAX), with "
                                      "an optional K, M or G suffix); keeping 1048576\n");
        assert_int_equal(cm_option.mmap_threshold, 1 << 20);
        assert_int_equal(cm_option.mmap_threshold_max, 2 << 20);
    }
    char *alone[] = {"CMALLOC_MMAP_THRESHOLD=64M", NULL}; /* above the default maximum */
    assert_int_equal(read_options(alone), 1);
    assert_non_null(strstr(captured, "'CMALLOC_MMAP_THRESHOLD=64M' (want a number from 256K to "
                                     "32M (MMAP_THRESHOLD_MAX), "));
    assert_int_equal(cm_option.mmap_threshold, 1 << 20);
    char *low_max[] = {"CMALLOC_MMAP_THRESHOLD_MAX=512K", NULL}; /* below the default threshold */
    assert_int_equal(read_options(low_max), 1);
    assert_string_equal(captured,
                        "cmalloc: environment: bad value in 'CMALLOC_MMAP_THRESHOLD_MAX=512K' (want "
                        "a number of at least 1M (MMAP_THRESHOLD), with an optional K, M or G "
                        "suffix); keeping 33554432\n");
    assert_int_equal(cm_option.mmap_threshold_max, 32 << 20);
    char *both_low[] = {"CMALLOC_CONF=mmap_threshold_max:512K,mmap_threshold:512K", NULL};
    assert_int_equal(read_options(both_low), 0);
    char *equal[] = {"CMALLOC_CONF=mmap_threshold:4M,mmap_threshold_max:4M", NULL};
    assert_int_equal(read_options(equal), 0);
    assert_int_equal(cm_option.mmap_threshold, 4 << 20);
}

/* A name is known only as a whole word: a prefix, an extension or a repeated CMALLOC_ prefix of
 * a known one is unknown (and warned about), and changes nothing. */
static void names_near_known_ones_are_unknown(void **state)
{
    (void)state;
    char *conf[] = {"CMALLOC_CONF=mmap_threshol:1,mmap_thresholds:1,cmalloc_mmap_threshold:1,"
                    ":5",
                    NULL};
    assert_int_equal(read_options(conf), 4);
    assert_string_equal(captured,
                        "cmalloc: CMALLOC_CONF: unknown option 'mmap_threshol'; ignored\n"
                        "cmalloc: CMALLOC_CONF: unknown option 'mmap_thresholds'; ignored\n"
                        "cmalloc: CMALLOC_CONF: unknown option 'cmalloc_mmap_threshold'; ignored\n"
                        "cmalloc: CMALLOC_CONF: unknown option ''; ignored\n");
    assert_int_equal(cm_option.mmap_threshold, 1 << 20);
    char *variables[] = {"CMALLOC_MMAP_THRESHOL=1", "CMALLOC_MMAP_THRESHOLDS=1",
                         "CMALLOC_CMALLOC_MMAP_THRESHOLD=1", NULL};
    assert_int_equal(read_options(variables), 3);
    assert_non_null(strstr(captured, "unknown option 'CMALLOC_MMAP_THRESHOL'; ignored\n"));
    assert_non_null(strstr(captured, "unknown option 'CMALLOC_MMAP_THRESHOLDS'; ignored\n"));
    assert_non_null(strstr(captured, "unknown option 'CMALLOC_CMALLOC_MMAP_THRESHOLD'; ignored\n"));
    assert_int_equal(cm_option.mmap_threshold, 1 << 20);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(good_items_apply_with_suffixes, restore_defaults),
        cmocka_unit_test_teardown(names_and_keywords_ignore_case_empty_items_are_skipped,
                                  restore_defaults),
        cmocka_unit_test_teardown(unknown_name_warns_once_and_the_rest_applies, restore_defaults),
        cmocka_unit_test_teardown(bad_values_warn_once_each_and_keep_the_default, restore_defaults),
        cmocka_unit_test_teardown(switches_take_0_or_1, restore_defaults),
        cmocka_unit_test_teardown(item_without_colon_warns, restore_defaults),
        cmocka_unit_test_teardown(later_item_wins_and_a_bad_one_keeps_the_value_in_force,
                                  restore_defaults),
        cmocka_unit_test_teardown(variable_overrides_string_in_either_order, restore_defaults),
        cmocka_unit_test_teardown(unknown_variable_warns, restore_defaults),
        cmocka_unit_test_teardown(verbose_prints_every_option_in_force, restore_defaults),
        cmocka_unit_test_teardown(option_at_reports_values_and_keywords, restore_defaults),
        cmocka_unit_test_teardown(suffixes_scale_up_to_the_exact_limit, restore_defaults),
        cmocka_unit_test_teardown(negatives_only_where_signed, restore_defaults),
        cmocka_unit_test_teardown(names_near_known_ones_are_unknown, restore_defaults),
        cmocka_unit_test_teardown(every_option_refuses_values_outside_its_range, restore_defaults),
        cmocka_unit_test_teardown(threshold_stays_at_most_its_maximum, restore_defaults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
