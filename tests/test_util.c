/* Small helpers shared by the test suites. */
#include "test_util.h"

#include "rg_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool test_file_contains(const char *path, const char *text)
{
    static char buf[1 << 20];
    FILE *f = fopen(path, "r");
    size_t n;

    if (f == NULL) {
        return false;
    }
    n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return strstr(buf, text) != NULL;
}

bool test_make_certs(const char *dir)
{
    char cmd[2048];
    int n = snprintf(
        cmd, sizeof(cmd),
        "(cd '%s' && "
        "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=rg-test-ca "
        "-keyout ca.key -out ca.pem && "
        "openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout srv.key -out srv.csr && "
        "printf 'subjectAltName=IP:127.0.0.1\\nextendedKeyUsage=serverAuth,clientAuth\\n' "
        "> srv.cnf && "
        "openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
        "-extfile srv.cnf -out srv.pem && "
        "openssl req -newkey rsa:2048 -nodes -subj /CN=rg-test-client -keyout cli.key "
        "-out cli.csr && "
        "printf 'extendedKeyUsage=clientAuth\\n' > cli.cnf && "
        "openssl x509 -req -in cli.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
        "-extfile cli.cnf -out cli.pem && "
        "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=other-ca "
        "-keyout other.key -out other.pem) >/dev/null 2>&1",
        dir);
    return n > 0 && (size_t)n < sizeof(cmd) && system(cmd) == 0;
}

rg_status_t test_etcd_put_when_ready(const rg_etcd_params_t *p, const char *key)
{
    rg_etcd_t *c;
    rg_status_t st = rg_etcd_create(p, &c);
    if (st != RG_OK) {
        return st;
    }
    for (int i = 0; i < 100; i++) {
        st = rg_etcd_put_str(c, key, "v", 0, 0, NULL);
        if (st == RG_OK) {
            break;
        }
        rg_sleep_ms(50);
    }
    rg_etcd_destroy(c);
    return st;
}
