/*
 * comm/: IEEE binary16 and bfloat16 conversions, checked against references built here from
 * ldexp and nearbyint (round to nearest even in the default rounding mode).
 */
#include "test_util.h"

#include <check.h>
#include <regroup/comm.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* Decodes a 16-bit float with `mbits` mantissa bits and exponent bias `bias`. */
static double decode16(uint16_t h, int ebits, int mbits)
{
    int bias = (1 << (ebits - 1)) - 1;
    int sign = h >> 15;
    int e = (h >> mbits) & ((1 << ebits) - 1);
    int m = h & ((1 << mbits) - 1);
    double v;
    if (e == (1 << ebits) - 1) {
        v = m ? NAN : INFINITY;
    } else if (e == 0) {
        v = ldexp(m, 1 - bias - mbits);
    } else {
        v = ldexp(m + (1 << mbits), e - bias - mbits);
    }
    return sign ? -v : v;
}

/* The correctly rounded value of x in a format with p significand bits, minimum normal
 * exponent emin, and overflow threshold 2^(emax+1) (returned as +-inf). */
static double round_ref(double x, int p, int emin, int emax)
{
    if (x == 0 || isnan(x) || isinf(x)) {
        return x;
    }
    int e = ilogb(x);
    if (e < emin) {
        e = emin;
    }
    double ulp = ldexp(1.0, e - (p - 1));
    double r = nearbyint(x / ulp) * ulp;
    if (fabs(r) >= ldexp(1.0, emax + 1)) {
        return x > 0 ? INFINITY : -INFINITY;
    }
    return r;
}

START_TEST(test_f16_decode_exhaustive)
{
    for (uint32_t h = 0; h < 65536; h++) {
        double want = decode16((uint16_t)h, 5, 10);
        float got = rg_f16_to_f32((uint16_t)h);
        if (isnan(want)) {
            ck_assert_msg(isnan(got), "f16 %04x: want NaN", h);
            ck_assert_msg(isnan(rg_f16_to_f32(rg_f32_to_f16(got))), "f16 %04x: NaN kept", h);
            continue;
        }
        ck_assert_msg((double)got == want, "f16 %04x: got %g want %g", h, got, want);
        ck_assert_msg(!signbit(got) == !signbit(want), "f16 %04x: sign", h);
        ck_assert_msg(rg_f32_to_f16(got) == h, "f16 %04x: round trip gave %04x", h,
                      rg_f32_to_f16(got));
    }
}
END_TEST

START_TEST(test_bf16_decode_exhaustive)
{
    for (uint32_t h = 0; h < 65536; h++) {
        double want = decode16((uint16_t)h, 8, 7);
        float got = rg_bf16_to_f32((uint16_t)h);
        if (isnan(want)) {
            ck_assert_msg(isnan(got), "bf16 %04x: want NaN", h);
            ck_assert_msg(isnan(rg_bf16_to_f32(rg_f32_to_bf16(got))), "bf16 %04x: NaN", h);
            continue;
        }
        ck_assert_msg((double)got == want, "bf16 %04x: got %g want %g", h, got, want);
        ck_assert_msg(rg_f32_to_bf16(got) == h, "bf16 %04x: round trip", h);
    }
}
END_TEST

static void check_f16(float x)
{
    double want = round_ref(x, 11, -14, 15);
    double got = rg_f16_to_f32(rg_f32_to_f16(x));
    if (isnan(x)) {
        ck_assert(isnan(got));
        return;
    }
    ck_assert_msg(got == want && !signbit(got) == !signbit(want),
                  "f16 of %.9g (%08x): got %.9g want %.9g", x, 0u, got, want);
}

static void check_bf16(float x)
{
    double want = round_ref(x, 8, -126, 127);
    double got = rg_bf16_to_f32(rg_f32_to_bf16(x));
    if (isnan(x)) {
        ck_assert(isnan(got));
        return;
    }
    ck_assert_msg(got == want && !signbit(got) == !signbit(want),
                  "bf16 of %.9g: got %.9g want %.9g", x, got, want);
}

START_TEST(test_round_nearest_even_cases)
{
    /* ties: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: to even (1) */
    ck_assert_uint_eq(rg_f32_to_f16(1.0f + 0x1p-11f), 0x3C00);
    ck_assert_uint_eq(rg_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3C02);
    ck_assert_uint_eq(rg_f32_to_f16(65504.0f), 0x7BFF);
    ck_assert_uint_eq(rg_f32_to_f16(65519.0f), 0x7BFF);
    ck_assert_uint_eq(rg_f32_to_f16(65520.0f), 0x7C00); /* tie with 65536: to even = inf */
    ck_assert_uint_eq(rg_f32_to_f16(-1e9f), 0xFC00);
    ck_assert_uint_eq(rg_f32_to_f16(0x1p-24f), 0x0001); /* smallest subnormal */
    ck_assert_uint_eq(rg_f32_to_f16(0x1p-25f), 0x0000); /* tie: to even (zero) */
    ck_assert_uint_eq(rg_f32_to_f16(3 * 0x1p-26f), 0x0001);
    ck_assert_uint_eq(rg_f32_to_f16(3 * 0x1p-25f), 0x0002); /* 1.5 ulp: to even (2) */
    ck_assert_uint_eq(rg_f32_to_f16(-0.0f), 0x8000);
    ck_assert_uint_eq(rg_f32_to_bf16(1.0f + 0x1p-8f), 0x3F80); /* tie: to even */
    ck_assert_uint_eq(rg_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);
    ck_assert_uint_eq(rg_f32_to_bf16(from_bits(0x7F7FFFFF)), 0x7F80); /* max float: inf */
    ck_assert_uint_eq(rg_f32_to_bf16(-0.0f), 0x8000);
    ck_assert(isnan(rg_bf16_to_f32(rg_f32_to_bf16(from_bits(0x7F800001))))); /* sNaN */
    ck_assert(isnan(rg_f16_to_f32(rg_f32_to_f16(from_bits(0x7F800001)))));
}
END_TEST

START_TEST(test_round_random_floats)
{
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < 400000; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        uint32_t u = (uint32_t)s;
        /* half the samples near the 16-bit formats' range, where rounding happens */
        if (i % 2 == 0) {
            u = (u & 0x87FFFFFFu) | (((u >> 27) % 40 + 100) << 23);
        }
        float x = from_bits(u);
        check_f16(x);
        check_bf16(x);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("comm_f16");
    TCase *tc = tcase_create("convert");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_f16_decode_exhaustive);
    tcase_add_test(tc, test_bf16_decode_exhaustive);
    tcase_add_test(tc, test_round_nearest_even_cases);
    tcase_add_test(tc, test_round_random_floats);
    suite_add_tcase(s, tc);
    return test_main("comm_f16", s, NULL);
}
