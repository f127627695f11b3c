/*
 * libFuzzer target for the decoders of a job's etcd records (rendezvous/rdzv_keys.h): each
 * input goes through every decoder, as a value read from etcd would. scripts/fuzz.sh builds
 * and runs it from the golden records in tests/data/rdzv/.
 * A decoder must return RG_OK or RG_EPROTO, never crash, leak or read past the input.
 */
#include "rdzv_keys.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void check(rg_status_t st)
{
    if (st != RG_OK && st != RG_EPROTO) {
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A copy of exactly size bytes, no NUL after it: ASan sees any read past the end. */
    char *v = malloc(size ? size : 1);
    static rg_rdzv_assignment_t a;
    static rdzv_progress_rec_t p;
    rdzv_node_rec_t n;
    rg_rdzv_member_t m;
    rdzv_failure_rec_t f;
    rdzv_restored_rec_t r;
    rdzv_leaving_rec_t l;
    int64_t x;

    if (v == NULL) {
        return 0;
    }
    memcpy(v, data, size);
    check(rdzv_rec_round_decode(v, size, &x));
    check(rdzv_rec_ckpt_latest_decode(v, size, &x));
    check(rdzv_rec_node_decode(v, size, &n));
    check(rdzv_rec_waiting_decode(v, size, &m));
    if (rdzv_rec_closed_decode(v, size, 1, &a) == RG_OK) {
        rdzv_assignment_locate(&a, a.members[a.n_members - 1].agent);
        (void)rdzv_assignment_find_pid(&a, NULL, 1);
    }
    if (rdzv_rec_failure_decode(v, size, &f) == RG_OK) {
        if (strlen(f.error) + strlen(f.stderr_tail) > size) {
            abort();
        }
        rdzv_rec_failure_cleanup(&f);
    }
    check(rdzv_rec_progress_decode(v, size, &p));
    check(rdzv_rec_restored_decode(v, size, &r));
    check(rdzv_rec_leaving_decode(v, size, &l));
    free(v);
    return 0;
}
