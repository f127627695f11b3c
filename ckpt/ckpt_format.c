/* Encoding and parsing of shard headers, indexes, footers, MANIFESTs and shard records. */
#include "ckpt_format.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define INDEX_HEAD_SIZE  24u
#define INDEX_CHUNK_SIZE 24u
#define TEXT_LINE_MAX    256

/* ---- header and footer ----------------------------------------------------------------- */

void ckpt_header_encode(const ckpt_header_t *h, uint8_t out[CKPT_HEADER_SIZE])
{
    memset(out, 0, CKPT_HEADER_SIZE);
    memcpy(out, CKPT_SHARD_MAGIC, 8);
    ckpt_put_u32(out + 8, CKPT_VERSION);
    ckpt_put_u32(out + 12, CKPT_HEADER_SIZE);
    ckpt_put_u64(out + 16, (uint64_t)h->step);
    ckpt_put_u32(out + 24, h->rank);
    ckpt_put_u32(out + 28, h->world_size);
    ckpt_put_u64(out + 32, h->chunk_bytes);
    ckpt_put_u32(out + 60, ckpt_crc32c(0, out, 60));
}

rg_status_t ckpt_header_parse(const uint8_t *buf, size_t len, ckpt_header_t *h)
{
    uint32_t version;

    if (len < CKPT_HEADER_SIZE) {
        return rg_error(RG_ECORRUPT, "shard header truncated (%zu bytes)", len);
    }
    if (memcmp(buf, CKPT_SHARD_MAGIC, 8) != 0) {
        return rg_error(RG_ECORRUPT, "not a regroup shard (bad magic)");
    }
    version = ckpt_get_u32(buf + 8);
    if (version != CKPT_VERSION) {
        return rg_error(RG_ECORRUPT, "shard format version %" PRIu32 " (this build reads %u)",
                        version, CKPT_VERSION);
    }
    if (ckpt_get_u32(buf + 12) != CKPT_HEADER_SIZE) {
        return rg_error(RG_ECORRUPT, "shard header size %" PRIu32 " (expected %u)",
                        ckpt_get_u32(buf + 12), CKPT_HEADER_SIZE);
    }
    if (ckpt_get_u32(buf + 60) != ckpt_crc32c(0, buf, 60)) {
        return rg_error(RG_ECORRUPT, "shard header checksum mismatch");
    }
    h->step = (int64_t)ckpt_get_u64(buf + 16);
    h->rank = ckpt_get_u32(buf + 24);
    h->world_size = ckpt_get_u32(buf + 28);
    h->chunk_bytes = ckpt_get_u64(buf + 32);
    if (h->step < 0 || h->world_size == 0 || h->world_size > RG_CKPT_MAX_WORLD ||
        h->rank >= h->world_size) {
        return rg_error(RG_ECORRUPT, "shard header out of range (step %" PRId64
                        ", rank %" PRIu32 " of %" PRIu32 ")", h->step, h->rank, h->world_size);
    }
    return RG_OK;
}

void ckpt_footer_encode(const ckpt_footer_t *f, uint8_t out[CKPT_FOOTER_SIZE])
{
    ckpt_put_u64(out, f->index_offset);
    ckpt_put_u64(out + 8, f->index_size);
    ckpt_put_u32(out + 16, f->index_crc);
    ckpt_put_u32(out + 20, CKPT_VERSION);
    memcpy(out + 24, CKPT_FOOTER_MAGIC, 8);
}

rg_status_t ckpt_footer_parse(const uint8_t *buf, size_t len, ckpt_footer_t *f)
{
    if (len != CKPT_FOOTER_SIZE || memcmp(buf + 24, CKPT_FOOTER_MAGIC, 8) != 0) {
        return rg_error(RG_ECORRUPT, "shard footer missing (truncated file?)");
    }
    if (ckpt_get_u32(buf + 20) != CKPT_VERSION) {
        return rg_error(RG_ECORRUPT, "shard footer version %" PRIu32 " (expected %u)",
                        ckpt_get_u32(buf + 20), CKPT_VERSION);
    }
    f->index_offset = ckpt_get_u64(buf);
    f->index_size = ckpt_get_u64(buf + 8);
    f->index_crc = ckpt_get_u32(buf + 16);
    if (f->index_size > CKPT_MAX_INDEX) {
        return rg_error(RG_ECORRUPT, "shard index of %" PRIu64 " bytes is over the limit",
                        f->index_size);
    }
    return RG_OK;
}

