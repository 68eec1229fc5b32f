/* parse.c - the message parser: text in memory to an array of ob_msg, before any replay.
 *
 * One message per line, fields separated by commas, '#' starts a comment (to the end of the
 * line), blank lines and spaces or tabs around fields are ignored, "\r\n" line ends accepted:
 *
 *   A,<id>,<B|S>,<price>,<qty>     M,<id>,<B|S>,<qty>     C,<id>     R,<id>,<price>,<qty>
 *
 * Numbers are decimal integers with an optional sign, within int64. Values the book rejects
 * (negative, zero) parse fine: rejecting is the book's job. A wrong field count, an unknown type
 * or side, or a number that is not an integer stops the parse with "name:line: expected ...".
 */
#include "book.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FIELDS 6

typedef struct field {
    const char *text;
    size_t len;
} field;

static int fail(char *err, size_t err_size, const char *name, size_t line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int fail(char *err, size_t err_size, const char *name, size_t line, const char *fmt, ...)
{
    int n = snprintf(err, err_size, "%s:%zu: expected ", name, line);
    if (n >= 0 && (size_t)n < err_size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err + n, err_size - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* Shows a field in an error message: at most 40 bytes. */
#define SHOW(f) (int)((f).len > 40 ? 40 : (f).len), (f).text

static int parse_int(field f, int64_t *value)
{
    const char *p = f.text, *end = f.text + f.len;
    int negative = 0;
    if (p < end && (*p == '-' || *p == '+'))
        negative = *p++ == '-';
    if (p == end)
        return -1;
    uint64_t v = 0, limit = negative ? UINT64_C(1) << 63 : (UINT64_C(1) << 63) - 1;
    for (; p < end; p++) {
        unsigned d = (unsigned)(*p - '0');
        if (d > 9)
            return -1;
        if (v > (limit - d) / 10)
            return -2;
        v = v * 10 + d;
    }
    *value = negative ? (int64_t)(0 - v) : (int64_t)v;
    return 0;
}

static int number(field f, const char *what, int64_t *value, char *err, size_t err_size,
                  const char *name, size_t line)
{
    int r = parse_int(f, value);
    if (r == -2)
        return fail(err, err_size, name, line, "%s to fit in 64 bits, got '%.*s'", what, SHOW(f));
    if (r)
        return fail(err, err_size, name, line, "an integer for %s, got '%.*s'", what, SHOW(f));
    return 0;
}

static int side(field f, uint8_t *out, char *err, size_t err_size, const char *name, size_t line)
{
    if (f.len == 1 && (f.text[0] == 'B' || f.text[0] == 'S')) {
        *out = f.text[0] == 'B' ? OB_BUY : OB_SELL;
        return 0;
    }
    return fail(err, err_size, name, line, "side B or S, got '%.*s'", SHOW(f));
}

static int push(ob_stream *out, const ob_msg *m)
{
    if (out->count == out->capacity) {
        size_t cap = out->capacity ? out->capacity * 2 : 4096;
        ob_msg *msgs = realloc(out->msgs, cap * sizeof(ob_msg));
        if (!msgs)
            return -1;
        out->msgs = msgs;
        out->capacity = cap;
    }
    out->msgs[out->count++] = *m;
    return 0;
}

static int is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r';
}

static field trim(const char *a, const char *b)
{
    while (a < b && is_blank(*a))
        a++;
    while (b > a && is_blank(b[-1]))
        b--;
    return (field){a, (size_t)(b - a)};
}

static int parse_line(const char *p, const char *end, const char *name, size_t line, ob_stream *out,
                      char *err, size_t err_size)
{
    const char *hash = memchr(p, '#', (size_t)(end - p));
    if (hash)
        end = hash;
    field f[MAX_FIELDS];
    size_t n = 0;
    for (const char *start = p;; p++) {
        if (p == end || *p == ',') {
            if (n == MAX_FIELDS)
                n++; /* too many: keep counting only */
            else if (n < MAX_FIELDS)
                f[n++] = trim(start, p);
            if (p == end)
                break;
            start = p + 1;
        }
    }
    if (n == 1 && f[0].len == 0)
        return 0; /* blank or comment-only line */

    ob_msg m = {.line = (uint32_t)line};
    size_t want;
    const char *format;
    if (f[0].len == 1 && f[0].text[0] == 'A')
        want = 5, format = "A,id,B|S,price,qty";
    else if (f[0].len == 1 && f[0].text[0] == 'M')
        want = 4, format = "M,id,B|S,qty";
    else if (f[0].len == 1 && f[0].text[0] == 'C')
        want = 2, format = "C,id";
    else if (f[0].len == 1 && f[0].text[0] == 'R')
        want = 4, format = "R,id,price,qty";
    else
        return fail(err, err_size, name, line, "message type A, M, C or R, got '%.*s'", SHOW(f[0]));
    if (n != want) {
        if (n > MAX_FIELDS)
            return fail(err, err_size, name, line, "%zu fields (%s), got more than %d", want,
                        format, MAX_FIELDS);
        return fail(err, err_size, name, line, "%zu fields (%s), got %zu", want, format, n);
    }
    m.type = (uint8_t)f[0].text[0];
    if (number(f[1], "id", &m.id, err, err_size, name, line))
        return -1;
    switch (m.type) {
    case OB_ADD:
        if (side(f[2], &m.side, err, err_size, name, line) ||
            number(f[3], "price", &m.price, err, err_size, name, line) ||
            number(f[4], "qty", &m.qty, err, err_size, name, line))
            return -1;
        break;
    case OB_MARKET:
        if (side(f[2], &m.side, err, err_size, name, line) ||
            number(f[3], "qty", &m.qty, err, err_size, name, line))
            return -1;
        break;
    case OB_REPLACE:
        if (number(f[2], "price", &m.price, err, err_size, name, line) ||
            number(f[3], "qty", &m.qty, err, err_size, name, line))
            return -1;
        break;
    default: break;
    }
    if (push(out, &m)) {
        snprintf(err, err_size, "%s:%zu: out of memory", name, line);
        return -1;
    }
    return 0;
}

int ob_parse_text(const char *name, const char *text, size_t len, ob_stream *out, char *err,
                  size_t err_size)
{
    const char *p = text, *end = text + len;
    size_t line = 0;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *eol = nl ? nl : end;
        line++;
        if (parse_line(p, eol, name, line, out, err, err_size))
            return -1;
        p = nl ? nl + 1 : end;
    }
    return 0;
}

int ob_parse_file(const char *path, ob_stream *out, char *err, size_t err_size)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) {
        snprintf(err, err_size, "%s: %s", path, strerror(errno));
        return -1;
    }
    size_t cap = 1 << 20, len = 0;
    char *text = malloc(cap);
    for (;;) {
        if (!text) {
            snprintf(err, err_size, "%s: out of memory", path);
            break;
        }
        len += fread(text + len, 1, cap - len, f);
        if (len < cap)
            break;
        char *bigger = realloc(text, cap * 2);
        if (!bigger)
            free(text);
        text = bigger;
        cap *= 2;
    }
    int bad = text && ferror(f);
    if (bad)
        snprintf(err, err_size, "%s: read error", path);
    if (f != stdin)
        fclose(f);
    int r = -1;
    if (text && !bad)
        r = ob_parse_text(path, text, len, out, err, err_size);
    free(text);
    return r;
}

void ob_stream_free(ob_stream *stream)
{
    free(stream->msgs);
    stream->msgs = NULL;
    stream->count = stream->capacity = 0;
}
