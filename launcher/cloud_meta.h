/*
 * The clouds' instance metadata services, as far as preemption notices go: one bounded HTTP
 * request (libcurl), and the decoders of the answers (jansson), for the launcher's watcher
 * that polls them (launcher_notice.c).
 *
 * Formats, as the providers document them:
 *   AWS   IMDSv2: PUT /latest/api/token with X-aws-ec2-metadata-token-ttl-seconds gives a
 *         token; GET /latest/meta-data/spot/instance-action with X-aws-ec2-metadata-token
 *         answers 404 when no interruption is scheduled, else {"action":"terminate",
 *         "time":"2026-12-01T12:00:00Z"} (action also "stop" or "hibernate").
 *         https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html
 *         https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/configuring-instance-metadata-service.html
 *   GCE   GET /computeMetadata/v1/instance/preempted with Metadata-Flavor: Google answers TRUE
 *         or FALSE (and carries the Metadata-Flavor: Google header itself).
 *         https://cloud.google.com/compute/docs/instances/create-use-preemptible#detecting_if_an_instance_was_preempted
 *   Azure Scheduled Events: GET /metadata/scheduledevents?api-version=2020-07-01 with
 *         Metadata: true answers {"DocumentIncarnation":N,"Events":[{"EventId","EventType":
 *         "Preempt","EventStatus","NotBefore":"Tue, 01 Dec 2026 12:00:00 GMT",...}]}; POST
 *         {"StartRequests":[{"EventId":"..."}]} there acknowledges an event.
 *         https://learn.microsoft.com/en-us/azure/virtual-machines/linux/scheduled-events
 *
 * Nothing here keeps state; every call is safe from any thread.
 */
#ifndef REGROUP_CLOUD_META_H
#define REGROUP_CLOUD_META_H

#include "rg_common.h"

#include <stdatomic.h>

#define META_BODY_MAX    (64 * 1024)   /* a larger answer is refused (RG_ETOOBIG) */
#define META_HEADERS_MAX 4

typedef struct {
    const char *method;                      /* "GET", "PUT" or "POST" */
    const char *url;
    const char *headers[META_HEADERS_MAX];   /* "Name: value", unused ones NULL */
    const char *body;                        /* PUT/POST body, or NULL */
    int64_t     timeout_ms;                  /* the whole request, connect included */
    const atomic_bool *cancel;               /* when it becomes true the request ends
                                                (RG_ECANCELED); may be NULL */
} meta_req_t;

typedef struct {
    long   http;                 /* the status code */
    bool   google;               /* the answer carried Metadata-Flavor: Google */
    char  *body;                 /* NUL-terminated, malloc'd: meta_resp_cleanup */
    size_t len;
} meta_resp_t;

/* One request. RG_OK with any HTTP status (resp filled); RG_ETIMEDOUT past timeout_ms,
 * RG_EUNREACH when nothing answers, RG_ETOOBIG past META_BODY_MAX, RG_ECANCELED, each with a
 * message naming the URL. Blocks up to timeout_ms. */
rg_status_t meta_http(const meta_req_t *req, meta_resp_t *resp) RG_NODISCARD;
void        meta_resp_cleanup(meta_resp_t *resp);   /* accepts a zeroed one */

/* AWS instance-action: the action (into action[cap]) and the time in wall seconds. */
rg_status_t meta_aws_action_decode(const char *v, size_t len, char *action, size_t cap,
                                   double *time) RG_NODISCARD;
/* GCE instance/preempted: TRUE or FALSE (a trailing newline allowed). */
rg_status_t meta_gce_preempted_decode(const char *v, size_t len, bool *preempted)
    RG_NODISCARD;

typedef struct {
    int64_t incarnation;          /* DocumentIncarnation */
    bool    found;                /* a Preempt (or Terminate) event is scheduled */
    char    event_id[128];
    char    type[32];             /* "Preempt" or "Terminate" */
    double  not_before;           /* wall seconds; 0 when NotBefore is "" (started) */
} meta_azure_t;

/* Azure scheduled events: the first Preempt or Terminate event, if any. */
rg_status_t meta_azure_decode(const char *v, size_t len, meta_azure_t *out) RG_NODISCARD;
/* The body that acknowledges event_id (StartRequests), malloc'd into *text_p. */
rg_status_t meta_azure_ack_body(const char *event_id, char **text_p) RG_NODISCARD;

/* "2026-12-01T12:00:00Z" (fractions of a second allowed) and "Tue, 01 Dec 2026 12:00:00 GMT"
 * as wall seconds; false if the text is not one. */
bool meta_time_iso8601(const char *s, double *t);
bool meta_time_rfc1123(const char *s, double *t);

#endif
