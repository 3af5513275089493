/* SPDX-License-Identifier: MIT (see LICENSE) */
/* A rank that prints a line every 0.5 s with plain printf (stdio's own buffering: blocks on a
 * pipe, lines on a terminal) until the file argv[1] exists, then "done". test_ddprun.sh checks
 * that ddprun passes its first line on while it still runs. Bounded: gives up after 120 s. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    struct timespec half = {0, 500000000L};
    int i;
    if (argc != 2) { fprintf(stderr, "usage: print_slowly FLAG_FILE\n"); return 2; }
    for (i = 1; i <= 240; i++) {
        printf("line %d\n", i);
        if (access(argv[1], F_OK) == 0) { printf("done\n"); return 0; }
        nanosleep(&half, NULL);
    }
    printf("gave up: %s never appeared\n", argv[1]);
    return 1;
}
