/*
 * `regroup etcd-grant`: from an etcd administrator's credential, the etcd user and role of one
 * job, the role granting read and write on the job's keys (/regroup/<job>/) and nothing else.
 * Every key regroup writes for a job (the rendezvous, failures, status, the checkpoint commit,
 * the workers' wire-up) lies under that prefix (rendezvous/rdzv_keys.h); leases need no
 * permission in etcd.
 *
 * Passwords are read from files, never from the command line (which every user of the node can
 * read in /proc): launcher_read_secret() refuses a file that other users may read or write.
 */
#include "launcher.h"

#include "rdzv_keys.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SECRET_FILE_MAX 4096

int launcher_read_secret(const char *path, const char *what, char *buf, size_t cap)
{
    char data[SECRET_FILE_MAX + 1];
    struct stat sb;
    size_t n = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);

    if (fd < 0) {
        fprintf(stderr, "regroup: %s %s: %s\n", what, path, strerror(errno));
        return 2;
    }
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fprintf(stderr, "regroup: %s %s: not a regular file\n", what, path);
        close(fd);
        return 2;
    }
    if ((sb.st_mode & (S_IROTH | S_IWOTH)) != 0) {
        /* Like ssh with a private key: a secret every user can read is no secret. */
        fprintf(stderr, "regroup: %s %s: other users may %s it (mode %04o); "
                "chmod o-rw %s\n", what, path,
                (sb.st_mode & S_IROTH) ? "read" : "write", (unsigned)(sb.st_mode & 07777),
                path);
        close(fd);
        return 2;
    }
    for (;;) {
        ssize_t r = read(fd, data + n, sizeof(data) - 1 - n);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0) {
            fprintf(stderr, "regroup: %s %s: %s\n", what, path, strerror(errno));
            close(fd);
            return 2;
        }
        if (r == 0 || (n += (size_t)r) == sizeof(data) - 1) {
            break;
        }
    }
    close(fd);
    /* One line: the password, with or without its newline. */
    if (n > 0 && data[n - 1] == '\n') {
        n--;
        if (n > 0 && data[n - 1] == '\r') {
            n--;
        }
    }
    if (n == 0 || memchr(data, '\n', n) != NULL || memchr(data, '\0', n) != NULL) {
        fprintf(stderr, "regroup: %s %s: expected one line holding the password\n", what,
                path);
        return 2;
    }
    if (n >= cap) {
        fprintf(stderr, "regroup: %s %s: the password is longer than %zu bytes\n", what, path,
                cap - 1);
        return 2;
    }
    memcpy(buf, data, n);
    buf[n] = '\0';
    return 0;
}

static void grant_usage(FILE *out)
{
    fprintf(out,
"usage: regroup etcd-grant --rdzv-endpoint=H:P[,...] --rdzv-id=JOB --password-file=F\n"
"                          --admin-password-file=F [--user=NAME] [--admin-user=root]\n"
"                          [--rdzv-conf=cacert=F,cert=F,key=F]\n"
"\n"
"Creates (or updates) the etcd user of job JOB and the role regroup-JOB, which may read and\n"
"write the job's keys /regroup/JOB/ and nothing else, and grants the role to the user; run\n"
"it as an etcd administrator (a user with etcd's root role, auth enabled). Running it again\n"
"sets the password from the file again and revokes whatever else the role was given.\n"
"\n"
"  --rdzv-endpoint=H:P[,...] the etcd endpoints, as the job's agents are given them\n"
"  --rdzv-id=JOB             the job (--job-id is accepted too)\n"
"  --user=NAME               the job's etcd user (default regroup-JOB)\n"
"  --password-file=F         the job user's password: the file's one line\n"
"  --admin-user=NAME         the administrator (default root)\n"
"  --admin-password-file=F   the administrator's password: the file's one line\n"
"  --rdzv-conf=...           TLS files to reach etcd: cacert, cert, key\n"
"\n"
"Password files must not be readable or writable by other users (chmod o-rw). The job then\n"
"runs with --rdzv-conf=user=NAME,password_file=F (and the same TLS files).\n");
}

