/* The table of a failed job's worker failures, printed by the agent at the end. */
#include "rdzv_internal.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

static void print_tail(FILE *out, const char *tail)
{
    if (tail == NULL || tail[0] == '\0') {
        return;
    }
    fprintf(out, "        last stderr lines:\n");
    for (const char *p = tail; *p;) {
        const char *nl = strchr(p, '\n');
        int len = nl ? (int)(nl - p) : (int)strlen(p);
        fprintf(out, "          | %.*s\n", len, p);
        p += len + (nl ? 1 : 0);
    }
}

void rg_rdzv_print_failures(rg_rdzv_t *z, FILE *out)
{
    char key[RDZV_KEY_MAX];
    rg_etcd_range_t r;
    rg_etcd_range_req_t rq = {.key = key, .prefix = true};

    if (rdzv_keys_failures_prefix(&z->keys, key, sizeof(key)) != RG_OK ||
        rg_etcd_range(z->etcd, &rq, 0, &r) != RG_OK) {
        fprintf(out, "regroup: cannot read the failures from etcd: %s\n", rg_last_error());
        return;
    }
    fprintf(out, "regroup: job %s failed; %zu worker failure(s):\n", z->job, r.n_kvs);
    fprintf(out, "  %-5s %-5s %-32s %-12s %-20s %s\n", "round", "rank", "node", "exit",
            "time", "error");
    for (size_t i = 0; i < r.n_kvs; i++) {
        rdzv_failure_rec_t f;
        char exitbuf[32];
        char when[32];
        struct tm tm;

        if (rdzv_rec_failure_decode(r.kvs[i].value, r.kvs[i].value_len, &f) != RG_OK) {
            fprintf(out, "  %s: %s\n", r.kvs[i].key, rg_last_error());
            continue;
        }
        if (f.signal > 0 && sigabbrev_np(f.signal) != NULL) {
            snprintf(exitbuf, sizeof(exitbuf), "SIG%s", sigabbrev_np(f.signal));
        } else if (f.signal > 0) {
            snprintf(exitbuf, sizeof(exitbuf), "?");
        } else {
            snprintf(exitbuf, sizeof(exitbuf), "exit %d", f.exit_code);
        }
        time_t t = (time_t)f.time;
        gmtime_r(&t, &tm);
        strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
        fprintf(out, "  %-5d %-5d %-32s %-12s %-20s %s\n", f.round, f.rank,
                f.addr[0] ? f.addr : "?", exitbuf, when, f.error[0] ? f.error : "-");
        print_tail(out, f.stderr_tail);
        rdzv_rec_failure_cleanup(&f);
    }
    rg_etcd_range_cleanup(&r);
}