/* ---- index ----------------------------------------------------------------------------- */

rg_status_t ckpt_tensor_sizes(ckpt_tensor_meta_t *t)
{
    uint64_t row = rg_dtype_size(t->dtype);

    if (row == 0 || t->ndim < 1 || t->ndim > RG_CKPT_MAX_DIMS) {
        return rg_error(RG_EINVAL, "tensor %s: bad dtype %d or ndim %d", t->name,
                        (int)t->dtype, t->ndim);
    }
    for (int d = 1; d < t->ndim; d++) {
        if (t->shape[d] != 0 && row > UINT64_MAX / t->shape[d]) {
            return rg_error(RG_EINVAL, "tensor %s: shape overflows", t->name);
        }
        row *= t->shape[d];
    }
    if (t->row_begin > t->shape[0] || t->row_count > t->shape[0] - t->row_begin) {
        return rg_error(RG_EINVAL, "tensor %s: rows [%" PRIu64 ", +%" PRIu64 ") outside "
                        "dim 0 of size %" PRIu64, t->name, t->row_begin, t->row_count,
                        t->shape[0]);
    }
    if (row != 0 && t->row_count > (UINT64_MAX >> 1) / row) {
        return rg_error(RG_EINVAL, "tensor %s: size overflows", t->name);
    }
    t->row_bytes = row;
    t->bytes = row * t->row_count;
    return RG_OK;
}

rg_status_t ckpt_index_encode(const ckpt_index_t *idx, uint8_t **buf_p, size_t *len_p)
{
    size_t len = INDEX_HEAD_SIZE + idx->n_chunks * INDEX_CHUNK_SIZE;
    uint8_t *buf;
    uint8_t *p;

    for (size_t i = 0; i < idx->n_tensors; i++) {
        len += 2 + strlen(idx->tensors[i].name) + 4 + 8 * (size_t)idx->tensors[i].ndim + 24;
    }
    buf = malloc(len);
    if (buf == NULL) {
        return rg_error(RG_ENOMEM, "no memory for a shard index of %zu bytes", len);
    }
    p = buf;
    memcpy(p, CKPT_INDEX_MAGIC, 8);
    ckpt_put_u32(p + 8, CKPT_VERSION);
    ckpt_put_u32(p + 12, (uint32_t)idx->n_tensors);
    ckpt_put_u32(p + 16, (uint32_t)idx->n_chunks);
    ckpt_put_u32(p + 20, 0);
    p += INDEX_HEAD_SIZE;
    for (size_t i = 0; i < idx->n_tensors; i++) {
        const ckpt_tensor_meta_t *t = &idx->tensors[i];
        size_t nl = strlen(t->name);
        ckpt_put_u16(p, (uint16_t)nl);
        memcpy(p + 2, t->name, nl);
        p += 2 + nl;
        p[0] = (uint8_t)t->dtype;
        p[1] = (uint8_t)t->ndim;
        p[2] = (uint8_t)t->flags;
        p[3] = 0;
        p += 4;
        for (int d = 0; d < t->ndim; d++, p += 8) {
            ckpt_put_u64(p, t->shape[d]);
        }
        ckpt_put_u64(p, t->row_begin);
        ckpt_put_u64(p + 8, t->row_count);
        ckpt_put_u32(p + 16, t->first_chunk);
        ckpt_put_u32(p + 20, t->n_chunks);
        p += 24;
    }
    for (size_t c = 0; c < idx->n_chunks; c++, p += INDEX_CHUNK_SIZE) {
        const ckpt_chunk_meta_t *ch = &idx->chunks[c];
        ckpt_put_u64(p, ch->offset);
        ckpt_put_u32(p + 8, ch->comp_size);
        ckpt_put_u32(p + 12, ch->raw_size);
        ckpt_put_u32(p + 16, ch->crc);
        ckpt_put_u32(p + 20, 0);
    }
    *buf_p = buf;
    *len_p = len;
    return RG_OK;
}

