/*
 * etcd auth administration over the JSON gateway: a user and a role that may read and write
 * exactly one key prefix (`regroup etcd-grant`, one job per user). Every call is made with the
 * client's own credential, which must hold etcd's root role.
 *
 * Each step is idempotent, so a re-run converges: the user is added, or its password set when
 * it exists; the role is added unless it exists; permissions the role holds besides the
 * prefix are revoked; the prefix is granted (granting a held permission is a no-op in etcd);
 * the role is granted to the user (the same).
 */
#include "etcd_internal.h"

#include <stdlib.h>
#include <string.h>

/* One auth call whose reply only matters as success or failure. */
static rg_status_t auth_call(rg_etcd_t *admin, const char *path, json_t *body,
                             rg_deadline_t deadline, json_t **reply_p)
{
    json_t *reply = NULL;
    rg_status_t st;

    if (body == NULL) {
        return rg_error(RG_ENOMEM, "etcd: %s request", path);
    }
    st = etcd_client_call(admin, path, body, deadline, &reply);
    json_decref(body);
    if (st == RG_OK && reply_p != NULL) {
        *reply_p = reply;
    } else {
        json_decref(reply);
    }
    return st;
}

/* {"permType":"READWRITE","key":b64(prefix),"range_end":b64(prefix + 1)} */
static json_t *prefix_perm(const char *prefix, rg_status_t *st)
{
    json_t *perm = json_pack("{s:s}", "permType", "READWRITE");

    if (perm == NULL) {
        *st = rg_error(RG_ENOMEM, "etcd: permission");
        return NULL;
    }
    *st = etcd_json_set_range(perm, prefix, NULL, true);
    if (*st != RG_OK) {
        json_decref(perm);
        return NULL;
    }
    return perm;
}

static bool same_b64(const json_t *a, const json_t *b)
{
    const char *x = json_string_value(a);
    const char *y = json_string_value(b);
    return (x == NULL || x[0] == '\0') ? (y == NULL || y[0] == '\0')
                                       : (y != NULL && strcmp(x, y) == 0);
}

/* Revokes every permission of role but the wanted one; *kept says whether that one was there
 * (READWRITE, the same key and range_end). */
static rg_status_t revoke_others(rg_etcd_t *admin, const char *role, const json_t *want,
                                 rg_deadline_t deadline, int *revoked, bool *kept)
{
    json_t *reply = NULL;
    rg_status_t st = auth_call(admin, "/v3/auth/role/get", json_pack("{s:s}", "role", role),
                               deadline, &reply);
    const json_t *perms;

    *revoked = 0;
    *kept = false;
    if (st != RG_OK) {
        return st;
    }
    perms = json_object_get(reply, "perm");
    if (perms != NULL && !json_is_array(perms)) {
        json_decref(reply);
        return rg_error(RG_EPROTO, "etcd: role %s: perm is not an array", role);
    }
    for (size_t i = 0; i < json_array_size(perms); i++) {
        const json_t *p = json_array_get(perms, i);
        const char *type = json_string_value(json_object_get(p, "permType"));
        const json_t *key = json_object_get(p, "key");
        const json_t *end = json_object_get(p, "range_end");

        if (!json_is_object(p) || !json_is_string(key)) {
            json_decref(reply);
            return rg_error(RG_EPROTO, "etcd: role %s: malformed permission", role);
        }
        /* READ is enum value 0: omitted when echoed. */
        if (type != NULL && strcmp(type, "READWRITE") == 0 &&
            same_b64(key, json_object_get(want, "key")) &&
            same_b64(end, json_object_get(want, "range_end"))) {
            *kept = true;
            continue;
        }
        json_t *rv = json_pack("{s:s, s:O}", "role", role, "key", key);
        if (rv != NULL && end != NULL) {
            json_object_set(rv, "range_end", (json_t *)end);
        }
        st = auth_call(admin, "/v3/auth/role/revoke", rv, deadline, NULL);
        if (st != RG_OK) {
            json_decref(reply);
            return rg_error_wrap(st, "etcd: revoking role %s's other permissions", role);
        }
        (*revoked)++;
    }
    json_decref(reply);
    return RG_OK;
}

