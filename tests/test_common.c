/* common/: status strings, the error slot, the bounded buffer, deadlines. */
#include "test_util.h"

#include "rg_notice.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

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

/* The agent's notice page as a worker sees it: in another process, through the inherited
 * descriptor named by REGROUP_NOTICE_FD. The child exits 0 when everything it checks holds. */
static int notice_child(int expect_kind, int64_t expect_deadline)
{
    rg_notice_view_t v;
    rg_notice_snap_t snap;
    if (rg_notice_view_open(&v) != RG_OK || v.page == NULL) {
        return 1;
    }
    if (!rg_notice_read(&v, &snap) || snap.kind != expect_kind ||
        snap.deadline_ms != expect_deadline || snap.round != 7 ||
        strcmp(snap.reason, "spot instance-action") != 0 || snap.seq != 1) {
        return 2;
    }
    int64_t now = rg_notice_now_ms();
    if (rg_notice_lease_ttl_ms(&v) != 2000 || rg_notice_heartbeat_age_ms(&v, now) < 0 ||
        rg_notice_heartbeat_age_ms(&v, now + 5000) <= rg_notice_lease_ttl_ms(&v)) {
        return 3;
    }
    rg_notice_view_close(&v);
    return 0;
}

START_TEST(test_notice_page)
{
    rg_notice_host_t h;
    rg_notice_view_t v;
    char fd_s[16];
    int status;

    unsetenv(RG_NOTICE_ENV);
    ck_assert_int_eq(rg_notice_view_open(&v), RG_OK);   /* not under regroup: no page */
    ck_assert_ptr_null(v.page);
    ck_assert_int_eq(rg_notice_heartbeat_age_ms(&v, 0), -1);
    ck_assert_int_eq(rg_notice_host_create(&h, 0), RG_EINVAL);
    ck_assert_int_eq(rg_notice_host_create(&h, 2000), RG_OK);
    int64_t deadline = rg_notice_now_ms() + 120000;
    rg_notice_post(&h, RG_NOTICE_KIND_PREEMPT, 7, deadline, "spot instance-action");
    snprintf(fd_s, sizeof(fd_s), "%d", h.fd);
    setenv(RG_NOTICE_ENV, fd_s, 1);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        _exit(notice_child(RG_NOTICE_KIND_PREEMPT, deadline));
    }
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child: %d", status);
    /* Malformed names are refused, naming the variable. */
    setenv(RG_NOTICE_ENV, "x3", 1);
    ck_assert_int_eq(rg_notice_view_open(&v), RG_EINVAL);
    ck_assert_ptr_nonnull(strstr(rg_last_error(), RG_NOTICE_ENV));
    int devnull = open("/dev/null", O_RDONLY);
    snprintf(fd_s, sizeof(fd_s), "%d", devnull);
    setenv(RG_NOTICE_ENV, fd_s, 1);
    ck_assert_int_eq(rg_notice_view_open(&v), RG_EINVAL);
    close(devnull);
    unsetenv(RG_NOTICE_ENV);
    rg_notice_host_destroy(&h);
    rg_notice_host_destroy(&h);   /* idempotent */
}
END_TEST

/* In place: the assignment as a worker reads it from the page, and the pipe's messages. */
START_TEST(test_notice_assign_and_pipe)
{
    rg_notice_host_t h;
    rg_notice_view_t v;
    rg_notice_assign_t a;
    char fd_s[16];
    int fds[2];
    unsigned char buf[16];
    rg_notice_msg_t msg;
    int lr;

    ck_assert_int_eq(rg_notice_host_create(&h, 2000), RG_OK);
    snprintf(fd_s, sizeof(fd_s), "%d", h.fd);
    setenv(RG_NOTICE_ENV, fd_s, 1);
    ck_assert_int_eq(rg_notice_view_open(&v), RG_OK);
    ck_assert(!rg_notice_read_assign(&v, &a));   /* none yet */
    ck_assert_int_eq(a.round, -1);
    int ranks[3] = {4, -1, 5};
    rg_notice_assign(&h, 3, 6, 1, ranks, 3, 0x7fe1a2539790c813);
    ck_assert(rg_notice_read_assign(&v, &a));
    ck_assert_int_eq(a.round, 3);
    ck_assert(a.lease == 0x7fe1a2539790c813);   /* (what the workers fence with) */
    ck_assert_int_eq(a.world, 6);
    ck_assert_int_eq(a.restarts, 1);
    ck_assert_int_eq(a.n, 3);
    ck_assert_int_eq(a.rank[0], 4);
    ck_assert_int_eq(a.rank[1], -1);
    ck_assert_int_eq(a.rank[2], 5);
    rg_notice_view_close(&v);
    unsetenv(RG_NOTICE_ENV);
    rg_notice_host_destroy(&h);

    ck_assert(!rg_notice_msg_send(RG_NOTICE_MSG_READY, 1));   /* no pipe */
    ck_assert_int_eq(pipe(fds), 0);
    snprintf(fd_s, sizeof(fd_s), "%d", fds[1]);
    setenv(RG_NOTICE_PIPE_ENV, fd_s, 1);
    ck_assert(rg_notice_msg_send(RG_NOTICE_MSG_READY, 258));
    ck_assert(rg_notice_msg_send(RG_NOTICE_MSG_RESTART, 0));
    ck_assert_int_eq(read(fds[0], buf, sizeof(buf)), 8);
    ck_assert(rg_notice_msg_decode(buf, &msg, &lr));
    ck_assert_int_eq(msg, RG_NOTICE_MSG_READY);
    ck_assert_int_eq(lr, 258);
    ck_assert(rg_notice_msg_decode(buf + 4, &msg, &lr));
    ck_assert_int_eq(msg, RG_NOTICE_MSG_RESTART);
    ck_assert_int_eq(lr, 0);
    buf[0] = 'Q';
    ck_assert(!rg_notice_msg_decode(buf, &msg, &lr));
    unsetenv(RG_NOTICE_PIPE_ENV);
    close(fds[0]);
    close(fds[1]);
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
    tcase_add_test(tc, test_notice_page);
    tcase_add_test(tc, test_notice_assign_and_pipe);
    suite_add_tcase(s, tc);
    return test_main("test_common", s, NULL);
}
