/*
 * regroup etcd client: etcd v3 over its JSON gateway (etcd 3.4+).
 *
 * One rg_etcd_t holds a list of endpoints and one reused HTTP connection. A call tries the
 * endpoint that worked last, and fails over to the next one on a connect failure, a timeout
 * or an "unavailable" answer, all within the call's deadline. A call is safe from any thread
 * (calls on one client are serialised by a mutex); a watch and a lease keeper run on their
 * own connections and threads.
 *
 * Deadlines: every call blocks until it has its answer or its rg_deadline_t passes (see
 * <regroup/deadline.h>); RG_DEADLINE_DEFAULT means the client's timeout_ms from now. A call
 * that runs out of time returns RG_ETIMEDOUT; a call on a client given a deadline already
 * passed returns it without sending a request.
 *
 * Errors: a status plus rg_last_error(), which names the endpoint and what failed:
 *   RG_EUNREACH   no endpoint could be connected to
 *   RG_ETIMEDOUT  the deadline passed
 *   RG_EAUTH      wrong user/password or token refused
 *   RG_EPERM      permission denied by etcd; the message names the key or range the refused
 *                 request touched (etcd does not say which of a txn's) and the user
 *   RG_ECOMPACTED the requested revision has been compacted
 *   RG_ELEASE     lease not found (expired or revoked)
 *   RG_ENOENT     a key (rg_etcd_get), an auth user or a role not found
 *   RG_EEXIST     an auth user or role already exists
 *   RG_EPROTO     malformed, truncated or unexpected response
 *   RG_ETOOBIG    a response over the client's size limit
 *   RG_ESERVER    etcd refused the request (HTTP 4xx/5xx with its message)
 *   RG_EINVAL     bad arguments
 *
 * Keys are C strings; values are byte strings (pointer + length). Every returned string is
 * NUL-terminated in addition to its length.
 */
#ifndef REGROUP_ETCD_H
#define REGROUP_ETCD_H

#include <regroup/deadline.h>
#include <regroup/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RG_ETCD_NODISCARD __attribute__((warn_unused_result))

typedef struct rg_etcd rg_etcd_t;

typedef struct {
    const char *endpoints;  /* "http://127.0.0.1:2379,https://h:2379"; a bare host:port gets
                               http:// (or https:// when ca_file is set). Required. */
    const char *user;       /* optional: user and password for etcd auth */
    const char *password;
    const char *ca_file;    /* optional TLS: CA bundle to verify the server */
    const char *cert_file;  /* optional TLS client certificate and key */
    const char *key_file;
    int64_t timeout_ms;     /* each call's default timeout (RG_DEADLINE_DEFAULT); 0 = 5000 */
    size_t max_response;    /* largest response body accepted; 0 = 64 MiB */
} rg_etcd_params_t;

/* Creates a client. Does not connect (the first call does). Free with rg_etcd_destroy. */
rg_status_t rg_etcd_create(const rg_etcd_params_t *params, rg_etcd_t **client_p)
    RG_ETCD_NODISCARD;
/* Closes the connection and frees the client. Accepts NULL. */
void rg_etcd_destroy(rg_etcd_t *client);
/* The endpoint the last successful call used (owned by the client, valid until destroy).
 * Never blocks. */
const char *rg_etcd_endpoint(const rg_etcd_t *client);

/* What a client, a keeper or a watch has cost etcd and this process so far: each HTTP
 * request posted (every try of a call counts, keep-alives too), the bytes of the request
 * bodies and of the answers (a watch's stream included), and the events a watch received.
 * Counters only grow; reading them never blocks and is safe from any thread. */
typedef struct {
    uint64_t requests;
    uint64_t bytes_sent;
    uint64_t bytes_received;
    uint64_t events;
} rg_etcd_stats_t;

/* Adds the client's counters to *sum (NULL client: nothing). */
void rg_etcd_stats_add(const rg_etcd_t *client, rg_etcd_stats_t *sum);

/* ---- key-value ------------------------------------------------------------------------- */

typedef struct {
    char    *key;            /* NUL-terminated */
    size_t   key_len;
    char    *value;          /* NUL-terminated; value_len may include embedded NULs */
    size_t   value_len;
    int64_t  create_revision;
    int64_t  mod_revision;
    int64_t  version;
    int64_t  lease;
} rg_etcd_kv_t;

typedef struct {
    int64_t       revision;  /* the store's revision when the call was served */
    rg_etcd_kv_t *kvs;
    size_t        n_kvs;
    bool          more;      /* more keys matched than limit returned */
    int64_t       count;     /* number of keys in the range */
} rg_etcd_range_t;

