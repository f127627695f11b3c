/*
 * The regroup command under srun, without Slurm: the test sets the variables srun gives a
 * job step's tasks and runs `regroup --print-config` (and one job against a real etcd) to
 * check which settings come from Slurm, with what value and source, what beats them, and
 * that a malformed value is an error naming its variable. tests/test_slurm.sh runs the same
 * under a real Slurm.
 */
#include "test_util.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

static char dir[256];

/* No SLURM_* or REGROUP_* variable of the test's own environment leaks into a case. */
static void clear_env(void)
{
    for (;;) {
        char name[256];
        bool found = false;
        for (char **e = environ; *e != NULL; e++) {
            const char *eq = strchr(*e, '=');
            if (eq != NULL &&
                (strncmp(*e, "SLURM", 5) == 0 || strncmp(*e, "REGROUP_", 8) == 0 ||
                 strncmp(*e, "PET_", 4) == 0) &&
                (size_t)(eq - *e) < sizeof(name)) {
                snprintf(name, sizeof(name), "%.*s", (int)(eq - *e), *e);
                found = true;
                break;
            }
        }
        if (!found) {
            return;
        }
        unsetenv(name);
    }
}

static void up(void)
{
    clear_env();
    test_tmpdir(dir, sizeof(dir), "slurm");
}

static void down(void)
{
    test_rmtree(dir);
}

/* What srun gives each task of `srun -N NODES --ntasks-per-node=1` in job 4242. */
static void set_srun_env(const char *nodes)
{
    setenv("SLURM_JOB_ID", "4242", 1);
    setenv("SLURM_JOBID", "4242", 1);
    setenv("SLURM_STEP_ID", "0", 1);
    setenv("SLURM_PROCID", "0", 1);
    setenv("SLURM_NNODES", nodes, 1);
    setenv("SLURM_JOB_NUM_NODES", nodes, 1);
    setenv("SLURM_STEP_NUM_NODES", nodes, 1);
    setenv("SLURM_STEP_NUM_TASKS", nodes, 1);
    setenv("SLURMD_NODENAME", "localhost", 1);
}

/* Runs `regroup ARGS` (split on spaces) to its end with stdout and stderr into out. */
static int run_cmd(const char *args, char *out, size_t cap)
{
    static int runs;
    char buf[1024];
    char log[300];
    char *argv[16];
    char *save = NULL;
    int n = 0;

    argv[n++] = REGROUP_BIN;
    snprintf(buf, sizeof(buf), "%s", args);
    for (char *tok = strtok_r(buf, " ", &save); tok != NULL && n < 15;
         tok = strtok_r(NULL, " ", &save)) {
        argv[n++] = tok;
    }
    argv[n] = NULL;
    snprintf(log, sizeof(log), "%s/regroup-%d.log", dir, runs++);
    return test_run_output(argv, log, 30000, out, cap);
}

/* --print-config has the row setting / value / from. */
static void assert_row(const char *out, const char *key, const char *value, const char *from)
{
    char want[256];
    snprintf(want, sizeof(want), "%-20s %-40s %s\n", key, value, from);
    ck_assert_msg(strstr(out, want) != NULL, "no row '%s' in:\n%s", want, out);
}

static void assert_says(const char *out, const char *text)
{
    ck_assert_msg(strstr(out, text) != NULL, "'%s' not in:\n%s", text, out);
}

START_TEST(test_srun_gives_job_id_node_count_and_node_name)
{
    char out[4096];
    set_srun_env("3");
    ck_assert_int_eq(run_cmd("--print-config --rdzv-endpoint=etcd1:2379", out, sizeof(out)), 0);
    assert_row(out, "rdzv_id", "4242", "SLURM_JOB_ID");
    assert_row(out, "nnodes", "3:3", "SLURM_STEP_NUM_NODES");
    assert_row(out, "local_addr", "localhost", "SLURMD_NODENAME");
    assert_row(out, "nproc_per_node", "1", "default");
    /* A Slurm without SLURM_STEP_NUM_NODES: SLURM_NNODES, which srun sets to the step's. */
    unsetenv("SLURM_STEP_NUM_NODES");
    ck_assert_int_eq(run_cmd("--print-config --rdzv-endpoint=etcd1:2379", out, sizeof(out)), 0);
    assert_row(out, "nnodes", "3:3", "SLURM_NNODES");
}
END_TEST

