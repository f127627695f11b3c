/* The etcd client against a tiny local HTTP server that misbehaves on purpose. */
#include "rg_common.h"

#include <regroup/etcd.h>

#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef enum {
    BAD_GARBAGE,
    BAD_TRUNCATED,
    BAD_500,
    BAD_STALL,
    BAD_HUGE,
    BAD_NOT_JSON,
    BAD_SHORT_BODY,
} bad_mode_t;

typedef struct {
    int        lfd;
    int        port;
    bad_mode_t mode;
    pthread_t  thread;
} bad_server_t;

/* Reads one request (headers and Content-Length body), bounded. */
static void read_request(int fd)
{
    char buf[8192];
    size_t got = 0;
    uint64_t until = rg_now_ns() + 5000000000ull;
    while (got < sizeof(buf) - 1 && rg_now_ns() < until) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0) {
            continue;
        }
        ssize_t n = read(fd, buf + got, sizeof(buf) - 1 - got);
        if (n <= 0) {
            return;
        }
        got += (size_t)n;
        buf[got] = '\0';
        char *end = strstr(buf, "\r\n\r\n");
        const char *cl = strcasestr(buf, "Content-Length:");
        if (end != NULL && (cl == NULL || got >= (size_t)(end + 4 - buf) + (size_t)atoi(cl + 15))) {
            return;
        }
    }
}

static void send_all(int fd, const char *s, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
        if (w <= 0) {
            return;
        }
        s += w;
        n -= (size_t)w;
    }
}

static void *bad_main(void *arg)
{
    bad_server_t *b = arg;
    /* Serve a bounded number of connections: the client retries a few times at most. */
    for (int conns = 0; conns < 16; conns++) {
        struct pollfd p = {.fd = b->lfd, .events = POLLIN};
        if (poll(&p, 1, 10000) <= 0) {
            break;
        }
        int fd = accept(b->lfd, NULL, NULL);
        if (fd < 0) {
            break;
        }
        read_request(fd);
        static char big[1 << 16];
        const char *r = NULL;
        switch (b->mode) {
        case BAD_GARBAGE:
            r = "\x01\x02 this is not HTTP at all \xff\xfe\r\n\r\n";
            break;
        case BAD_TRUNCATED:
            r = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 29\r\n\r\n"
                "{\"header\":{\"revision\":\"3\"},\"k";
            break;
        case BAD_SHORT_BODY:
            r = "HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n{\"header\":{}}";
            break;
        case BAD_NOT_JSON:
            r = "HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello world";
            break;
        case BAD_500:
            r = "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 45\r\n\r\n"
                "{\"error\":\"boom\",\"message\":\"boom\",\"code\":13}\r\n";
            break;
        case BAD_STALL:
            r = "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{\"header\":";
            break;
        case BAD_HUGE:
            send_all(fd, "HTTP/1.1 200 OK\r\n\r\n{\"x\":\"", 26);
            memset(big, 'a', sizeof(big));
            for (int i = 0; i < 64; i++) {
                send_all(fd, big, sizeof(big));
            }
            break;
        }
        if (r != NULL) {
            send_all(fd, r, strlen(r));
        }
        if (b->mode == BAD_STALL) {
            /* Hold the connection open until the client gives up. */
            struct pollfd q = {.fd = fd, .events = POLLIN};
            poll(&q, 1, 10000);
        }
        close(fd);
    }
    return NULL;
}

static void bad_start(bad_server_t *b, bad_mode_t mode)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t len = sizeof(sa);
    b->mode = mode;
    b->lfd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(b->lfd, 0);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(b->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    ck_assert_int_eq(listen(b->lfd, 8), 0);
    ck_assert_int_eq(getsockname(b->lfd, (struct sockaddr *)&sa, &len), 0);
    b->port = ntohs(sa.sin_port);
    ck_assert_int_eq(pthread_create(&b->thread, NULL, bad_main, b), 0);
}

static void bad_stop(bad_server_t *b)
{
    shutdown(b->lfd, SHUT_RDWR);
    close(b->lfd);
    pthread_join(b->thread, NULL);
}

/* Runs one call against a bad server and checks the status and the time it took. */
static void check_bad(bad_mode_t mode, size_t max_response, rg_status_t expect, const char *word)
{
    bad_server_t b;
    rg_etcd_t *c;
    char ep[64];
    rg_etcd_range_t r;

    bad_start(&b, mode);
    snprintf(ep, sizeof(ep), "http://127.0.0.1:%d", b.port);
    rg_etcd_params_t p = {.endpoints = ep, .timeout_ms = 800, .max_response = max_response};
    ck_assert_int_eq(rg_etcd_create(&p, &c), RG_OK);
    rg_etcd_range_req_t rq = {.key = "/k"};
    uint64_t t0 = rg_now_ns();
    rg_status_t st = rg_etcd_range(c, &rq, 0, &r);
    uint64_t took_ms = (rg_now_ns() - t0) / 1000000;
    ck_assert_msg(st == expect, "mode %d: got %s (%s), want %s", mode, rg_status_name(st),
                  rg_last_error(), rg_status_name(expect));
    ck_assert_msg(strstr(rg_last_error(), ep) != NULL, "names the endpoint: %s", rg_last_error());
    ck_assert_msg(strstr(rg_last_error(), word) != NULL, "says '%s': %s", word, rg_last_error());
    ck_assert_msg(took_ms < 2000, "mode %d took %llu ms", mode, (unsigned long long)took_ms);
    rg_etcd_destroy(c);
    bad_stop(&b);
}

START_TEST(test_garbage)
{
    check_bad(BAD_GARBAGE, 0, RG_EPROTO, "malformed");
}
END_TEST

START_TEST(test_truncated_json)
{
    check_bad(BAD_TRUNCATED, 0, RG_EPROTO, "JSON");
}
END_TEST

START_TEST(test_short_body)
{
    check_bad(BAD_SHORT_BODY, 0, RG_EPROTO, "truncated");
}
END_TEST

START_TEST(test_not_json)
{
    check_bad(BAD_NOT_JSON, 0, RG_EPROTO, "JSON");
}
END_TEST

START_TEST(test_http_500)
{
    check_bad(BAD_500, 0, RG_ESERVER, "HTTP 500: boom");
}
END_TEST

START_TEST(test_stalled_body)
{
    check_bad(BAD_STALL, 0, RG_ETIMEDOUT, "timed out");
}
END_TEST

START_TEST(test_oversized)
{
    check_bad(BAD_HUGE, 1 << 20, RG_ETOOBIG, "limit");
}
END_TEST

Suite *etcd_faults_suite(void);

Suite *etcd_faults_suite(void)
{
    Suite *s = suite_create("etcd_faults");
    TCase *tc = tcase_create("bad_server");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_garbage);
    tcase_add_test(tc, test_truncated_json);
    tcase_add_test(tc, test_not_json);
    tcase_add_test(tc, test_short_body);
    tcase_add_test(tc, test_http_500);
    tcase_add_test(tc, test_stalled_body);
    tcase_add_test(tc, test_oversized);
    suite_add_tcase(s, tc);
    return s;
}
