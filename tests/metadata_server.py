#!/usr/bin/python3
"""A stand-in for the clouds' instance metadata services, on a loopback port, for the tests.

    metadata_server.py PORT_FILE STATE_FILE LOG_FILE [aws|gce|azure|all]

Listens on 127.0.0.1 (a free port, written to PORT_FILE once listening) and answers in the
formats the providers document, as far as preemption notices go:

  AWS IMDSv2 (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/configuring-instance-metadata-service.html,
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html):
    PUT /latest/api/token, which requires X-aws-ec2-metadata-token-ttl-seconds (else 400),
    gives a token; GET /latest/meta-data/spot/instance-action requires it in
    X-aws-ec2-metadata-token (else 401) and answers 404 when no interruption is scheduled,
    else {"action": "terminate", "time": "2026-12-01T12:00:00Z"}.
  GCE (https://cloud.google.com/compute/docs/metadata/querying-metadata,
  https://cloud.google.com/compute/docs/instances/create-use-preemptible#detecting_if_an_instance_was_preempted):
    GET /computeMetadata/v1/instance/preempted requires Metadata-Flavor: Google (else 403)
    and answers TRUE or FALSE with a Metadata-Flavor: Google header.
  Azure Scheduled Events (https://learn.microsoft.com/en-us/azure/virtual-machines/linux/scheduled-events):
    GET /metadata/scheduledevents?api-version=2020-07-01 requires Metadata: true (else 400)
    and answers {"DocumentIncarnation": N, "Events": [...]}, a Preempt event with its
    NotBefore (RFC 1123); POST there with {"StartRequests": [{"EventId": ...}]} acknowledges
    it (logged as "ack EVENT_ID").

STATE_FILE is read at every request; its first line says what to answer:
  none        no notice (AWS 404, GCE FALSE, Azure no events)
  notice S    a notice for S seconds from now (S may be negative: already past)
  404         404 to every request
  malformed   cut-off JSON (AWS, Azure) or a word that is not TRUE/FALSE (GCE)
  hang        read the request and never answer
Every request is logged to LOG_FILE as "METHOD PATH STATUS". The last argument limits the
services answered (the others get 404), for --preemption-notice=auto.
"""
import email.utils
import http.server
import json
import sys
import threading
import time

PORT_FILE, STATE_FILE, LOG_FILE = sys.argv[1], sys.argv[2], sys.argv[3]
ONLY = sys.argv[4] if len(sys.argv) > 4 else "all"
TOKEN = "AQAEAtest-token=="
INCARNATION = [1]
LOCK = threading.Lock()


def state():
    try:
        with open(STATE_FILE) as f:
            words = f.readline().split()
    except OSError:
        words = []
    return words or ["none"]


def log(line):
    with LOCK, open(LOG_FILE, "a") as f:
        f.write(line + "\n")


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def answer(self, code, body=b"", ctype="text/plain", extra=None):
        log("%s %s %d" % (self.command, self.path, code))
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def service(self):
        p = self.path
        if p.startswith("/latest/"):
            return "aws"
        if p.startswith("/computeMetadata/"):
            return "gce"
        if p.startswith("/metadata/scheduledevents"):
            return "azure"
        return None

    def handle_any(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        st = state()
        svc = self.service()
        if st[0] == "hang":
            log("%s %s hang" % (self.command, self.path))
            time.sleep(3600)
            return
        if svc is None or (ONLY != "all" and svc != ONLY) or st[0] == "404":
            return self.answer(404, b"Not Found")
        when = time.time() + (float(st[1]) if st[0] == "notice" else 0)
        if svc == "aws":
            if self.command == "PUT" and self.path == "/latest/api/token":
                if self.headers.get("X-aws-ec2-metadata-token-ttl-seconds") is None:
                    return self.answer(400, b"Missing TTL")
                return self.answer(200, TOKEN.encode())
            if self.command == "GET" and self.path == "/latest/meta-data/spot/instance-action":
                if self.headers.get("X-aws-ec2-metadata-token") != TOKEN:
                    return self.answer(401, b"Unauthorized")
                if st[0] == "malformed":
                    return self.answer(200, b'{"action": "terminate", "time": ', "text/plain")
                if st[0] != "notice":
                    return self.answer(404, b"Not Found")
                t = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))
                return self.answer(200, json.dumps({"action": "terminate", "time": t}).encode())
            return self.answer(404, b"Not Found")
        if svc == "gce":
            if self.headers.get("Metadata-Flavor") != "Google":
                return self.answer(403, b"Missing Metadata-Flavor:Google header.")
            if self.path.split("?")[0] != "/computeMetadata/v1/instance/preempted":
                return self.answer(404, b"Not Found")
            word = {"notice": b"TRUE", "malformed": b"MAYBE"}.get(st[0], b"FALSE")
            return self.answer(200, word, extra={"Metadata-Flavor": "Google"})
        # azure
        if self.headers.get("Metadata") != "true":
            return self.answer(400, b'{"error": "Bad request. Required metadata header not specified"}')
        if not self.path.endswith("api-version=2020-07-01"):
            return self.answer(400, b'{"error": "Bad request. api-version was not specified"}')
        if self.command == "POST":
            try:
                ids = [r["EventId"] for r in json.loads(body)["StartRequests"]]
            except (ValueError, KeyError, TypeError):
                return self.answer(400, b'{"error": "bad StartRequests"}')
            for i in ids:
                log("ack %s" % i)
            return self.answer(200, b"")
        if st[0] == "malformed":
            return self.answer(200, b'{"DocumentIncarnation": 1, "Events": [', "application/json")
        events = []
        if st[0] == "notice":
            INCARNATION[0] = 2
            events.append({"EventId": "602d9444-d2cd-49c7-8624-8643e7171297",
                           "EventStatus": "Scheduled", "EventType": "Preempt",
                           "ResourceType": "VirtualMachine", "Resources": ["regroup-vm"],
                           "NotBefore": email.utils.formatdate(when, usegmt=True),
                           "Description": "", "EventSource": "Platform",
                           "DurationInSeconds": -1})
        doc = {"DocumentIncarnation": INCARNATION[0], "Events": events}
        return self.answer(200, json.dumps(doc).encode(), "application/json")

    do_GET = handle_any
    do_PUT = handle_any
    do_POST = handle_any


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


srv = Server(("127.0.0.1", 0), Handler)
with open(PORT_FILE + ".tmp", "w") as f:
    f.write("%d\n" % srv.server_address[1])
import os
os.rename(PORT_FILE + ".tmp", PORT_FILE)
srv.serve_forever()
