/* A tiny GGUF image builder for the tests and the fuzz seed. */
#ifndef GGUF_BUILDER_H
#define GGUF_BUILDER_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct gb {
    uint8_t *p;
    size_t n, cap;
} gb_t;

static inline void gb_put(gb_t *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static inline void gb_u8(gb_t *b, uint8_t v) { gb_put(b, &v, 1); }
static inline void gb_u32(gb_t *b, uint32_t v) { gb_put(b, &v, 4); }
static inline void gb_u64(gb_t *b, uint64_t v) { gb_put(b, &v, 8); }
static inline void gb_str(gb_t *b, const char *s)
{
    gb_u64(b, strlen(s));
    gb_put(b, s, strlen(s));
}
static inline void gb_pad(gb_t *b, size_t align)
{
    while (b->n % align)
        gb_u8(b, 0);
}

/* A valid v3 file: every metadata type, arrays (nested too), alignment 64,
 * three tensors (f32 [8x2], q4_1 [32x2], q8_0 [64]). */
static inline gb_t gb_valid(void)
{
    gb_t b = {0};
    gb_u32(&b, 0x46554747u);
    gb_u32(&b, 3);
    gb_u64(&b, 3);   /* tensors */
    gb_u64(&b, 16);  /* keys */
    gb_str(&b, "k.u8"); gb_u32(&b, 0); gb_u8(&b, 200);
    gb_str(&b, "k.i8"); gb_u32(&b, 1); gb_u8(&b, 0xFE);
    gb_str(&b, "k.u16"); gb_u32(&b, 2); { uint16_t v = 60000; gb_put(&b, &v, 2); }
    gb_str(&b, "k.i16"); gb_u32(&b, 3); { int16_t v = -300; gb_put(&b, &v, 2); }
    gb_str(&b, "k.u32"); gb_u32(&b, 4); gb_u32(&b, 4000000000u);
    gb_str(&b, "k.i32"); gb_u32(&b, 5); { int32_t v = -7; gb_put(&b, &v, 4); }
    gb_str(&b, "k.f32"); gb_u32(&b, 6); { float v = 1.5f; gb_put(&b, &v, 4); }
    gb_str(&b, "k.bool"); gb_u32(&b, 7); gb_u8(&b, 1);
    gb_str(&b, "k.str"); gb_u32(&b, 8); gb_str(&b, "hello");
    gb_str(&b, "k.u64"); gb_u32(&b, 10); gb_u64(&b, 1ull << 40);
    gb_str(&b, "k.i64"); gb_u32(&b, 11); gb_u64(&b, (uint64_t)-5);
    gb_str(&b, "k.f64"); gb_u32(&b, 12); { double v = 2.25; gb_put(&b, &v, 8); }
    gb_str(&b, "k.arr_u32"); gb_u32(&b, 9); gb_u32(&b, 4); gb_u64(&b, 3); gb_u32(&b, 1); gb_u32(&b, 2); gb_u32(&b, 3);
    gb_str(&b, "k.arr_str"); gb_u32(&b, 9); gb_u32(&b, 8); gb_u64(&b, 2); gb_str(&b, "ab"); gb_str(&b, "");
    gb_str(&b, "k.nested"); gb_u32(&b, 9); gb_u32(&b, 9); gb_u64(&b, 2);
    gb_u32(&b, 1); gb_u64(&b, 2); gb_u8(&b, 1); gb_u8(&b, 2);
    gb_u32(&b, 8); gb_u64(&b, 1); gb_str(&b, "x");
    gb_str(&b, "general.alignment"); gb_u32(&b, 4); gb_u32(&b, 64);
    /* tensors */
    gb_str(&b, "a"); gb_u32(&b, 2); gb_u64(&b, 8); gb_u64(&b, 2); gb_u32(&b, 0); gb_u64(&b, 0);
    gb_str(&b, "b"); gb_u32(&b, 2); gb_u64(&b, 32); gb_u64(&b, 2); gb_u32(&b, 3); gb_u64(&b, 64);
    gb_str(&b, "c"); gb_u32(&b, 1); gb_u64(&b, 64); gb_u32(&b, 8); gb_u64(&b, 128);
    gb_pad(&b, 64);
    for (int i = 0; i < 16; i++) {
        float v = (float)i;
        gb_put(&b, &v, 4);
    }
    for (int i = 0; i < 40 + 24; i++)   /* q4_1: 2 rows x 20 bytes, pad to 128 */
        gb_u8(&b, (uint8_t)i);
    for (int i = 0; i < 68; i++)        /* q8_0: 2 blocks x 34 bytes */
        gb_u8(&b, (uint8_t)(i * 7));
    return b;
}

#endif /* GGUF_BUILDER_H */