void ckpt_index_cleanup(ckpt_index_t *idx)
{
    if (idx == NULL) {
        return;
    }
    free(idx->tensors);
    free(idx->chunks);
    memset(idx, 0, sizeof(*idx));
}

static rg_status_t index_parse_tensor(const uint8_t *buf, size_t len, size_t *pos,
                                      ckpt_tensor_meta_t *t)
{
    size_t p = *pos;
    size_t nl;
    rg_status_t st;

    if (len - p < 2) {
        goto truncated;
    }
    nl = ckpt_get_u16(buf + p);
    p += 2;
    if (nl == 0 || nl > RG_CKPT_MAX_NAME) {
        return rg_error(RG_ECORRUPT, "shard index: tensor name length %zu", nl);
    }
    if (len - p < nl + 4) {
        goto truncated;
    }
    memcpy(t->name, buf + p, nl);
    t->name[nl] = '\0';
    if (strlen(t->name) != nl) {
        return rg_error(RG_ECORRUPT, "shard index: tensor name holds a NUL byte");
    }
    p += nl;
    t->dtype = (rg_dtype_t)buf[p];
    t->ndim = buf[p + 1];
    t->flags = buf[p + 2];
    p += 4;
    if (t->ndim < 1 || t->ndim > RG_CKPT_MAX_DIMS ||
        (t->flags & ~(RG_CKPT_SHUFFLE | RG_CKPT_REPLICATED)) != 0) {
        return rg_error(RG_ECORRUPT, "shard index: tensor %s has ndim %d, flags 0x%x",
                        t->name, t->ndim, t->flags);
    }
    if (len - p < 8 * (size_t)t->ndim + 24) {
        goto truncated;
    }
    for (int d = 0; d < t->ndim; d++, p += 8) {
        t->shape[d] = ckpt_get_u64(buf + p);
    }
    t->row_begin = ckpt_get_u64(buf + p);
    t->row_count = ckpt_get_u64(buf + p + 8);
    t->first_chunk = ckpt_get_u32(buf + p + 16);
    t->n_chunks = ckpt_get_u32(buf + p + 20);
    p += 24;
    st = ckpt_tensor_sizes(t);
    if (st != RG_OK) {
        return rg_error_wrap(RG_ECORRUPT, "shard index");
    }
    if ((t->flags & RG_CKPT_REPLICATED) && (t->row_begin != 0 || t->row_count != t->shape[0])) {
        return rg_error(RG_ECORRUPT, "shard index: replicated tensor %s is a slice", t->name);
    }
    *pos = p;
    return RG_OK;
truncated:
    return rg_error(RG_ECORRUPT, "shard index truncated in a tensor entry");
}

