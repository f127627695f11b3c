/*
 * --rdzv-backend=c10d, torchrun's default for multi-node jobs: no etcd is given; the agent on
 * the endpoint's host serves the rendezvous itself, as torchrun's agent serves its TCPStore,
 * here as a single-member etcd on the endpoint's address and port, stopped when that agent
 * ends. An agent is "on the endpoint's host" when an address the host name resolves to can be
 * bound (it is one of this host's interfaces) on that port; whoever finds the port already
 * listened on (another agent of this host got there first) only connects, and so does every
 * agent of another host. That host is then a single point of failure for the job, as with
 * torchrun; a three-member etcd (--rdzv-backend=etcd) avoids it.
 */
#ifndef REGROUP_LAUNCHER_C10D_H
#define REGROUP_LAUNCHER_C10D_H

#include "launcher.h"

#include "etcd_server.h"

/* Under c10d: if the endpoint's address is one of this host's and its port can be bound,
 * starts the single-member etcd that serves the rendezvous there (*etcd_p, else NULL: another
 * agent serves it, or another host). Writes the endpoint URL every agent uses. Blocks while
 * etcd starts. RG_OK, or an error (said on stderr) if this host should serve and cannot. */
rg_status_t launcher_c10d_serve(const rg_agent_params_t *cfg, char *endpoints, size_t cap,
                                rg_etcd_server_t **etcd_p);
/* Before the serving agent stops its etcd: waits, at most RG_AGENT_C10D_LINGER_S, until the
 * other agents have left (no lease is left), or a signal comes on sigfd. */
void launcher_c10d_linger(const rg_etcd_server_t *etcd, int sigfd);

#define RG_AGENT_C10D_LINGER_S 300  /* as torchrun's exit barrier */

#endif
