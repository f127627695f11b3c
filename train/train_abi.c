/* The layout of the public structs that bindings mirror (include/regroup/abi.h). */
#include <regroup/abi.h>
#include <regroup/comm.h>
#include <regroup/train.h>

#include <stddef.h>
#include <string.h>

#define ABI_MAX_FIELDS 16

typedef struct {
    const char *name;
    size_t      size;
    size_t      n;
    size_t      fields[ABI_MAX_FIELDS][2]; /* offset, size */
} abi_struct_t;

#define F(type, field) {offsetof(type, field), sizeof(((type *)0)->field)}

static const abi_struct_t abi_structs[] = {
    {"rg_data_cursor_t", sizeof(rg_data_cursor_t), 3,
     {F(rg_data_cursor_t, seed), F(rg_data_cursor_t, epoch), F(rg_data_cursor_t, step)}},
    {"rg_sampler_params_t", sizeof(rg_sampler_params_t), 3,
     {F(rg_sampler_params_t, num_samples), F(rg_sampler_params_t, batch_size),
      F(rg_sampler_params_t, drop_last)}},
    {"rg_ckpt_tensor_t", sizeof(rg_ckpt_tensor_t), 8,
     {F(rg_ckpt_tensor_t, name), F(rg_ckpt_tensor_t, dtype), F(rg_ckpt_tensor_t, ndim),
      F(rg_ckpt_tensor_t, shape), F(rg_ckpt_tensor_t, row_begin),
      F(rg_ckpt_tensor_t, row_count), F(rg_ckpt_tensor_t, data), F(rg_ckpt_tensor_t, flags)}},
    {"rg_ckpt_request_t", sizeof(rg_ckpt_request_t), 6,
     {F(rg_ckpt_request_t, name), F(rg_ckpt_request_t, dtype), F(rg_ckpt_request_t, row_begin),
      F(rg_ckpt_request_t, row_count), F(rg_ckpt_request_t, dst),
      F(rg_ckpt_request_t, dst_bytes)}},
    {"rg_ckpt_tensor_info_t", sizeof(rg_ckpt_tensor_info_t), 4,
     {F(rg_ckpt_tensor_info_t, dtype), F(rg_ckpt_tensor_info_t, ndim),
      F(rg_ckpt_tensor_info_t, shape), F(rg_ckpt_tensor_info_t, replicated)}},
    {"rg_metric_t", sizeof(rg_metric_t), 2, {F(rg_metric_t, name), F(rg_metric_t, value)}},
    {"rg_report_t", sizeof(rg_report_t), 4,
     {F(rg_report_t, step), F(rg_report_t, epoch), F(rg_report_t, metrics),
      F(rg_report_t, n_metrics)}},
    {"rg_train_state_t", sizeof(rg_train_state_t), 3,
     {F(rg_train_state_t, tensors), F(rg_train_state_t, n_tensors),
      F(rg_train_state_t, cursor)}},
    {"rg_train_params_t", sizeof(rg_train_params_t), 5,
     {F(rg_train_params_t, ckpt_root), F(rg_train_params_t, keep_last),
      F(rg_train_params_t, comm_timeout_ms), F(rg_train_params_t, staging_bytes),
      F(rg_train_params_t, in_place)}},
    {"rg_train_buf_t", sizeof(rg_train_buf_t), 2,
     {F(rg_train_buf_t, data), F(rg_train_buf_t, bytes)}},
    {"rg_train_regroup_t", sizeof(rg_train_regroup_t), 16,
     {F(rg_train_regroup_t, step), F(rg_train_regroup_t, bufs), F(rg_train_regroup_t, n_bufs),
      F(rg_train_regroup_t, cursor), F(rg_train_regroup_t, table),
      F(rg_train_regroup_t, extra_fn), F(rg_train_regroup_t, extra_arg),
      F(rg_train_regroup_t, rank), F(rg_train_regroup_t, world),
      F(rg_train_regroup_t, round), F(rg_train_regroup_t, step_out),
      F(rg_train_regroup_t, source), F(rg_train_regroup_t, received),
      F(rg_train_regroup_t, n_received), F(rg_train_regroup_t, extra),
      F(rg_train_regroup_t, extra_bytes)}},
    {"rg_notice_t", sizeof(rg_notice_t), 3,
     {F(rg_notice_t, kinds), F(rg_notice_t, own), F(rg_notice_t, ms_left)}},
    {"rg_comm_opts_t", sizeof(rg_comm_opts_t), 2,
     {F(rg_comm_opts_t, deadline), F(rg_comm_opts_t, mem_type)}},
};

rg_status_t rg_abi_struct_layout(const char *type, size_t *size_p, size_t *offsets,
                                 size_t *sizes, size_t max_fields, size_t *n_fields_p)
{
    if (type == NULL) {
        return rg_error(RG_ENOENT, "rg_abi_struct_layout: no type name");
    }
    for (size_t i = 0; i < sizeof(abi_structs) / sizeof(abi_structs[0]); i++) {
        const abi_struct_t *s = &abi_structs[i];
        if (strcmp(s->name, type) != 0) {
            continue;
        }
        *n_fields_p = s->n;
        if (s->n > max_fields) {
            return rg_error(RG_ETOOBIG, "rg_abi_struct_layout: %s has %zu fields, room for %zu",
                            type, s->n, max_fields);
        }
        *size_p = s->size;
        for (size_t f = 0; f < s->n; f++) {
            offsets[f] = s->fields[f][0];
            if (sizes != NULL) {
                sizes[f] = s->fields[f][1];
            }
        }
        return RG_OK;
    }
    return rg_error(RG_ENOENT, "rg_abi_struct_layout: no public struct named '%s'", type);
}
