/* The etcd client over TLS: a CA made for the test, a server certificate for 127.0.0.1. */
#include "rg_common.h"
#include "etcd_server.h"
#include "test_util.h"

#include <regroup/etcd.h>

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char dir[256];

static void make_certs(void)
{
    snprintf(dir, sizeof(dir), "/tmp/rg-tls-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    ck_assert(test_make_certs(dir));
}

static void remove_certs(void)
{
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

START_TEST(test_tls_round_trip)
{
    rg_etcd_server_t srv;
    char cert[300];
    char key[300];
    char ca[300];
    char other[300];
    rg_etcd_t *c;

    make_certs();
    snprintf(cert, sizeof(cert), "%s/srv.pem", dir);
    snprintf(key, sizeof(key), "%s/srv.key", dir);
    snprintf(ca, sizeof(ca), "%s/ca.pem", dir);
    snprintf(other, sizeof(other), "%s/other.pem", dir);
    ck_assert_int_eq(rg_etcd_server_start_tls(&srv, cert, key, NULL), 0);

    rg_etcd_params_t p = {.endpoints = srv.endpoints, .ca_file = ca, .timeout_ms = 3000};
    rg_status_t st = test_etcd_put_when_ready(&p, "/tls/k");
    ck_assert_msg(st == RG_OK, "%s", rg_last_error());
    ck_assert_int_eq(rg_etcd_create(&p, &c), RG_OK);
    char *v;
    size_t len;
    ck_assert_int_eq(rg_etcd_get(c, "/tls/k", 0, &v, &len, NULL), RG_OK);
    ck_assert_str_eq(v, "v");
    free(v);
    rg_etcd_destroy(c);

    /* A CA that did not sign the server's certificate: refused, and said so. */
    p.ca_file = other;
    ck_assert_int_eq(rg_etcd_create(&p, &c), RG_OK);
    st = rg_etcd_put_str(c, "/tls/k", "v", 0, 0, NULL);
    ck_assert_msg(st == RG_EAUTH, "%s: %s", rg_status_name(st), rg_last_error());
    ck_assert_msg(strstr(rg_last_error(), "TLS") != NULL, "%s", rg_last_error());
    rg_etcd_destroy(c);

    rg_etcd_server_stop(&srv);
    remove_certs();
}
END_TEST

/* A server that requires client certificates: a client that has one signed by the CA gets
 * in, one without is refused and told so. */
START_TEST(test_tls_client_certificate)
{
    rg_etcd_server_t srv;
    char cert[300];
    char key[300];
    char ca[300];
    char cli_cert[300];
    char cli_key[300];
    char flags[400];
    rg_etcd_t *c;

    make_certs();
    snprintf(cert, sizeof(cert), "%s/srv.pem", dir);
    snprintf(key, sizeof(key), "%s/srv.key", dir);
    snprintf(ca, sizeof(ca), "%s/ca.pem", dir);
    snprintf(cli_cert, sizeof(cli_cert), "%s/cli.pem", dir);
    snprintf(cli_key, sizeof(cli_key), "%s/cli.key", dir);
    snprintf(flags, sizeof(flags), "--client-cert-auth --trusted-ca-file %s", ca);
    ck_assert_int_eq(rg_etcd_server_start_tls(&srv, cert, key, flags), 0);

    rg_etcd_params_t p = {.endpoints = srv.endpoints, .ca_file = ca, .cert_file = cli_cert,
                          .key_file = cli_key, .timeout_ms = 3000};
    rg_status_t st = test_etcd_put_when_ready(&p, "/tls/k");
    ck_assert_msg(st == RG_OK, "%s", rg_last_error());

    p.cert_file = NULL;
    p.key_file = NULL;
    ck_assert_int_eq(rg_etcd_create(&p, &c), RG_OK);
    st = rg_etcd_put_str(c, "/tls/k", "v", 0, 0, NULL);
    ck_assert_msg(st == RG_EAUTH, "%s: %s", rg_status_name(st), rg_last_error());
    ck_assert_msg(strstr(rg_last_error(), "TLS") != NULL, "%s", rg_last_error());
    rg_etcd_destroy(c);

    rg_etcd_server_stop(&srv);
    remove_certs();
}
END_TEST

int main(void)
{
    Suite *s = suite_create("etcd_tls");
    TCase *tc = tcase_create("tls");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_tls_round_trip);
    tcase_add_test(tc, test_tls_client_certificate);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
