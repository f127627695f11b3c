/* `regroup status --rdzv-endpoint=... --rdzv-id=JOB [--rdzv-conf=...]` */
#include "launcher.h"

#include <string.h>

int launcher_status_main(int argc, char **argv)
{
    const char *endpoint = NULL;
    const char *job = NULL;
    static rg_agent_params_t cfg; /* only its --rdzv-conf fields */

    rg_agent_params_init(&cfg);

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v;
        char name[64];
        if (launcher_sub_arg("regroup status", argc, argv, &i, name, sizeof(name), &v) != 0) {
            return 2;
        }
        if (strcmp(name, "--rdzv-endpoint") == 0 && v) {
            endpoint = v;
        } else if (strcmp(name, "--rdzv-id") == 0 && v) {
            job = v;
        } else if (strcmp(name, "--rdzv-conf") == 0 && v) {
            if (launcher_parse_rdzv_conf(&cfg, v) != 0) {
                return 2;
            }
        } else if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) {
            printf("usage: regroup status --rdzv-endpoint=HOST:PORT[,...] --rdzv-id=JOB "
                   "[--rdzv-conf=user=U,password_file=F,cacert=F,cert=F,key=F]\n");
            return 0;
        } else {
            fprintf(stderr, "regroup status: %s: unknown option or missing value\n", a);
            return 2;
        }
    }
    if (endpoint == NULL || job == NULL) {
        fprintf(stderr, "regroup status: --rdzv-endpoint and --rdzv-id are required\n");
        return 2;
    }
    rg_etcd_params_t p = launcher_etcd_params(&cfg, endpoint);
    rg_status_t st = rg_rdzv_status_print(&p, job, stdout);
    if (st != RG_OK) {
        if (st != RG_ENOENT) {
            fprintf(stderr, "regroup status: %s\n", rg_last_error());
        }
        return 1;
    }
    return 0;
}
