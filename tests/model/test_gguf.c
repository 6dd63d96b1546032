/*
 * GGUF reader: every metadata type, arrays (nested), alignment and tensor
 * extents of a hand-built file, also opened from disk (in read-only memory
 * aligned for huge pages); then malformed input: every truncation,
 * targeted corruptions (each must fail with a message) and random byte flips
 * (must never crash).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/cm_alloc.h"
#include "gpuworker/model/mdl_gguf.h"
#include "gguf_builder.h"

static void test_valid_file(void **state)
{
    (void)state;
    gb_t b = gb_valid();
    mdl_gguf_t *g;
    char err[256];
    assert_int_equal(mdl_gguf_open_mem(b.p, b.n, &g, err, sizeof(err)), RI_OK);
    assert_int_equal(g->version, 3);
    assert_int_equal(g->n_kv, 16);
    assert_int_equal(g->alignment, 64);
    uint64_t u;
    float f;
    bool bo;
    char *s;
    assert_int_equal(mdl_gguf_get_u64(g, "k.u8", &u), RI_OK);
    assert_int_equal(u, 200);
    assert_int_equal(mdl_gguf_find(g, "k.i8")->v.i, -2);
    assert_int_equal(mdl_gguf_find(g, "k.u16")->v.u, 60000);
    assert_int_equal(mdl_gguf_find(g, "k.i16")->v.i, -300);
    assert_int_equal(mdl_gguf_find(g, "k.u32")->v.u, 4000000000u);
    assert_int_equal(mdl_gguf_find(g, "k.i32")->v.i, -7);
    assert_int_equal(mdl_gguf_get_f32(g, "k.f32", &f), RI_OK);
    assert_true(f == 1.5f);
    assert_int_equal(mdl_gguf_get_bool(g, "k.bool", &bo), RI_OK);
    assert_true(bo);
    assert_int_equal(mdl_gguf_get_str(g, "k.str", &s), RI_OK);
    assert_string_equal(s, "hello");
    cm_free(s);
    assert_int_equal(mdl_gguf_find(g, "k.u64")->v.u, 1ull << 40);
    assert_int_equal(mdl_gguf_find(g, "k.i64")->v.i, -5);
    assert_true(mdl_gguf_find(g, "k.f64")->v.f == 2.25);
    assert_int_equal(mdl_gguf_get_u64(g, "k.i64", &u), RI_ERR_FORMAT);   /* negative */
    assert_int_equal(mdl_gguf_get_u64(g, "k.str", &u), RI_ERR_FORMAT);
    assert_int_equal(mdl_gguf_get_u64(g, "nope", &u), RI_ERR_NOT_FOUND);
    const mdl_gguf_kv_t *a = mdl_gguf_find(g, "k.arr_u32");
    assert_int_equal(a->arr_type, MDL_GGUF_U32);
    assert_int_equal(a->arr_n, 3);
    uint32_t third;
    memcpy(&third, (const uint8_t *)a->arr_data + 8, 4);
    assert_int_equal(third, 3);
    a = mdl_gguf_find(g, "k.arr_str");
    assert_int_equal(a->arr_n, 2);
    assert_int_equal(a->arr_str[0].len, 2);
    assert_memory_equal(a->arr_str[0].ptr, "ab", 2);
    assert_int_equal(a->arr_str[1].len, 0);
    assert_int_equal(mdl_gguf_find(g, "k.nested")->arr_n, 2);
    assert_int_equal(g->n_tensors, 3);
    const mdl_gguf_tensor_t *t = mdl_gguf_tensor(g, "a");
    assert_non_null(t);
    assert_int_equal(t->ne[0], 8);
    assert_int_equal(t->ne[1], 2);
    assert_int_equal(t->n_bytes, 64);
    assert_int_equal(((uintptr_t)t->data - (uintptr_t)b.p) % 64, 0);
    float v;
    memcpy(&v, (const uint8_t *)t->data + 4 * 5, 4);
    assert_true(v == 5.0f);
    t = mdl_gguf_tensor(g, "b");
    assert_int_equal(t->type, MDL_GGML_Q4_1);
    assert_int_equal(t->n_bytes, 40);
    t = mdl_gguf_tensor(g, "c");
    assert_int_equal(t->n_bytes, 68);
    assert_null(mdl_gguf_tensor(g, "d"));
    mdl_gguf_close(g);
    mdl_gguf_close(NULL);
    free(b.p);
}

static void test_every_truncation_fails(void **state)
{
    (void)state;
    gb_t b = gb_valid();
    char err[256];
    for (size_t n = 0; n < b.n; n++) {
        uint8_t *copy = malloc(n + 1);   /* exact size: ASan sees any overread */
        memcpy(copy, b.p, n);
        mdl_gguf_t *g = NULL;
        err[0] = '\0';
        ri_status_t st = mdl_gguf_open_mem(copy, n, &g, err, sizeof(err));
        if (st == RI_OK)
            fail_msg("a %zu-byte prefix of %zu parsed", n, b.n);
        assert_true(err[0] != '\0');
        assert_null(g);
        free(copy);
    }
    free(b.p);
}

