/* The etcd client over TLS: a CA made for the test, a server certificate for 127.0.0.1. */
#include "test_util.h"

#include <regroup/etcd.h>

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static test_etcd_t etcd;

static void down(void)
{
    test_etcd_down(&etcd);
}

/* A put on a new client made from p: RG_OK, or the error with its message. */
static rg_status_t put_with(const rg_etcd_params_t *p, const char *key)
{
    rg_etcd_t *c;
    rg_status_t st = rg_etcd_create(p, &c);
    if (st == RG_OK) {
        st = rg_etcd_put_str(c, key, "v", 0, 0, NULL);
        rg_etcd_destroy(c);
    }
    return st;
}

START_TEST(test_tls_round_trip)
{
    char other[300];
    rg_etcd_t *c;

    test_etcd_up(&etcd, &(test_etcd_opts_t){.tls = true});
    rg_etcd_params_t p = etcd.params;
    rg_status_t st = put_with(&p, "/tls/k");
    ck_assert_msg(st == RG_OK, "%s", rg_last_error());
    ck_assert_int_eq(rg_etcd_create(&p, &c), RG_OK);
    char *v;
    size_t len;
    ck_assert_int_eq(rg_etcd_get(c, "/tls/k", 0, &v, &len, NULL), RG_OK);
    ck_assert_str_eq(v, "v");
    free(v);
    rg_etcd_destroy(c);

    /* A CA that did not sign the server's certificate: refused, and said so. */
    snprintf(other, sizeof(other), "%s/other.pem", etcd.certs);
    p.ca_file = other;
    st = put_with(&p, "/tls/k");
    ck_assert_msg(st == RG_EAUTH, "%s: %s", rg_status_name(st), rg_last_error());
    ck_assert_msg(strstr(rg_last_error(), "TLS") != NULL, "%s", rg_last_error());
}
END_TEST

/* A server that requires client certificates: a client that has one signed by the CA gets
 * in, one without is refused and told so. */
START_TEST(test_tls_client_certificate)
{
    test_etcd_up(&etcd, &(test_etcd_opts_t){.tls = true, .client_certs = true});
    rg_etcd_params_t p = etcd.params;
    rg_status_t st = put_with(&p, "/tls/k");
    ck_assert_msg(st == RG_OK, "%s", rg_last_error());

    p.cert_file = NULL;
    p.key_file = NULL;
    st = put_with(&p, "/tls/k");
    ck_assert_msg(st == RG_EAUTH, "%s: %s", rg_status_name(st), rg_last_error());
    ck_assert_msg(strstr(rg_last_error(), "TLS") != NULL, "%s", rg_last_error());
}
END_TEST

int main(void)
{
    Suite *s = suite_create("etcd_tls");
    TCase *tc = tcase_create("tls");
    tcase_add_checked_fixture(tc, NULL, down);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_tls_round_trip);
    tcase_add_test(tc, test_tls_client_certificate);
    suite_add_tcase(s, tc);
    return test_main("test_etcd_tls", s, NULL);
}
