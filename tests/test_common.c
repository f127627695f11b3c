/* common/: status strings, the error slot, the bounded buffer, deadlines. */
#include "test_util.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

START_TEST(test_status_strings)
{
    ck_assert_str_eq(rg_status_str(RG_OK), "success");
    ck_assert_str_eq(rg_status_name(RG_EPEER), "RG_EPEER");
    ck_assert_str_eq(rg_status_str((rg_status_t)12345), "unknown status");
}
END_TEST

START_TEST(test_error_slot)
{
    rg_error_clear();
    ck_assert_str_eq(rg_last_error(), "");
    ck_assert_int_eq(rg_error(RG_EIO, "disk %d failed", 3), RG_EIO);
    ck_assert_str_eq(rg_last_error(), "disk 3 failed");
    ck_assert_int_eq(rg_error_wrap(RG_EIO, "saving %s", "step-4"), RG_EIO);
    ck_assert_str_eq(rg_last_error(), "saving step-4: disk 3 failed");
}
END_TEST

START_TEST(test_dbuf_limit)
{
    rg_dbuf_t b;
    rg_dbuf_init(&b, 10);
    ck_assert_int_eq(rg_dbuf_append(&b, "hello", 5), RG_OK);
    ck_assert_int_eq(rg_dbuf_printf(&b, "%d", 1234), RG_OK);
    ck_assert_str_eq(b.data, "hello1234");
    ck_assert_int_eq(rg_dbuf_append(&b, "xy", 2), RG_ETOOBIG);
    ck_assert_uint_eq(b.len, 9);
    rg_dbuf_consume(&b, 5);
    ck_assert_str_eq(b.data, "1234");
    rg_dbuf_cleanup(&b);
}
END_TEST

START_TEST(test_deadline)
{
    rg_deadline_t d = rg_deadline_in_ms(50);
    ck_assert(!rg_deadline_passed(d));
    ck_assert_int_le(rg_deadline_left_ms(d), 50);
    ck_assert(rg_deadline_passed(rg_deadline_in_ms(0)));
    int64_t v;
    ck_assert(rg_parse_i64("-42", &v) && v == -42);
    ck_assert(!rg_parse_i64("42x", &v));
    ck_assert(!rg_parse_i64("", &v));
    ck_assert(!rg_parse_i64("99999999999999999999", &v));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("common");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_status_strings);
    tcase_add_test(tc, test_error_slot);
    tcase_add_test(tc, test_dbuf_limit);
    tcase_add_test(tc, test_deadline);
    suite_add_tcase(s, tc);
    return test_main("test_common", s, NULL);
}