/* The user's roles other than role, comma-separated into out. */
static rg_status_t other_roles(rg_etcd_t *admin, const char *user, const char *role,
                               rg_deadline_t deadline, char *out, size_t cap)
{
    json_t *reply = NULL;
    rg_status_t st = auth_call(admin, "/v3/auth/user/get", json_pack("{s:s}", "name", user),
                               deadline, &reply);
    const json_t *roles;
    size_t o = 0;

    out[0] = '\0';
    if (st != RG_OK) {
        return st;
    }
    roles = json_object_get(reply, "roles");
    for (size_t i = 0; i < json_array_size(roles); i++) {
        const char *r = json_string_value(json_array_get(roles, i));
        if (r == NULL || strcmp(r, role) == 0 || o >= cap) {
            continue;
        }
        int n = snprintf(out + o, cap - o, "%s%s", o ? "," : "", r);
        o += n > 0 ? (size_t)n : 0;
    }
    if (o >= cap && cap > 4) {
        memcpy(out + cap - 4, "...", 4);
    }
    json_decref(reply);
    return RG_OK;
}

rg_status_t rg_etcd_grant_prefix(rg_etcd_t *admin, const rg_etcd_grant_req_t *req,
                                 rg_deadline_t deadline, rg_etcd_grant_t *res)
{
    rg_etcd_grant_t out = {0};
    json_t *perm;
    bool kept = false;
    rg_status_t st;

    if (admin == NULL || req == NULL || res == NULL || req->user == NULL ||
        req->password == NULL || req->role == NULL || req->prefix == NULL ||
        req->user[0] == '\0' || req->password[0] == '\0' || req->role[0] == '\0' ||
        req->prefix[0] == '\0') {
        return rg_error(RG_EINVAL, "etcd grant: a user, password, role and prefix are needed");
    }
    if (strcmp(req->role, "root") == 0 || strcmp(req->user, "root") == 0) {
        return rg_error(RG_EINVAL, "etcd grant: root is etcd's administrator, not a job's user");
    }
    deadline = etcd_conn_deadline(&admin->conn, deadline);

    st = auth_call(admin, "/v3/auth/user/add",
                   json_pack("{s:s, s:s}", "name", req->user, "password", req->password),
                   deadline, NULL);
    if (st == RG_EEXIST) {
        st = auth_call(admin, "/v3/auth/user/changepw",
                       json_pack("{s:s, s:s}", "name", req->user, "password", req->password),
                       deadline, NULL);
    } else if (st == RG_OK) {
        out.user_created = true;
    }
    if (st != RG_OK) {
        return rg_error_wrap(st, "etcd grant: adding user %s", req->user);
    }

    st = auth_call(admin, "/v3/auth/role/add", json_pack("{s:s}", "name", req->role),
                   deadline, NULL);
    if (st == RG_OK) {
        out.role_created = true;
    } else if (st != RG_EEXIST) {
        return rg_error_wrap(st, "etcd grant: adding role %s", req->role);
    }

    perm = prefix_perm(req->prefix, &st);
    if (perm == NULL) {
        return st;
    }
    st = revoke_others(admin, req->role, perm, deadline, &out.perms_revoked, &kept);
    if (st == RG_OK && !kept) {
        st = auth_call(admin, "/v3/auth/role/grant",
                       json_pack("{s:s, s:O}", "name", req->role, "perm", perm), deadline,
                       NULL);
        out.perm_granted = st == RG_OK;
    }
    json_decref(perm);
    if (st != RG_OK) {
        return rg_error_wrap(st, "etcd grant: granting role %s %s*", req->role, req->prefix);
    }

    st = auth_call(admin, "/v3/auth/user/grant",
                   json_pack("{s:s, s:s}", "user", req->user, "role", req->role), deadline,
                   NULL);
    if (st == RG_OK) {
        st = other_roles(admin, req->user, req->role, deadline, out.other_roles,
                         sizeof(out.other_roles));
    }
    if (st != RG_OK) {
        return rg_error_wrap(st, "etcd grant: granting role %s to user %s", req->role,
                             req->user);
    }
    *res = out;
    return RG_OK;
}