rg_status_t ckpt_index_parse(const uint8_t *buf, size_t len, uint64_t data_begin,
                             uint64_t data_end, ckpt_index_t *idx_out)
{
    ckpt_index_t idx = {0};
    size_t pos = INDEX_HEAD_SIZE;
    size_t nt;
    size_t nc;
    uint32_t next_chunk = 0;
    rg_status_t st;

    if (len < INDEX_HEAD_SIZE || memcmp(buf, CKPT_INDEX_MAGIC, 8) != 0) {
        return rg_error(RG_ECORRUPT, "shard index missing or truncated");
    }
    if (ckpt_get_u32(buf + 8) != CKPT_VERSION) {
        return rg_error(RG_ECORRUPT, "shard index version %" PRIu32, ckpt_get_u32(buf + 8));
    }
    nt = ckpt_get_u32(buf + 12);
    nc = ckpt_get_u32(buf + 16);
    /* Each tensor entry takes at least 39 bytes: bound the counts by the length first. */
    if (nt > CKPT_MAX_TENSORS || nc > CKPT_MAX_CHUNKS || nt > len / 39 ||
        nc > (len - INDEX_HEAD_SIZE) / INDEX_CHUNK_SIZE) {
        return rg_error(RG_ECORRUPT, "shard index claims %zu tensors and %zu chunks in %zu "
                        "bytes", nt, nc, len);
    }
    idx.tensors = calloc(nt ? nt : 1, sizeof(*idx.tensors));
    idx.chunks = calloc(nc ? nc : 1, sizeof(*idx.chunks));
    if (idx.tensors == NULL || idx.chunks == NULL) {
        st = rg_error(RG_ENOMEM, "no memory for a shard index");
        goto err_free;
    }
    idx.n_tensors = nt;
    idx.n_chunks = nc;
    for (size_t i = 0; i < nt; i++) {
        ckpt_tensor_meta_t *t = &idx.tensors[i];
        st = index_parse_tensor(buf, len, &pos, t);
        if (st != RG_OK) {
            goto err_free;
        }
        if (t->first_chunk != next_chunk || t->n_chunks > nc - next_chunk ||
            (t->bytes == 0) != (t->n_chunks == 0)) {
            st = rg_error(RG_ECORRUPT, "shard index: tensor %s has chunks [%" PRIu32
                          ", +%" PRIu32 ") of %zu", t->name, t->first_chunk, t->n_chunks, nc);
            goto err_free;
        }
        next_chunk += t->n_chunks;
    }
    if (next_chunk != nc || len - pos != nc * INDEX_CHUNK_SIZE) {
        st = rg_error(RG_ECORRUPT, "shard index: %zu bytes of chunk entries for %zu chunks",
                      len - pos, nc);
        goto err_free;
    }
    for (size_t i = 0; i < nt; i++) {
        const ckpt_tensor_meta_t *t = &idx.tensors[i];
        uint64_t esize = rg_dtype_size(t->dtype);
        uint64_t raw = 0;
        for (uint32_t c = t->first_chunk; c < t->first_chunk + t->n_chunks; c++) {
            ckpt_chunk_meta_t *ch = &idx.chunks[c];
            const uint8_t *p = buf + pos + (size_t)c * INDEX_CHUNK_SIZE;
            ch->offset = ckpt_get_u64(p);
            ch->comp_size = ckpt_get_u32(p + 8);
            ch->raw_size = ckpt_get_u32(p + 12);
            ch->crc = ckpt_get_u32(p + 16);
            ch->raw_offset = raw;
            if (ch->raw_size == 0 || ch->raw_size > CKPT_MAX_CHUNK ||
                ch->raw_size % esize != 0 || ch->comp_size == 0 ||
                ch->comp_size > ch->raw_size + (ch->raw_size >> 7) + 4096 ||
                ch->offset < data_begin || ch->offset > data_end ||
                ch->comp_size > data_end - ch->offset || ch->raw_size > t->bytes - raw) {
                st = rg_error(RG_ECORRUPT, "shard index: chunk %" PRIu32 " of tensor %s is "
                              "out of range", c - t->first_chunk, t->name);
                goto err_free;
            }
            raw += ch->raw_size;
        }
        if (raw != t->bytes) {
            st = rg_error(RG_ECORRUPT, "shard index: chunks of tensor %s hold %" PRIu64
                          " bytes, not %" PRIu64, t->name, raw, t->bytes);
            goto err_free;
        }
    }
    *idx_out = idx;
    return RG_OK;
err_free:
    ckpt_index_cleanup(&idx);
    return st;
}

/* ---- text files: MANIFEST and shard records -------------------------------------------- */

/* Copies the next line (without '\n') into line; false at the end or on a bad line. */
static bool text_next_line(const char *buf, size_t len, size_t *pos, char line[TEXT_LINE_MAX])
{
    size_t p = *pos;
    size_t n = 0;

    while (p < len && buf[p] != '\n') {
        if (n + 1 >= TEXT_LINE_MAX || buf[p] == '\0') {
            return false;
        }
        line[n++] = buf[p++];
    }
    if (p >= len) {
        return false;   /* every line ends in '\n' */
    }
    line[n] = '\0';
    *pos = p + 1;
    return true;
}

