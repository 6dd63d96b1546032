/* Tagged allocator: accounting, alignment, fault injection. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "common/cm_alloc.h"

static CM_ALLOC_TAG(test_tag, "test.alloc");

static void count_tag(const cm_alloc_tag_t *tag, void *arg)
{
    if (strcmp(tag->name, "test.alloc") == 0)
        (*(int *)arg)++;
}

static void test_accounting(void **state)
{
    void *a = cm_malloc(&test_tag, 100);
    void *b = cm_calloc(&test_tag, 10, 10);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(atomic_load(&test_tag.bytes), 200);
    assert_int_equal(atomic_load(&test_tag.blocks), 2);
    a = cm_realloc(&test_tag, a, 300);
    assert_non_null(a);
    assert_int_equal(atomic_load(&test_tag.bytes), 400);
    cm_free(a);
    cm_free(b);
    cm_free(NULL);
    assert_int_equal(atomic_load(&test_tag.bytes), 0);
    assert_true(atomic_load(&test_tag.peak_bytes) >= 400);
    int seen = 0;
    cm_alloc_visit(count_tag, &seen);
    assert_int_equal(seen, 1);
    assert_null(cm_calloc(&test_tag, SIZE_MAX / 2, 4)); /* overflow */
}

static void test_aligned(void **state)
{
    for (size_t align = 16; align <= 4096; align *= 2) {
        uint8_t *p = cm_malloc_aligned(&test_tag, 1000, align);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % align, 0);
        memset(p, 1, 1000);
        cm_free(p);
    }
    assert_null(cm_malloc_aligned(&test_tag, 10, 24));
    assert_int_equal(atomic_load(&test_tag.bytes), 0);
}

static void test_fault_injection(void **state)
{
    cm_alloc_fail_after(2);
    void *a = cm_malloc(&test_tag, 8);
    void *b = cm_malloc(&test_tag, 8);
    void *c = cm_malloc(&test_tag, 8);
    assert_non_null(a);
    assert_null(b);
    assert_non_null(c);
    cm_free(a);
    cm_free(c);
    char *s = cm_strdup(&test_tag, "hello");
    assert_string_equal(s, "hello");
    cm_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accounting),
        cmocka_unit_test(test_aligned),
        cmocka_unit_test(test_fault_injection),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