typedef struct {
    const char *key;         /* required */
    const char *range_end;   /* NULL: the single key (or the prefix, below) */
    bool        prefix;      /* every key that starts with key */
    int64_t     limit;       /* 0 = no limit */
    int64_t     revision;    /* 0 = latest */
    bool        keys_only;
    bool        count_only;
    int64_t     min_mod_revision; /* 0 = any; else only keys modified at or after it (etcd
                                     filters the keys it returns, not `count`) */
} rg_etcd_range_req_t;

/* Frees what a range result owns (not the struct). Accepts NULL. */
void rg_etcd_range_cleanup(rg_etcd_range_t *res);

/* Reads keys. On success fills *res (free with rg_etcd_range_cleanup). */
rg_status_t rg_etcd_range(rg_etcd_t *client, const rg_etcd_range_req_t *req,
                          rg_deadline_t deadline, rg_etcd_range_t *res) RG_ETCD_NODISCARD;

/* Reads one key. RG_ENOENT if absent. *value_p is malloc'd, NUL-terminated; caller frees.
 * mod_revision_p may be NULL. */
rg_status_t rg_etcd_get(rg_etcd_t *client, const char *key, rg_deadline_t deadline,
                        char **value_p, size_t *len_p, int64_t *mod_revision_p)
    RG_ETCD_NODISCARD;

typedef struct {
    const char *key;
    const void *value;
    size_t      value_len;
    int64_t     lease;       /* 0 = none */
    bool        prev_kv;     /* return the previous kv */
} rg_etcd_put_req_t;

typedef struct {
    int64_t       revision;
    bool          has_prev;
    rg_etcd_kv_t  prev;      /* when has_prev */
} rg_etcd_put_t;

/* Frees what a put result owns (not the struct). Accepts NULL. */
void rg_etcd_put_cleanup(rg_etcd_put_t *res);

/* Writes a key. res may be NULL; else on success it is filled (free with
 * rg_etcd_put_cleanup). */
rg_status_t rg_etcd_put(rg_etcd_t *client, const rg_etcd_put_req_t *req,
                        rg_deadline_t deadline, rg_etcd_put_t *res) RG_ETCD_NODISCARD;
/* Writes a NUL-terminated string value with an optional lease. Returns the revision. */
rg_status_t rg_etcd_put_str(rg_etcd_t *client, const char *key, const char *value,
                            int64_t lease, rg_deadline_t deadline, int64_t *revision_p)
    RG_ETCD_NODISCARD;

typedef struct {
    const char *key;
    const char *range_end;
    bool        prefix;
    bool        prev_kv;
} rg_etcd_delete_req_t;

typedef struct {
    int64_t       revision;
    int64_t       deleted;
    rg_etcd_kv_t *prev_kvs;
    size_t        n_prev;
} rg_etcd_delete_t;

/* Frees what a delete result owns (not the struct). Accepts NULL. */
void rg_etcd_delete_cleanup(rg_etcd_delete_t *res);

/* Deletes a key or range. res may be NULL; else on success it is filled (free with
 * rg_etcd_delete_cleanup). */
rg_status_t rg_etcd_delete(rg_etcd_t *client, const rg_etcd_delete_req_t *req,
                           rg_deadline_t deadline, rg_etcd_delete_t *res)
    RG_ETCD_NODISCARD;

/* ---- transactions ---------------------------------------------------------------------- */

typedef enum {
    RG_ETCD_CMP_VALUE,
    RG_ETCD_CMP_VERSION,
    RG_ETCD_CMP_CREATE,     /* create_revision; 0 = the key does not exist */
    RG_ETCD_CMP_MOD,        /* mod_revision */
    RG_ETCD_CMP_LEASE,
} rg_etcd_cmp_target_t;

typedef enum {
    RG_ETCD_EQUAL,
    RG_ETCD_NOT_EQUAL,
    RG_ETCD_GREATER,
    RG_ETCD_LESS,
} rg_etcd_cmp_result_t;

typedef struct {
    const char          *key;
    const char          *range_end;  /* optional */
    rg_etcd_cmp_target_t target;
    rg_etcd_cmp_result_t result;
    int64_t              number;     /* for VERSION, CREATE, MOD, LEASE */
    const void          *value;      /* for VALUE */
    size_t               value_len;
} rg_etcd_cmp_t;