/* Splits on single spaces in place; returns the number of fields, or -1 if more than max. */
static int text_fields(char *line, char **f, int max)
{
    int n = 0;
    char *s = line;

    while (true) {
        if (n == max) {
            return -1;
        }
        f[n++] = s;
        s = strchr(s, ' ');
        if (s == NULL) {
            return n;
        }
        *s++ = '\0';
    }
}

static bool text_u64(const char *s, uint64_t max, uint64_t *out)
{
    int64_t v;
    if (s[0] < '0' || s[0] > '9' || !rg_parse_i64(s, &v) || v < 0 || (uint64_t)v > max) {
        return false;
    }
    *out = (uint64_t)v;
    return true;
}

static bool text_hex32(const char *s, uint32_t *out)
{
    uint32_t v = 0;
    if (strlen(s) != 10 || s[0] != '0' || s[1] != 'x') {
        return false;
    }
    for (int i = 2; i < 10; i++) {
        char c = s[i];
        int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
        if (d < 0) {
            return false;
        }
        v = (v << 4) | (uint32_t)d;
    }
    *out = v;
    return true;
}

/* Reads "key value" with a number no larger than max. */
static bool text_key_u64(const char *buf, size_t len, size_t *pos, const char *key,
                         uint64_t max, uint64_t *out)
{
    char line[TEXT_LINE_MAX];
    char *f[3];
    return text_next_line(buf, len, pos, line) && text_fields(line, f, 3) == 2 &&
           strcmp(f[0], key) == 0 && text_u64(f[1], max, out);
}

/* The last line is "end 0x<crc32c of everything before it>" and nothing follows. */
static bool text_check_end(const char *buf, size_t len, size_t pos)
{
    char line[TEXT_LINE_MAX];
    char *f[3];
    uint32_t crc;
    size_t end_at = pos;

    return text_next_line(buf, len, &pos, line) && text_fields(line, f, 3) == 2 &&
           strcmp(f[0], "end") == 0 && text_hex32(f[1], &crc) && pos == len &&
           crc == ckpt_crc32c(0, buf, end_at);
}

static rg_status_t text_end(rg_dbuf_t *out)
{
    uint32_t crc = ckpt_crc32c(0, out->data, out->len);
    return rg_dbuf_printf(out, "end 0x%08" PRIx32 "\n", crc);
}

rg_status_t ckpt_manifest_encode(const ckpt_manifest_t *m, rg_dbuf_t *out)
{
    rg_status_t st = rg_dbuf_printf(out, "regroup-checkpoint %u\nstep %" PRId64
                                    "\nworld_size %" PRIu32 "\n", CKPT_VERSION, m->step,
                                    m->world_size);
    for (uint32_t r = 0; st == RG_OK && r < m->world_size; r++) {
        st = rg_dbuf_printf(out, "shard %" PRIu32 " %" PRIu64 " 0x%08" PRIx32 "\n", r,
                            m->shards[r].size, m->shards[r].checksum);
    }
    return st == RG_OK ? text_end(out) : st;
}

void ckpt_manifest_cleanup(ckpt_manifest_t *m)
{
    if (m != NULL) {
        free(m->shards);
        m->shards = NULL;
    }
}

