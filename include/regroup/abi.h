/*
 * regroup ABI facts, for bindings that mirror the public structs in another language (the
 * Python package in python/regroup/ does, through ctypes).
 *
 * A binding declares its own copy of a struct's fields; these calls let it check the copy
 * against the library it loaded, so that a struct changed in a header and not in the binding
 * is an error at load time instead of memory written at the wrong offsets.
 */
#ifndef REGROUP_ABI_H
#define REGROUP_ABI_H

#include <regroup/status.h>

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The layout of the public struct typedef named `type` ("rg_ckpt_tensor_t"): its size into
 * *size_p, and the offset and size of each of its fields, in declaration order, into
 * offsets[0..*n_fields_p) and sizes[0..*n_fields_p) (sizes may be NULL; an array field's
 * size is the whole array's). The structs known are those a binding passes by value or by
 * pointer: rg_data_cursor_t, rg_sampler_params_t, rg_ckpt_tensor_t, rg_ckpt_request_t,
 * rg_metric_t, rg_report_t, rg_train_state_t, rg_train_params_t and rg_comm_opts_t.
 * Returns RG_ENOENT for another name (or NULL), RG_ETOOBIG when the struct has more than
 * max_fields fields (*n_fields_p then says how many). Never blocks; thread-safe.
 */
rg_status_t rg_abi_struct_layout(const char *type, size_t *size_p, size_t *offsets,
                                 size_t *sizes, size_t max_fields, size_t *n_fields_p)
    __attribute__((warn_unused_result));

#ifdef __cplusplus
}
#endif
#endif
