/*
 * `ri`: the C command-line front end.  Like git, it is a thin dispatcher: each
 * subcommand is a program `ri-<name>` (or a program that serves several, per
 * the table below) in the same folder as `ri`, so that each layer builds and
 * owns its own tools.  `ri help` lists what is installed.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct ri_cli_route {
    const char *command;  /* what the user types */
    const char *program;  /* ri-<program> that serves it */
    const char *help;     /* one line */
} ri_cli_route_t;

/* Commands served by a program of another name (the rest map to ri-<cmd>). */
static const ri_cli_route_t ri_cli_routes[] = {
    {"status", "ctl", "call Health on a kvstore"},
    {"stats", "ctl", "show a kvstore's Stats"},
    {"sessions", "ctl", "list a kvstore's sessions"},
    {"drain", "ctl", "stop a kvstore accepting sessions"},
    {"prefixes", "ctl", "list (or --drop) a kvstore's prefix blocks"},
    {"cluster", "cluster", "list a kvstore cluster's nodes and session owners (etcd directory)"},
};

static int ri_cli_self_dir(char *dir, size_t len)
{
    ssize_t n = readlink("/proc/self/exe", dir, len - 1);
    if (n <= 0)
        return -1;
    dir[n] = '\0';
    char *slash = strrchr(dir, '/');
    if (slash == NULL)
        return -1;
    *slash = '\0';
    return 0;
}

static void ri_cli_usage(const char *dir)
{
    printf("usage: ri COMMAND [ARGS...]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof(ri_cli_routes) / sizeof(ri_cli_routes[0]); i++)
        printf("  %-12s %s\n", ri_cli_routes[i].command, ri_cli_routes[i].help);
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "ri-", 3) == 0 && strcmp(e->d_name, "ri-ctl") != 0 &&
            strcmp(e->d_name, "ri-cluster") != 0 && strncmp(e->d_name, "ri-bench-", 9) != 0)
            printf("  %-12s (program %s)\n", e->d_name + 3, e->d_name);
    }
    closedir(d);
}

int main(int argc, char **argv)
{
    char dir[PATH_MAX], prog[PATH_MAX + 64];
    const char *cmd = argc > 1 ? argv[1] : "help";
    const char *target = cmd;

    if (ri_cli_self_dir(dir, sizeof(dir)) != 0) {
        fprintf(stderr, "ri: cannot find my own folder: %s\n", strerror(errno));
        return 2;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        ri_cli_usage(dir);
        return 0;
    }
    if (strchr(cmd, '/') != NULL || strchr(cmd, '.') != NULL) {
        fprintf(stderr, "ri: bad command '%s'\n", cmd);
        return 2;
    }
    for (size_t i = 0; i < sizeof(ri_cli_routes) / sizeof(ri_cli_routes[0]); i++) {
        if (strcmp(cmd, ri_cli_routes[i].command) == 0) {
            target = ri_cli_routes[i].program;
            break;
        }
    }
    snprintf(prog, sizeof(prog), "%s/ri-%s", dir, target);
    if (access(prog, X_OK) != 0) {
        fprintf(stderr, "ri: unknown command '%s' (no %s); try 'ri help'\n", cmd, prog);
        return 2;
    }
    /* ri-ctl gets the command name as its first argument; others get theirs. */
    if (target != cmd) {
        argv[0] = prog;
        execv(prog, argv);
    } else {
        argv[1] = prog;
        execv(prog, argv + 1);
    }
    fprintf(stderr, "ri: cannot run %s: %s\n", prog, strerror(errno));
    return 2;
}
