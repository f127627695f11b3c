/* rg-chaos's command line, read once into a chaos_opts_t (see chaos/run --help). */
#include "chaos.h"

#include <stdlib.h>
#include <string.h>

static int usage(const char *why)
{
    fprintf(stderr,
            "rg-chaos: %s\n"
            "usage: chaos/run [--seed N] [--faults N | --duration 30m] [--nodes N]\n"
            "                 [--scenario NAME|all] [--workload exact|fmnist] [--report FILE]\n"
            "                 [--quick] [--recovery restart|in-place] [--bound-scale F]\n"
            "scenarios: all", why);
    for (int k = 0; k < F_COUNT; k++) {
        fprintf(stderr, " %s", chaos_fault_names[k]);
    }
    fprintf(stderr, "\n");
    return 2;
}

static double parse_duration(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || v <= 0) {
        return -1;
    }
    if (*end == 'm') {
        v *= 60;
    } else if (*end == 'h') {
        v *= 3600;
    } else if (*end != '\0' && *end != 's') {
        return -1;
    }
    return v;
}

int chaos_opts_parse(int argc, char **argv, chaos_opts_t *o)
{
    chaos_opts_t opt = {.seed = 1, .faults = 12, .nodes = 3, .scenario = "all",
                        .recovery = "restart", .bound_scale = 1};
    opt.regroup = getenv("RG_CHAOS_REGROUP");
    opt.exact = getenv("RG_CHAOS_EXACT");
    opt.fmnist = getenv("RG_CHAOS_FMNIST");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--quick") == 0) {
            opt.quick = true;
            continue;
        }
        if (strncmp(a, "--recovery=", 11) == 0) {
            opt.recovery = a + 11;
            if (strcmp(opt.recovery, "restart") != 0 && strcmp(opt.recovery, "in-place") != 0) {
                return usage("--recovery is restart or in-place");
            }
            continue;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage("help");
            return 0;
        }
        if (v == NULL) {
            return usage("missing value");
        }
        i++;
        if (strcmp(a, "--seed") == 0) {
            opt.seed = strtoull(v, NULL, 10);
        } else if (strcmp(a, "--faults") == 0) {
            opt.faults = atoi(v);
            if (opt.faults < 1 || opt.faults > CHAOS_MAX_FAULTS) {
                return usage("--faults must be 1..2000");
            }
        } else if (strcmp(a, "--duration") == 0) {
            opt.duration_s = parse_duration(v);
            if (opt.duration_s <= 0) {
                return usage("--duration: e.g. 90s, 30m, 2h");
            }
            opt.faults = CHAOS_MAX_FAULTS;
        } else if (strcmp(a, "--nodes") == 0) {
            opt.nodes = atoi(v);
            if (opt.nodes < 2 || opt.nodes > CHAOS_MAX_NODES) {
                return usage("--nodes must be 2..8");
            }
        } else if (strcmp(a, "--scenario") == 0) {
            opt.scenario = v;
            bool known = strcmp(v, "all") == 0;
            for (int k = 0; k < F_COUNT; k++) {
                known = known || strcmp(v, chaos_fault_names[k]) == 0;
            }
            if (!known) {
                return usage("unknown scenario");
            }
        } else if (strcmp(a, "--recovery") == 0) {
            if (strcmp(v, "restart") != 0 && strcmp(v, "in-place") != 0) {
                return usage("--recovery is restart or in-place");
            }
            opt.recovery = v;
        } else if (strcmp(a, "--bound-scale") == 0) {
            char *end;
            opt.bound_scale = strtod(v, &end);
            if (end == v || *end != '\0' || !(opt.bound_scale > 0 && opt.bound_scale <= 100)) {
                return usage("--bound-scale is a factor above 0, at most 100");
            }
        } else if (strcmp(a, "--report") == 0) {
            opt.report = v;
        } else if (strcmp(a, "--workload") == 0) {
            if (strcmp(v, "exact") != 0 && strcmp(v, "fmnist") != 0) {
                return usage("--workload is exact or fmnist");
            }
            opt.use_fmnist = strcmp(v, "fmnist") == 0;
        } else {
            return usage(a);
        }
    }
    if (opt.regroup == NULL || opt.exact == NULL || (opt.use_fmnist && opt.fmnist == NULL)) {
        return usage("RG_CHAOS_REGROUP, RG_CHAOS_EXACT and RG_CHAOS_FMNIST must name the "
                     "regroup, rg-exact and rg-fmnist binaries (chaos/run sets them)");
    }
    /* Quick: every kind once, and room for the faults that keep the job within its size. */
    if (opt.quick && opt.faults < 16) {
        opt.faults = 16;
    }
    opt.deadline_s = opt.duration_s > 0 ? opt.duration_s : 480 + 60.0 * opt.faults;
    opt.min_nodes = opt.nodes > 2 ? opt.nodes - 1 : 1;
    *o = opt;
    return -1;
}