rg_status_t ckpt_manifest_parse(const char *buf, size_t len, ckpt_manifest_t *m_out)
{
    ckpt_manifest_t m = {0};
    size_t pos = 0;
    uint64_t v;
    uint64_t step;
    uint64_t world;
    rg_status_t st;

    if (!text_key_u64(buf, len, &pos, "regroup-checkpoint", UINT32_MAX, &v)) {
        return rg_error(RG_ECORRUPT, "not a regroup MANIFEST");
    }
    if (v != CKPT_VERSION) {
        return rg_error(RG_ECORRUPT, "MANIFEST version %" PRIu64 " (this build reads %u)", v,
                        CKPT_VERSION);
    }
    if (!text_key_u64(buf, len, &pos, "step", INT64_MAX, &step) ||
        !text_key_u64(buf, len, &pos, "world_size", RG_CKPT_MAX_WORLD, &world) || world == 0) {
        return rg_error(RG_ECORRUPT, "MANIFEST: bad step or world_size line");
    }
    /* Each shard line takes at least 20 bytes: bound the allocation by the input. */
    if (world > len / 20 + 1) {
        return rg_error(RG_ECORRUPT, "MANIFEST: world_size %" PRIu64 " but only %zu bytes",
                        world, len);
    }
    m.step = (int64_t)step;
    m.world_size = (uint32_t)world;
    m.shards = calloc(world, sizeof(*m.shards));
    if (m.shards == NULL) {
        return rg_error(RG_ENOMEM, "no memory for a MANIFEST");
    }
    for (uint64_t r = 0; r < world; r++) {
        char line[TEXT_LINE_MAX];
        char *f[5];
        uint64_t rank;
        if (!text_next_line(buf, len, &pos, line) || text_fields(line, f, 5) != 4 ||
            strcmp(f[0], "shard") != 0 || !text_u64(f[1], world, &rank) || rank != r ||
            !text_u64(f[2], INT64_MAX, &m.shards[r].size) ||
            !text_hex32(f[3], &m.shards[r].checksum)) {
            st = rg_error(RG_ECORRUPT, "MANIFEST: bad line for shard %" PRIu64, r);
            goto err_free;
        }
    }
    if (!text_check_end(buf, len, pos)) {
        st = rg_error(RG_ECORRUPT, "MANIFEST: checksum line missing or wrong (truncated?)");
        goto err_free;
    }
    *m_out = m;
    return RG_OK;
err_free:
    ckpt_manifest_cleanup(&m);
    return st;
}

rg_status_t ckpt_record_encode(const ckpt_record_t *r, rg_dbuf_t *out)
{
    rg_status_t st = rg_dbuf_printf(out, "regroup-shard %u\nstep %" PRId64 "\nrank %" PRIu32
                                    "\nworld_size %" PRIu32 "\nattempt %" PRIu64
                                    "\nsize %" PRIu64 "\nchecksum 0x%08" PRIx32 "\n",
                                    CKPT_VERSION, r->step, r->rank, r->world_size, r->attempt,
                                    r->sum.size, r->sum.checksum);
    return st == RG_OK ? text_end(out) : st;
}

rg_status_t ckpt_record_parse(const char *buf, size_t len, ckpt_record_t *r)
{
    size_t pos = 0;
    uint64_t v;
    uint64_t step;
    uint64_t rank;
    uint64_t world;
    uint64_t size;
    char line[TEXT_LINE_MAX];
    char *f[3];
    uint32_t sum;

    if (!text_key_u64(buf, len, &pos, "regroup-shard", UINT32_MAX, &v) || v != CKPT_VERSION) {
        return rg_error(RG_ECORRUPT, "not a regroup shard record of version %u",
                        CKPT_VERSION);
    }
    if (!text_key_u64(buf, len, &pos, "step", INT64_MAX, &step) ||
        !text_key_u64(buf, len, &pos, "rank", RG_CKPT_MAX_WORLD, &rank) ||
        !text_key_u64(buf, len, &pos, "world_size", RG_CKPT_MAX_WORLD, &world)) {
        return rg_error(RG_ECORRUPT, "shard record: malformed");
    }
    /* "attempt" is optional: records written without a tag have none. */
    size_t before = pos;
    uint64_t attempt = 0;
    if (!text_key_u64(buf, len, &pos, "attempt", UINT64_MAX, &attempt)) {
        pos = before;
        attempt = 0;
    }
    if (!text_key_u64(buf, len, &pos, "size", INT64_MAX, &size) ||
        !text_next_line(buf, len, &pos, line) || text_fields(line, f, 3) != 2 ||
        strcmp(f[0], "checksum") != 0 || !text_hex32(f[1], &sum) || rank >= world) {
        return rg_error(RG_ECORRUPT, "shard record: malformed");
    }
    if (!text_check_end(buf, len, pos)) {
        return rg_error(RG_ECORRUPT, "shard record: checksum line missing or wrong");
    }
    r->step = (int64_t)step;
    r->rank = (uint32_t)rank;
    r->world_size = (uint32_t)world;
    r->attempt = attempt;
    r->sum.size = size;
    r->sum.checksum = sum;
    return RG_OK;
}