/* Flag over REGROUP_* variable over Slurm's variable over default. */
START_TEST(test_flags_and_regroup_variables_beat_slurm)
{
    char out[4096];
    set_srun_env("4");
    setenv("REGROUP_RDZV_ID", "mine", 1);
    setenv("REGROUP_NNODES", "2:4", 1);
    ck_assert_int_eq(run_cmd("--print-config --rdzv-endpoint=etcd1:2379 --local-addr=10.0.0.7",
                             out, sizeof(out)), 0);
    assert_row(out, "rdzv_id", "mine", "REGROUP_RDZV_ID");
    assert_row(out, "nnodes", "2:4", "REGROUP_NNODES");
    assert_row(out, "local_addr", "10.0.0.7", "flag");
    ck_assert_int_eq(run_cmd("--print-config --rdzv-endpoint=e:1 --rdzv-id=job7 --nnodes=1:4",
                             out, sizeof(out)), 0);
    assert_row(out, "rdzv_id", "job7", "flag");
    assert_row(out, "nnodes", "1:4", "flag");
    /* A value given otherwise is not read: a malformed one is no error then. */
    setenv("SLURM_JOB_ID", "not-a-number", 1);
    setenv("SLURM_STEP_NUM_NODES", "x", 1);
    ck_assert_int_eq(run_cmd("--print-config --rdzv-endpoint=e:1", out, sizeof(out)), 0);
    assert_row(out, "rdzv_id", "mine", "REGROUP_RDZV_ID");
}
END_TEST

/* torchrun's PET_* variables are the user's too: they beat Slurm's defaults. */
START_TEST(test_pet_variables_beat_slurm)
{
    char out[4096];
    set_srun_env("3");
    setenv("PET_NNODES", "2:3", 1);
    setenv("PET_RDZV_ID", "petjob", 1);
    ck_assert_int_eq(run_cmd("--print-config --rdzv-endpoint=etcd1:2379", out, sizeof(out)), 0);
    assert_row(out, "nnodes", "2:3", "PET_NNODES");
    assert_row(out, "rdzv_id", "petjob", "PET_RDZV_ID");
}
END_TEST

/* A batch script (SLURM_JOB_ID, SLURM_PROCID=0, no SLURM_STEP_ID) runs on the first node
 * only, and an salloc shell on none of the job's: neither is under srun. */
START_TEST(test_batch_script_is_not_under_srun)
{
    char out[4096];
    set_srun_env("2");
    unsetenv("SLURM_STEP_ID");
    unsetenv("SLURM_STEP_NUM_NODES");
    unsetenv("SLURM_STEP_NUM_TASKS");
    ck_assert_int_eq(run_cmd("--print-config --rdzv-endpoint=etcd1:2379", out, sizeof(out)), 0);
    assert_row(out, "rdzv_id", "none", "default");
    assert_row(out, "nnodes", "1:1", "default");
    assert_row(out, "local_addr", "(auto)", "default");
}
END_TEST

/* --standalone is one node: of Slurm's values only the job id applies. */
START_TEST(test_standalone_under_srun_takes_the_job_id_only)
{
    char out[4096];
    set_srun_env("2");
    ck_assert_int_eq(run_cmd("--print-config --standalone", out, sizeof(out)), 0);
    assert_row(out, "rdzv_id", "4242", "SLURM_JOB_ID");
    assert_row(out, "nnodes", "1:1", "default");
    assert_row(out, "local_addr", "(auto)", "default");
    ck_assert_int_eq(run_cmd("--standalone /bin/true", out, sizeof(out)), 0);
}
END_TEST

/* A node name that does not resolve (RFC 2606's .invalid never does) is not used, and said. */
START_TEST(test_node_name_that_does_not_resolve)
{
    char out[4096];
    set_srun_env("2");
    setenv("SLURMD_NODENAME", "node17.invalid", 1);
    ck_assert_int_eq(run_cmd("--print-config --rdzv-endpoint=etcd1:2379", out, sizeof(out)), 0);
    assert_row(out, "local_addr", "(auto)", "default");
    assert_says(out, "regroup: SLURMD_NODENAME=node17.invalid does not resolve");
    assert_says(out, "give --local-addr");
    setenv("SLURMD_NODENAME", "no/such node", 1);
    ck_assert_int_eq(run_cmd("--print-config --rdzv-endpoint=etcd1:2379", out, sizeof(out)), 0);
    assert_row(out, "local_addr", "(auto)", "default");
    assert_says(out, "regroup: SLURMD_NODENAME=no/such node is not a host name");
}
END_TEST

/* One malformed variable at a time: exit 2 and one line naming it. */
static void assert_bad2(const char *var, const char *value, const char *var2,
                        const char *value2, const char *expect)
{
    char out[4096];
    set_srun_env("2");
    setenv(var, value, 1);
    if (var2 != NULL) {
        setenv(var2, value2, 1);
    }
    ck_assert_int_eq(run_cmd("--rdzv-endpoint=etcd1:2379 /bin/true", out, sizeof(out)), 2);
    assert_says(out, expect);
    ck_assert_msg(strchr(out, '\n') == out + strlen(out) - 1, "one line: %s", out);
}

