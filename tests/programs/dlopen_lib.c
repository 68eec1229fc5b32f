/* dlopen_lib.c - a plugin (built as libdlopen_lib.so, loaded by dlopen_cycle): its constructor
 * mallocs a table and registers pthread_atfork handlers that allocate, its destructor checks
 * and frees the table, and plugin_work allocates through it. glibc removes the atfork handlers
 * when the library is unloaded. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static char **table;
enum { ENTRIES = 100 };

static void prepare(void)
{
    free(malloc(3000));
}
static void parent(void)
{
    free(malloc(200));
}
static void child(void)
{
    free(malloc(70000));
}

__attribute__((constructor)) static void load(void)
{
    table = malloc(ENTRIES * sizeof *table);
    for (int i = 0; i < ENTRIES; i++) {
        table[i] = malloc((size_t)(i * 37 + 2));
        memset(table[i], 'p', (size_t)(i * 37 + 1));
        table[i][i * 37 + 1] = '\0';
    }
    pthread_atfork(prepare, parent, child);
}

__attribute__((destructor)) static void unload(void)
{
    for (int i = 0; i < ENTRIES; i++) {
        if (table[i][i * 37] != 'p')
            abort();
        free(table[i]);
    }
    free(table);
}

int plugin_work(int n)
{
    char *s = strdup(table[n % ENTRIES]);
    int length = (int)strlen(s);
    free(s);
    return length;
}
