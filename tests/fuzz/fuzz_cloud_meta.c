/*
 * libFuzzer target for the decoders of the clouds' metadata answers (launcher/cloud_meta.h):
 * each input goes through every decoder, as an answer of a metadata service would.
 * scripts/fuzz.sh builds and runs it from the answers in tests/data/meta/.
 * A decoder must return RG_OK or RG_EPROTO, never crash, leak or read past the input.
 */
#include "cloud_meta.h"

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
    char action[32];
    double t;
    bool b;
    meta_azure_t a;

    if (v == NULL) {
        return 0;
    }
    memcpy(v, data, size);
    check(meta_aws_action_decode(v, size, action, sizeof(action), &t));
    check(meta_gce_preempted_decode(v, size, &b));
    check(meta_azure_decode(v, size, &a));
    free(v);
    /* the time parsers take NUL-terminated text */
    char *s = malloc(size + 1);
    if (s != NULL) {
        memcpy(s, data, size);
        s[size] = '\0';
        (void)meta_time_iso8601(s, &t);
        (void)meta_time_rfc1123(s, &t);
        free(s);
    }
    return 0;
}