typedef enum {
    RG_ETCD_OP_RANGE,
    RG_ETCD_OP_PUT,
    RG_ETCD_OP_DELETE,
} rg_etcd_op_type_t;

typedef struct {
    rg_etcd_op_type_t type;
    union {
        rg_etcd_range_req_t  range;
        rg_etcd_put_req_t    put;
        rg_etcd_delete_req_t del;
    } u;
} rg_etcd_op_t;

typedef struct {
    rg_etcd_op_type_t type;
    union {
        rg_etcd_range_t  range;
        rg_etcd_put_t    put;
        rg_etcd_delete_t del;
    } u;
} rg_etcd_op_result_t;

typedef struct {
    int64_t              revision;
    bool                 succeeded;  /* the compares held: the success branch ran */
    rg_etcd_op_result_t *results;    /* one per op of the branch that ran */
    size_t               n_results;
} rg_etcd_txn_t;

/* Frees what a transaction result owns (not the struct). Accepts NULL. */
void rg_etcd_txn_cleanup(rg_etcd_txn_t *res);

/* Runs a transaction. A failed compare is not an error: res->succeeded tells. At most 128
 * compares and 128 ops per branch (etcd's limit). res is required; on success it is filled
 * (free with rg_etcd_txn_cleanup). */
rg_status_t rg_etcd_txn(rg_etcd_t *client, const rg_etcd_cmp_t *cmps, size_t n_cmps,
                        const rg_etcd_op_t *success, size_t n_success,
                        const rg_etcd_op_t *failure, size_t n_failure,
                        rg_deadline_t deadline, rg_etcd_txn_t *res) RG_ETCD_NODISCARD;

/* ---- leases ---------------------------------------------------------------------------- */

/* Grants a lease of ttl_s seconds (etcd raises it to its minimum, 2 s by default).
 * *ttl_granted_p may be NULL. */
rg_status_t rg_etcd_lease_grant(rg_etcd_t *client, int64_t ttl_s, rg_deadline_t deadline,
                                int64_t *lease_p, int64_t *ttl_granted_p) RG_ETCD_NODISCARD;
/* Renews a lease once. RG_ELEASE if the lease has expired or does not exist. */
rg_status_t rg_etcd_lease_keepalive(rg_etcd_t *client, int64_t lease,
                                    rg_deadline_t deadline, int64_t *ttl_p)
    RG_ETCD_NODISCARD;
/* Revokes a lease: its keys are deleted at once. RG_ELEASE if it was already gone. */
rg_status_t rg_etcd_lease_revoke(rg_etcd_t *client, int64_t lease, rg_deadline_t deadline)
    RG_ETCD_NODISCARD;
/* Remaining seconds of a lease (RG_ELEASE if expired or unknown); granted_p may be NULL. */
rg_status_t rg_etcd_lease_ttl(rg_etcd_t *client, int64_t lease, rg_deadline_t deadline,
                              int64_t *ttl_p, int64_t *granted_p) RG_ETCD_NODISCARD;

/*
 * A background thread that renews a lease every ttl/3 on its own connection. When a renewal
 * finds the lease gone, or renewals keep failing until the lease must have expired, the keeper
 * marks it lost: rg_etcd_keeper_lost() turns true and the keeper's fd becomes readable.
 */
typedef struct rg_etcd_keeper rg_etcd_keeper_t;

/* Starts the keeper thread with its own client made from params; does not block (the first
 * renewal is the thread's). Free with rg_etcd_keeper_stop. */
rg_status_t rg_etcd_keeper_start(const rg_etcd_params_t *params, int64_t lease, int64_t ttl_s,
                                 rg_etcd_keeper_t **keeper_p) RG_ETCD_NODISCARD;
/* Never block; safe from any thread. */
bool rg_etcd_keeper_lost(rg_etcd_keeper_t *keeper);
int  rg_etcd_keeper_fd(rg_etcd_keeper_t *keeper);   /* readable once the lease is lost */
/* Stops the thread (within ~the client timeout). Does not revoke. Accepts NULL. */
void rg_etcd_keeper_stop(rg_etcd_keeper_t *keeper);
/* Adds the keeper's counters (its keep-alives) to *sum. Accepts NULL. */
void rg_etcd_keeper_stats_add(const rg_etcd_keeper_t *keeper, rg_etcd_stats_t *sum);

/* ---- watch ----------------------------------------------------------------------------- */

typedef enum {
    RG_ETCD_EVENT_PUT,
    RG_ETCD_EVENT_DELETE,
} rg_etcd_event_type_t;

