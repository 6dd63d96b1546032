/* Writes the seed corpus of the GGUF fuzz target: one valid file. */
#include <stdio.h>

#include "gguf_builder.h"

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    gb_t b = gb_valid();
    FILE *f = fopen(argv[1], "wb");
    if (f == NULL || fwrite(b.p, 1, b.n, f) != b.n)
        return 1;
    fclose(f);
    free(b.p);
    return 0;
}
