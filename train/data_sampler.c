/*
 * The global sampler: one seeded permutation per epoch, cut into global batches, each cut
 * into contiguous per-rank shares. Everything is a function of (seed, epoch, step, rank,
 * world) and the sampler parameters, so any rank can compute any share without talking to
 * the others, and a cursor restored at another world size continues exactly where the job
 * stopped. The contract is written down in docs/data.md; changing the PRNG or the shuffle
 * changes every job's data order, so treat them as a file format.
 */
#include <regroup/data.h>

#include "rg_common.h"

#include <stdlib.h>
#include <string.h>

struct rg_sampler {
    rg_sampler_params_t params;
    uint64_t            steps_per_epoch;
    uint32_t           *perm;       /* the permutation of (perm_seed, perm_epoch) */
    bool                perm_valid;
    uint64_t            perm_seed;
    uint64_t            perm_epoch;
};

/* splitmix64 (Steele, Lea, Flood 2014; public domain reference by Vigna). */
#define SPLITMIX_GAMMA 0x9E3779B97F4A7C15ull
#define EPOCH_SALT     0xD1B54A32D192ED03ull

static uint64_t splitmix_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t splitmix_next(uint64_t *state)
{
    *state += SPLITMIX_GAMMA;
    return splitmix_mix(*state);
}

/*
 * A uniform draw from [0, range), range <= 2^32, by Lemire's multiply-and-reject on 32-bit
 * draws. A retry happens with probability < range / 2^32, so the expected number of draws is
 * below 2; the bound of 64 retries is never reached in practice (p < 2^-64 for n <= 2^31)
 * and, if it were, the last draw is used with a bias too small to matter.
 */
static uint32_t uniform_below(uint64_t *state, uint32_t range)
{
    uint64_t m = (splitmix_next(state) >> 32) * (uint64_t)range;
    uint32_t low = (uint32_t)m;
    if (low < range) {
        uint32_t threshold = (uint32_t)(-range) % range;
        for (int tries = 0; low < threshold && tries < 64; tries++) {
            m = (splitmix_next(state) >> 32) * (uint64_t)range;
            low = (uint32_t)m;
        }
    }
    return (uint32_t)(m >> 32);
}

void rg_sampler_permutation(uint64_t seed, uint64_t epoch, uint32_t *perm, size_t n)
{
    uint64_t state = splitmix_mix(seed) ^ splitmix_mix(epoch ^ EPOCH_SALT);
    if (n == 0) {
        return;
    }
    for (size_t i = 0; i < n; i++) {
        perm[i] = (uint32_t)i;
    }
    for (size_t i = n - 1; i > 0; i--) {
        uint32_t j = uniform_below(&state, (uint32_t)(i + 1));
        uint32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

rg_data_cursor_t rg_data_cursor_start(uint64_t seed)
{
    rg_data_cursor_t c = {.seed = seed, .epoch = 0, .step = 0};
    return c;
}

rg_status_t rg_sampler_create(const rg_sampler_params_t *params, rg_sampler_t **sampler_p)
{
    if (params == NULL || sampler_p == NULL) {
        return rg_error(RG_EINVAL, "rg_sampler_create: NULL argument");
    }
    if (params->num_samples == 0 || params->num_samples > RG_DATASET_MAX_RECORDS) {
        return rg_error(RG_EINVAL, "sampler: num_samples %llu is not in 1..%llu",
                        (unsigned long long)params->num_samples,
                        (unsigned long long)RG_DATASET_MAX_RECORDS);
    }
    if (params->batch_size == 0) {
        return rg_error(RG_EINVAL, "sampler: batch_size is 0");
    }
    uint64_t n = params->num_samples;
    uint64_t b = params->batch_size;
    uint64_t steps = params->drop_last ? n / b : (n + b - 1) / b;
    if (steps == 0) {
        return rg_error(RG_EINVAL, "sampler: drop_last with batch_size %llu > %llu samples "
                        "leaves no batch", (unsigned long long)b, (unsigned long long)n);
    }
    rg_sampler_t *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return rg_error(RG_ENOMEM, "no memory for a sampler");
    }
    s->perm = malloc(n * sizeof(uint32_t));
    if (s->perm == NULL) {
        free(s);
        return rg_error(RG_ENOMEM, "no memory for a permutation of %llu samples",
                        (unsigned long long)n);
    }
    s->params = *params;
    s->steps_per_epoch = steps;
    *sampler_p = s;
    return RG_OK;
}

void rg_sampler_destroy(rg_sampler_t *sampler)
{
    if (sampler == NULL) {
        return;
    }
    free(sampler->perm);
    free(sampler);
}

uint64_t rg_sampler_steps_per_epoch(const rg_sampler_t *sampler)
{
    return sampler->steps_per_epoch;
}

uint32_t rg_sampler_global_count(const rg_sampler_t *sampler, const rg_data_cursor_t *cursor)
{
    if (cursor->step >= sampler->steps_per_epoch) {
        return 0;
    }
    uint64_t start = cursor->step * sampler->params.batch_size;
    uint64_t left = sampler->params.num_samples - start;
    return (uint32_t)RG_MIN(left, (uint64_t)sampler->params.batch_size);
}

void rg_sampler_share(uint32_t len, uint32_t rank, uint32_t world, uint32_t *offset_p,
                      uint32_t *count_p)
{
    uint32_t base = len / world;
    uint32_t extra = len % world;
    *offset_p = rank * base + RG_MIN(rank, extra);
    *count_p = base + (rank < extra ? 1 : 0);
}

rg_status_t rg_sampler_ids(rg_sampler_t *sampler, const rg_data_cursor_t *cursor,
                           uint32_t rank, uint32_t world, uint32_t *ids, size_t max_ids,
                           size_t *count_p)
{
    if (world == 0 || rank >= world) {
        return rg_error(RG_EINVAL, "sampler: rank %u of world %u", rank, world);
    }
    if (cursor->step >= sampler->steps_per_epoch) {
        return rg_error(RG_EINVAL, "sampler: step %llu is past the %llu steps of an epoch",
                        (unsigned long long)cursor->step,
                        (unsigned long long)sampler->steps_per_epoch);
    }
    uint32_t len = rg_sampler_global_count(sampler, cursor);
    uint32_t offset;
    uint32_t count;
    rg_sampler_share(len, rank, world, &offset, &count);
    if (count > max_ids) {
        return rg_error(RG_ETOOBIG, "sampler: share of %u ids, room for %zu", count, max_ids);
    }
    if (!sampler->perm_valid || sampler->perm_seed != cursor->seed ||
        sampler->perm_epoch != cursor->epoch) {
        rg_sampler_permutation(cursor->seed, cursor->epoch, sampler->perm,
                               sampler->params.num_samples);
        sampler->perm_valid = true;
        sampler->perm_seed = cursor->seed;
        sampler->perm_epoch = cursor->epoch;
    }
    uint64_t start = cursor->step * sampler->params.batch_size + offset;
    memcpy(ids, sampler->perm + start, count * sizeof(uint32_t));
    *count_p = count;
    return RG_OK;
}

void rg_sampler_advance(const rg_sampler_t *sampler, rg_data_cursor_t *cursor)
{
    if (cursor->step + 1 >= sampler->steps_per_epoch) {
        cursor->epoch++;
        cursor->step = 0;
    } else {
        cursor->step++;
    }
}