/* Apply a corruption, expect a failure with a message. */
static void expect_bad(gb_t *b, size_t off, const void *bytes, size_t n, const char *what)
{
    uint8_t *copy = malloc(b->n);
    memcpy(copy, b->p, b->n);
    memcpy(copy + off, bytes, n);
    mdl_gguf_t *g = NULL;
    char err[256] = "";
    ri_status_t st = mdl_gguf_open_mem(copy, b->n, &g, err, sizeof(err));
    if (st == RI_OK)
        fail_msg("corruption '%s' was accepted", what);
    assert_true(err[0] != '\0');
    free(copy);
}

/* Offset of the tensor name `s` (after its u64 length) in the tensor infos. */
static size_t find_tensor(const gb_t *b, const char *s)
{
    uint8_t pat[64];
    uint64_t len = strlen(s);
    memcpy(pat, &len, 8);
    memcpy(pat + 8, s, len);
    size_t from = 0;
    for (size_t i = 0; i + 8 + len <= b->n; i++)
        if (memcmp(b->p + i, pat, 8 + len) == 0)
            from = i + 8;   /* the last match: tensor infos come after the keys */
    assert_true(from > 0);
    return from;
}

static size_t find(const gb_t *b, const char *s)
{
    size_t n = strlen(s);
    for (size_t i = 0; i + n <= b->n; i++)
        if (memcmp(b->p + i, s, n) == 0)
            return i;
    fail_msg("marker %s not found", s);
    return 0;
}

static void test_corruptions_fail(void **state)
{
    (void)state;
    gb_t b = gb_valid();
    uint32_t u32;
    uint64_t u64;
    expect_bad(&b, 0, "GGUX", 4, "magic");
    u32 = 4;
    expect_bad(&b, 4, &u32, 4, "version");
    u64 = 1ull << 62;
    expect_bad(&b, 8, &u64, 8, "tensor count");
    expect_bad(&b, 16, &u64, 8, "key count");
    /* the length of the first key */
    expect_bad(&b, 24, &u64, 8, "huge string length");
    /* type of k.u8 */
    size_t k = find(&b, "k.u8") + 4;
    u32 = 13;
    expect_bad(&b, k, &u32, 4, "unknown value type");
    /* bool that is 2 */
    k = find(&b, "k.bool") + 6 + 4;
    expect_bad(&b, k, "\x02", 1, "bool 2");
    /* array count far beyond the file */
    k = find(&b, "k.arr_u32") + 9 + 4 + 4;
    expect_bad(&b, k, &u64, 8, "array count");
    /* nested array element type unknown */
    k = find(&b, "k.nested") + 8 + 4 + 4 + 8;
    u32 = 77;
    expect_bad(&b, k, &u32, 4, "nested element type");
    /* alignment 3 */
    k = find(&b, "general.alignment") + 17 + 4;
    u32 = 3;
    expect_bad(&b, k, &u32, 4, "alignment 3");
    /* tensor a: dims 0 and 5, a dimension that overflows, unknown type, bad offsets */
    size_t ta = find_tensor(&b, "a") + 1;
    u32 = 0;
    expect_bad(&b, ta, &u32, 4, "0 dims");
    u32 = 5;
    expect_bad(&b, ta, &u32, 4, "5 dims");
    u64 = 1ull << 40;
    uint64_t two[2] = {1ull << 39, 1ull << 39};
    expect_bad(&b, ta + 4, two, 16, "element count overflow");
    expect_bad(&b, ta + 4, &u64, 8, "dimension too large for the file");
    u32 = 99;
    expect_bad(&b, ta + 4 + 16, &u32, 4, "unknown tensor type");
    u64 = 32;
    expect_bad(&b, ta + 4 + 16 + 4, &u64, 8, "misaligned offset");
    u64 = 1ull << 20;
    expect_bad(&b, ta + 4 + 16 + 4, &u64, 8, "offset beyond the file");
    /* q4_1 row of 33 elements is not whole blocks */
    size_t tb = find_tensor(&b, "b") + 1;
    u64 = 33;
    expect_bad(&b, tb + 4, &u64, 8, "partial block");
    /* duplicate tensor names */
    expect_bad(&b, tb - 1, "a", 1, "duplicate name");
    free(b.p);
}