typedef struct {
    rg_etcd_event_type_t type;
    rg_etcd_kv_t         kv;       /* for DELETE: key and mod_revision */
    bool                 has_prev;
    rg_etcd_kv_t         prev_kv;  /* when the watch asked for prev_kv */
} rg_etcd_event_t;

typedef struct {
    const char *key;
    const char *range_end;
    bool        prefix;
    int64_t     start_revision;  /* 0 = from now */
    bool        prev_kv;
} rg_etcd_watch_req_t;

typedef struct rg_etcd_watch rg_etcd_watch_t;

/*
 * Starts a watch on its own connection and thread. Blocks until etcd has confirmed it, or
 * RG_ETIMEDOUT when the deadline passes (default: params->timeout_ms). Free with
 * rg_etcd_watch_destroy. Events arrive in revision order; if the connection drops or the
 * member dies, the watch resumes from the last delivered revision + 1 on any endpoint, so no
 * event is lost or repeated. If the resume revision has been compacted, rg_etcd_watch_next
 * returns RG_ECOMPACTED (and the compact revision) and the watch is over.
 */
rg_status_t rg_etcd_watch_create(const rg_etcd_params_t *params, const rg_etcd_watch_req_t *req,
                                 rg_deadline_t deadline, rg_etcd_watch_t **watch_p)
    RG_ETCD_NODISCARD;

/*
 * Takes the next event, waiting for one until the deadline (default: the timeout_ms of the
 * params the watch was created with; RG_DEADLINE_POLL takes a queued event or returns at once).
 * RG_OK: *ev filled (free with rg_etcd_event_cleanup). RG_ETIMEDOUT: none yet.
 * RG_ECOMPACTED: the watch can no longer resume; *compact_revision_p (may be NULL) says where
 * to re-list from. Other errors are final for this watch.
 */
rg_status_t rg_etcd_watch_next(rg_etcd_watch_t *watch, rg_deadline_t deadline,
                               rg_etcd_event_t *ev, int64_t *compact_revision_p)
    RG_ETCD_NODISCARD;
/* A file descriptor that is readable while events (or a final error) are queued (owned by
 * the watch; never block). */
int  rg_etcd_watch_fd(rg_etcd_watch_t *watch);
/* The revision up to which events have been taken by rg_etcd_watch_next. Never blocks. */
int64_t rg_etcd_watch_revision(rg_etcd_watch_t *watch);
/* Frees what an event owns (not the struct). Accepts NULL. */
void rg_etcd_event_cleanup(rg_etcd_event_t *ev);
/* Closes the stream, stops the thread and frees the watch. Accepts NULL. */
void rg_etcd_watch_destroy(rg_etcd_watch_t *watch);
/* Adds the watch's counters (its (re)connects, the stream's bytes, the events it queued)
 * to *sum. Accepts NULL. */
void rg_etcd_watch_stats_add(const rg_etcd_watch_t *watch, rg_etcd_stats_t *sum);

/* Frees what a kv owns (not the struct). Accepts NULL. */
void rg_etcd_kv_cleanup(rg_etcd_kv_t *kv);

/* ---- auth administration --------------------------------------------------------------- */

typedef struct {
    const char *user;        /* the etcd user to create (or whose password to set); not root */
    const char *password;    /* its password */
    const char *role;        /* the role that holds the permission; not root */
    const char *prefix;      /* the role may read and write every key starting with it */
} rg_etcd_grant_req_t;

typedef struct {
    bool user_created;       /* false: the user existed, and its password was set */
    bool role_created;       /* false: the role existed */
    bool perm_granted;       /* false: the role held the prefix already */
    int  perms_revoked;      /* the role's other permissions, revoked */
    char other_roles[256];   /* the user's roles besides role, comma-separated (left alone) */
} rg_etcd_grant_t;

/*
 * With a client whose user holds etcd's root role (auth enabled): makes the user and role of
 * req so that role grants read and write on the keys under req->prefix and nothing else, and
 * the user holds role. Idempotent: a re-run sets the password again and leaves the same state.
 * Blocks for several calls, all within the deadline. On success fills *res. RG_EAUTH if the
 * client cannot log in (or auth is not enabled), RG_EPERM if its user is not root.
 */
rg_status_t rg_etcd_grant_prefix(rg_etcd_t *admin, const rg_etcd_grant_req_t *req,
                                 rg_deadline_t deadline, rg_etcd_grant_t *res)
    RG_ETCD_NODISCARD;

#ifdef __cplusplus
}
#endif
#endif
