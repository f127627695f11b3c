/* Small helpers shared by the test suites. */
#ifndef REGROUP_TEST_UTIL_H
#define REGROUP_TEST_UTIL_H

#include <regroup/etcd.h>

#include <stdbool.h>

/* True if the file's first MiB contains text (false if it cannot be read). */
bool test_file_contains(const char *path, const char *text);

/* Makes, with the openssl command, in dir: a test CA (ca.pem, ca.key), a certificate it signed
 * for a server on 127.0.0.1 (srv.pem, srv.key), one it signed for a client (cli.pem, cli.key)
 * and an unrelated CA (other.pem). False if openssl failed. */
bool test_make_certs(const char *dir);

/* Puts key=v through a client made from p, retrying for up to 5 s: a TLS member's port opens
 * before it has elected itself. RG_OK, or the last error. */
rg_status_t test_etcd_put_when_ready(const rg_etcd_params_t *p, const char *key);

#endif