static void test_random_flips_never_crash(void **state)
{
    (void)state;
    gb_t b = gb_valid();
    uint64_t rng = 0x12345678u;
    int ok = 0;
    for (int it = 0; it < 20000; it++) {
        uint8_t *copy = malloc(b.n);
        memcpy(copy, b.p, b.n);
        int flips = 1 + (int)(rng % 4);
        for (int f = 0; f < flips; f++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            copy[(rng >> 33) % b.n] ^= (uint8_t)(1u << ((rng >> 20) % 8));
        }
        mdl_gguf_t *g = NULL;
        char err[256];
        if (mdl_gguf_open_mem(copy, b.n, &g, err, sizeof(err)) == RI_OK) {
            ok++;
            /* whatever parsed must be internally consistent */
            for (uint64_t t = 0; t < g->n_tensors; t++)
                assert_true((const uint8_t *)g->tensors[t].data + g->tensors[t].n_bytes <= copy + b.n);
            mdl_gguf_close(g);
        }
        free(copy);
    }
    printf("random flips: %d of 20000 images still parsed (all consistent)\n", ok);
    free(b.p);
}

/* The perms field of the line of /proc/self/maps that starts at addr into
 * perms[5] (and the whole line into line_out[512] unless NULL); false when
 * there is none. */
static bool map_line(const void *addr, char *perms, char *line_out)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    bool found = false;
    while (f != NULL && !found && fgets(line, sizeof(line), f) != NULL) {
        unsigned long lo;
        if (sscanf(line, "%lx-%*x %4s", &lo, perms) == 2 && lo == (uintptr_t)addr) {
            found = true;
            if (line_out != NULL)
                memcpy(line_out, line, sizeof(line));
        }
    }
    if (f != NULL)
        fclose(f);
    return found;
}

/* A file opened from disk: its bytes in memory aligned to 2 MiB (where the
 * kernel can back them with huge pages), the whole length a multiple of it,
 * read-only, and parsed as the image is. */
static void test_open_file(void **state)
{
    (void)state;
    gb_t b = gb_valid();
    char path[] = "/tmp/test_gguf_XXXXXX", err[256] = "", perms[5] = "";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, b.p, b.n), (ssize_t)b.n);
    close(fd);
    mdl_gguf_t *g = NULL;
    assert_int_equal(mdl_gguf_open(path, &g, err, sizeof(err)), RI_OK);
    unlink(path);
    assert_true(g->mapped);
    assert_int_equal(g->size, b.n);
    assert_int_equal((uintptr_t)g->base % (2u << 20), 0);
    assert_int_equal(g->map_len % (2u << 20), 0);
    assert_true(g->map_len >= g->size);
    assert_memory_equal(g->base, b.p, b.n);
    assert_true(map_line(g->base, perms, NULL));
    assert_int_equal(perms[0], 'r');
    assert_int_equal(perms[1], '-');   /* not writable */
    const mdl_gguf_tensor_t *t = mdl_gguf_tensor(g, "a");
    float v;
    memcpy(&v, (const uint8_t *)t->data + 4 * 5, 4);
    assert_true(v == 5.0f);
    mdl_gguf_close(g);
    free(b.p);
}

/* --model-load map: the file itself is mapped (its line in /proc/self/maps
 * names it), read-only, and parsed the same. */
static void test_open_file_map(void **state)
{
    (void)state;
    gb_t b = gb_valid();
    char path[] = "/tmp/test_gguf_XXXXXX", err[256] = "", perms[5] = "", line[512] = "";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, b.p, b.n), (ssize_t)b.n);
    close(fd);
    mdl_gguf_t *g = NULL;
    mdl_gguf_set_load_map(true);
    ri_status_t st = mdl_gguf_open(path, &g, err, sizeof(err));
    mdl_gguf_set_load_map(false);
    assert_int_equal(st, RI_OK);
    assert_true(map_line(g->base, perms, line));
    assert_non_null(strstr(line, path));
    assert_int_equal(perms[1], '-');
    assert_memory_equal(g->base, b.p, b.n);
    assert_non_null(mdl_gguf_tensor(g, "a"));
    mdl_gguf_close(g);
    unlink(path);
    free(b.p);
}

static void test_open_errors(void **state)
{
    (void)state;
    mdl_gguf_t *g = NULL;
    char err[256] = "";
    assert_int_not_equal(mdl_gguf_open("/nonexistent/x.gguf", &g, err, sizeof(err)), RI_OK);
    assert_non_null(strstr(err, "cannot open"));
    assert_int_equal(mdl_gguf_open("/dev/null", &g, err, sizeof(err)), RI_ERR_FORMAT);
    assert_null(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_file),
        cmocka_unit_test(test_every_truncation_fails),
        cmocka_unit_test(test_corruptions_fail),
        cmocka_unit_test(test_random_flips_never_crash),
        cmocka_unit_test(test_open_file),
        cmocka_unit_test(test_open_file_map),
        cmocka_unit_test(test_open_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