static void assert_bad(const char *var, const char *value, const char *expect)
{
    assert_bad2(var, value, NULL, NULL, expect);
}

START_TEST(test_malformed_slurm_values_name_the_variable)
{
    assert_bad("SLURM_JOB_ID", "12x", "regroup: SLURM_JOB_ID=12x: expected Slurm's job id");
    assert_bad("SLURM_JOB_ID", "0", "regroup: SLURM_JOB_ID=0: expected Slurm's job id");
    assert_bad("SLURM_JOB_ID", "99999999999", "SLURM_JOB_ID=99999999999: expected");
    assert_bad("SLURM_STEP_ID", "-1", "regroup: SLURM_STEP_ID=-1: expected Slurm's step id");
    assert_bad("SLURM_STEP_NUM_NODES", "two",
               "regroup: SLURM_STEP_NUM_NODES=two: expected Slurm's node count");
    assert_bad("SLURM_STEP_NUM_NODES", "0",
               "regroup: SLURM_STEP_NUM_NODES=0: expected Slurm's node count");
    /* Past 4096 nodes: rg_agent_params_check's, which names the variable as well. */
    assert_bad2("SLURM_STEP_NUM_NODES", "5000", "SLURM_STEP_NUM_TASKS", "5000",
                "regroup: SLURM_STEP_NUM_NODES=5000: expected N or MIN:MAX with 1 <= N <= "
                "4096");
    assert_bad("SLURM_STEP_NUM_TASKS", "4x", "regroup: SLURM_STEP_NUM_TASKS=4x: expected");
    /* Several agents a node: srun --ntasks-per-node=1 is wanted. */
    assert_bad("SLURM_STEP_NUM_TASKS", "16", "srun started 16 tasks on 2 nodes");
    assert_bad("SLURM_STEP_NUM_TASKS", "16", "srun --ntasks-per-node=1");
}
END_TEST

/* A whole job under the srun variables: the workers' TORCHELASTIC_RUN_ID is the job id, and
 * the node's name is their MASTER_ADDR and REGROUP_NODE_ADDR. */
START_TEST(test_job_under_srun_variables)
{
    test_etcd_t etcd;
    char ep[600];
    char cmd[600];
    char events[300];
    char log[300];
    char line[512];
    bool seen[2] = {false, false};
    int n = 0;

    test_etcd_up(&etcd, NULL);
    set_srun_env("1");
    snprintf(events, sizeof(events), "%s/events", dir);
    snprintf(log, sizeof(log), "%s/job.log", dir);
    snprintf(ep, sizeof(ep), "--rdzv-endpoint=%s", etcd.srv.endpoints);
    snprintf(cmd, sizeof(cmd),
             "echo \"$RANK $WORLD_SIZE $TORCHELASTIC_RUN_ID $MASTER_ADDR $REGROUP_NODE_ADDR\" "
             ">> %s", events);
    char *argv[] = {REGROUP_BIN, "--nproc-per-node=2", ep, "--rdzv-conf=last_call_timeout=0.1",
                    "/bin/sh", "-c", cmd, NULL};
    ck_assert_int_eq(test_run(argv, log, 60000), 0);

    FILE *f = fopen(events, "r");
    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof(line), f) != NULL) {
        int rank = -1;
        int world = -1;
        char run_id[64] = "";
        char master[64] = "";
        char node[64] = "";
        ck_assert_int_eq(sscanf(line, "%d %d %63s %63s %63s", &rank, &world, run_id, master,
                                node), 5);
        ck_assert_msg(rank == 0 || rank == 1, "%s", line);
        ck_assert_int_eq(world, 2);
        ck_assert_str_eq(run_id, "4242");
        ck_assert_str_eq(master, "localhost");
        ck_assert_str_eq(node, "localhost");
        seen[rank] = true;
        n++;
    }
    fclose(f);
    ck_assert_int_eq(n, 2);
    ck_assert(seen[0] && seen[1]);
    test_etcd_down(&etcd);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("launcher_slurm");
    TCase *tc = tcase_create("srun");
    tcase_add_checked_fixture(tc, up, down);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_srun_gives_job_id_node_count_and_node_name);
    tcase_add_test(tc, test_flags_and_regroup_variables_beat_slurm);
    tcase_add_test(tc, test_pet_variables_beat_slurm);
    tcase_add_test(tc, test_batch_script_is_not_under_srun);
    tcase_add_test(tc, test_standalone_under_srun_takes_the_job_id_only);
    tcase_add_test(tc, test_node_name_that_does_not_resolve);
    tcase_add_test(tc, test_malformed_slurm_values_name_the_variable);
    tcase_add_test(tc, test_job_under_srun_variables);
    suite_add_tcase(s, tc);
    return test_main("test_launcher_slurm", s, NULL);
}
