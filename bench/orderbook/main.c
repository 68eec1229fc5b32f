/* main.c - build/orderbook, the command line of the order-book driver.
 *
 *   orderbook gen --messages N --seed S [--depth D]          a stream on standard output
 *   orderbook replay FILE [--trades OUT] [--threads T] [--pipeline] [--alloc malloc|pool]
 *                         [--passes P] [--pin]
 *
 * replay parses FILE completely first (a parse error stops it with "file:line: expected ..."
 * and exit status 2), replays it, and prints the summary as "key: value" lines (README.md).
 * Exit status: 0 done, 2 usage, parse or run error.
 */
#include "book.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void usage(void)
{
    fputs("usage: orderbook gen --messages N --seed S [--depth D]\n"
          "       orderbook replay FILE [--trades OUT] [--threads T] [--pipeline]"
          " [--alloc malloc|pool]\n"
          "                            [--passes P] [--pin]\n",
          stderr);
    exit(2);
}

static uint64_t parse_count(const char *option, const char *text, uint64_t min, uint64_t max)
{
    char *end;
    errno = 0;
    unsigned long long v = text ? strtoull(text, &end, 10) : 0;
    if (!text || !*text || *end || errno || text[0] == '-' || v < min || v > max) {
        fprintf(stderr, "orderbook: %s wants an integer in [%llu, %llu], got '%s'\n", option,
                (unsigned long long)min, (unsigned long long)max, text ? text : "");
        exit(2);
    }
    return v;
}

static int gen_main(int argc, char **argv)
{
    uint64_t messages = 0, seed = 1, depth = 50;
    int have_messages = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--messages") == 0) {
            messages = parse_count("--messages", argv[++i], 0, UINT64_C(1) << 40);
            have_messages = 1;
        } else if (strcmp(argv[i], "--seed") == 0) {
            seed = parse_count("--seed", argv[++i], 0, UINT64_MAX);
        } else if (strcmp(argv[i], "--depth") == 0) {
            depth = parse_count("--depth", argv[++i], 1, 1000000);
        } else {
            usage();
        }
    }
    if (!have_messages)
        usage();
    static char buffer[1 << 16];
    setvbuf(stdout, buffer, _IOFBF, sizeof(buffer));
    if (ob_generate(stdout, messages, seed, (int)depth)) {
        perror("orderbook: write");
        return 2;
    }
    return 0;
}

static int replay_main(int argc, char **argv)
{
    ob_replay_options options = {.threads = 1};
    const char *file = NULL;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--trades") == 0) {
            if (!(options.trades_path = argv[++i]))
                usage();
        } else if (strcmp(argv[i], "--threads") == 0) {
            options.threads = (int)parse_count("--threads", argv[++i], 1, 1024);
        } else if (strcmp(argv[i], "--passes") == 0) {
            options.passes = (int)parse_count("--passes", argv[++i], 1, 1000000);
        } else if (strcmp(argv[i], "--pipeline") == 0) {
            options.pipeline = 1;
        } else if (strcmp(argv[i], "--pin") == 0) {
            options.pin = 1;
        } else if (strcmp(argv[i], "--alloc") == 0) {
            const char *a = argv[++i];
            if (a && strcmp(a, "pool") == 0)
                options.use_pool = 1;
            else if (!a || strcmp(a, "malloc") != 0)
                usage();
        } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
            usage();
        } else if (!file) {
            file = argv[i];
        } else {
            usage();
        }
    }
    if (!file)
        usage();
    ob_stream stream = {0};
    char err[512];
    if (ob_parse_file(file, &stream, err, sizeof(err))) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    ob_replay_result result;
    int status = ob_replay(&stream, &options, &result);
    if (status == 0) {
        /* with --trades - the trades own standard output and the summary goes to stderr */
        int to_stdout = !options.trades_path || strcmp(options.trades_path, "-") != 0;
        ob_replay_print(to_stdout ? stdout : stderr, &options, &result);
        fflush(stdout);
    }
    ob_stream_free(&stream);
    return status;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        usage();
    if (strcmp(argv[1], "gen") == 0)
        return gen_main(argc - 2, argv + 2);
    if (strcmp(argv[1], "replay") == 0)
        return replay_main(argc - 2, argv + 2);
    usage();
}
