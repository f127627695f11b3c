/* regroup: the launcher command. */
#include "launcher.h"

#include <string.h>

int main(int argc, char **argv)
{
    rg_agent_params_t p;
    rg_agent_result_t result;
    bool print_config;
    int rc;

    if (argc >= 2 && strcmp(argv[1], "status") == 0) {
        return launcher_status_main(argc - 1, argv + 1);
    }
    if (argc >= 2 && strcmp(argv[1], "etcd-grant") == 0) {
        return launcher_grant_main(argc - 1, argv + 1);
    }
    rc = launcher_parse(argc, argv, &p, &print_config);
    if (rc == 1) {
        return 0;
    }
    if (rc != 0) {
        return rc;
    }
    if (print_config) {
        rg_agent_params_print(&p, stdout);
        return 0;
    }
    /* The agent prints its own report on stderr; the exit status says how it ended:
     * 0 done, 1 failed, 128 + the signal that stopped it. */
    if (rg_agent_run(&p, &result) != RG_OK) {
        return result.exit_code;
    }
    return 0;
}
