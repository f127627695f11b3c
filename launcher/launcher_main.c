/* regroup: the launcher command. */
#include "launcher.h"

#include <string.h>

int main(int argc, char **argv)
{
    launcher_config_t cfg;
    int rc;

    if (argc >= 2 && strcmp(argv[1], "status") == 0) {
        return launcher_status_main(argc - 1, argv + 1);
    }
    rc = launcher_parse(argc, argv, &cfg);
    if (rc == 1) {
        return 0;
    }
    if (rc != 0) {
        return rc;
    }
    if (cfg.print_config) {
        launcher_print_config(&cfg, stdout);
        return 0;
    }
    return launcher_agent_main(&cfg);
}