int launcher_grant_main(int argc, char **argv)
{
    const char *endpoint = NULL;
    const char *job = NULL;
    const char *user = NULL;
    const char *pw_file = NULL;
    const char *admin = "root";
    const char *admin_pw_file = NULL;
    static rg_agent_params_t cfg; /* only its --rdzv-conf TLS fields */
    char password[128];
    char user_buf[96];
    char role[96];
    rdzv_keys_t keys;

    rg_agent_params_init(&cfg);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v;
        char name[64];
        if (launcher_sub_arg("regroup etcd-grant", argc, argv, &i, name, sizeof(name), &v) != 0) {
            return 2;
        }
        if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) {
            grant_usage(stdout);
            return 0;
        }
        if (v == NULL) {
            fprintf(stderr, "regroup etcd-grant: %s: unknown option or missing value\n", a);
            return 2;
        }
        if (strcmp(name, "--rdzv-endpoint") == 0) {
            endpoint = v;
        } else if (strcmp(name, "--rdzv-id") == 0 || strcmp(name, "--job-id") == 0) {
            job = v;
        } else if (strcmp(name, "--user") == 0) {
            user = v;
        } else if (strcmp(name, "--password-file") == 0) {
            pw_file = v;
        } else if (strcmp(name, "--admin-user") == 0) {
            admin = v;
        } else if (strcmp(name, "--admin-password-file") == 0) {
            admin_pw_file = v;
        } else if (strcmp(name, "--password") == 0 || strcmp(name, "--admin-password") == 0) {
            fprintf(stderr, "regroup etcd-grant: %s: passwords are read from files only "
                    "(%s-file)\n", name, name);
            return 2;
        } else if (strcmp(name, "--rdzv-conf") == 0) {
            if (launcher_parse_rdzv_conf(&cfg, v) != 0) {
                return 2;
            }
        } else {
            fprintf(stderr, "regroup etcd-grant: %s: unknown option\n", a);
            return 2;
        }
    }
    if (endpoint == NULL || job == NULL || pw_file == NULL || admin_pw_file == NULL) {
        fprintf(stderr, "regroup etcd-grant: --rdzv-endpoint, --rdzv-id, --password-file and "
                "--admin-password-file are required (see regroup etcd-grant --help)\n");
        return 2;
    }
    if (cfg.user[0] != '\0' || cfg.password[0] != '\0') {
        fprintf(stderr, "regroup etcd-grant: the administrator is --admin-user with "
                "--admin-password-file, not --rdzv-conf's user and password\n");
        return 2;
    }
    if (!rdzv_keys_job_id_ok(job) || rdzv_keys_init(&keys, job) != RG_OK) {
        fprintf(stderr, "regroup etcd-grant: --rdzv-id=%s: expected 1-64 of A-Z a-z 0-9 _ . -\n",
                job);
        return 2;
    }
    snprintf(role, sizeof(role), "regroup-%s", job);
    if (user == NULL) {
        snprintf(user_buf, sizeof(user_buf), "regroup-%s", job);
        user = user_buf;
    }
    if (user[0] == '\0' || strlen(user) >= sizeof(cfg.user)) {
        fprintf(stderr, "regroup etcd-grant: --user: expected 1-%zu characters\n",
                sizeof(cfg.user) - 1);
        return 2;
    }
    if (admin[0] == '\0' || strlen(admin) >= sizeof(cfg.user)) {
        fprintf(stderr, "regroup etcd-grant: --admin-user: expected 1-%zu characters\n",
                sizeof(cfg.user) - 1);
        return 2;
    }
    memcpy(cfg.user, admin, strlen(admin) + 1);
    if (launcher_read_secret(admin_pw_file, "--admin-password-file", cfg.password,
                             sizeof(cfg.password)) != 0 ||
        launcher_read_secret(pw_file, "--password-file", password, sizeof(password)) != 0) {
        return 2;
    }

    rg_etcd_params_t ep = launcher_etcd_params(&cfg, endpoint);
    rg_etcd_t *etcd = NULL;
    rg_etcd_grant_t res;
    rg_etcd_grant_req_t req = {.user = user, .password = password, .role = role,
                               .prefix = rdzv_keys_prefix(&keys)};
    rg_status_t st = rg_etcd_create(&ep, &etcd);
    if (st == RG_OK) {
        st = rg_etcd_grant_prefix(etcd, &req, RG_DEADLINE_DEFAULT, &res);
    }
    rg_etcd_destroy(etcd);
    memset(password, 0, sizeof(password));
    memset(cfg.password, 0, sizeof(cfg.password));
    if (st != RG_OK) {
        fprintf(stderr, "regroup etcd-grant: %s\n", rg_last_error());
        if (st == RG_EAUTH &&
            strstr(rg_last_error(), "authentication is not enabled") != NULL) {
            fprintf(stderr, "regroup etcd-grant: enable etcd's authentication first "
                    "(etcdctl user add root; etcdctl auth enable)\n");
        }
        return 1;
    }
    printf("etcd user %s (%s) holds role %s (%s): read and write on %s*, nothing else\n",
           user, res.user_created ? "created" : "existed, password set", role,
           res.role_created ? "created" : res.perm_granted ? "existed, permission added"
                                                            : "existed, unchanged",
           rdzv_keys_prefix(&keys));
    if (res.perms_revoked > 0) {
        printf("revoked %d other permission%s of role %s\n", res.perms_revoked,
               res.perms_revoked == 1 ? "" : "s", role);
    }
    if (res.other_roles[0] != '\0') {
        printf("note: user %s also holds the roles %s, left as they are: they may reach "
               "beyond the job's keys\n", user, res.other_roles);
    }
    printf("run the job with --rdzv-conf=user=%s,password_file=%s\n", user, pw_file);
    return 0;
}
