/*
 * cli/main.c — the `teraio` command: dispatch to subcommands.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "teraio/teraio.h"

struct subcommand {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *usage;
};

static const struct subcommand commands[] = {
    {"version", cmd_version, "version                 print the version and compiled-in features"},
    {"analyze", cmd_analyze, "analyze TRACE [--ssd-read-gbps R --ssd-write-gbps W] [--json]  inactive periods, memory curve, paper statistics"},
    {"eval", cmd_eval, "eval paper --traces DIR [--json] [--svg DIR] | eval trace TRACE --hw PROFILE  simulate offloading strategies"},
    {"advise", cmd_advise, "advise --model NAME|--config FILE|--trace TRACE [--hw PROFILE] [--gpus L] [--ssds L] ...  what fits, how fast, what it costs"},
    {"plan", cmd_plan, "plan TRACE --capacity BYTES [--ssd-read-gbps R] [--ssd-write-gbps W] [--host-cap BYTES] -o PLAN"},
    {"bench", cmd_bench, "bench io [--dir DIR ...] [--size BYTES] [--bs BYTES] [--qd N] [--runs N] [--json]  engine vs fio"},
    {"data", cmd_data, "data inspect DIR | data ingest SRC OUT [--tokenizer SPEC] | data bench DIR [--seq-len N] [--json]  the data loader"},
    {"check", cmd_check, "check TRACE PLAN        does PLAN apply to TRACE? planned peak vs capacity"},
    {"tokenize", cmd_tokenize, "tokenize --encoding NAME|--file PATH [--ids|--decode|--bench] FILE  byte-level BPE tokens (tiktoken / HF ids)"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: teraio <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %s\n", commands[i].usage);
    fprintf(f, "\n'teraio <command> --help' shows a command's options.\n");
}

int cmd_version(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        printf("usage: teraio version\n\nPrint the version, the compiled-in features and the "
               "state of CUDA and cuFile here.\n");
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "teraio version: unexpected argument '%s' (it takes none)\n", argv[1]);
        return 2;
    }
    printf("teraio %s\nfeatures: %s\n", tio_version(), tio_features());
    static const char *const state[] = {"not built", "unavailable", "available"};
    tio_cuda_info cuda;
    tio_cuda_info_get(&cuda);
    if (cuda.state == TIO_GPU_AVAILABLE)
        printf("cuda: available (%s, runtime %d, driver %d, %d device(s))\n", cuda.library,
               cuda.runtime_version, cuda.driver_version, cuda.devices);
    else
        printf("cuda: %s (%s)\n", state[cuda.state], cuda.reason);
    tio_cufile_info cufile;
    tio_cufile_info_get(&cufile);
    if (cufile.state == TIO_GPU_AVAILABLE)
        printf("cufile: available (%s, version %d, %s%s)\n", cufile.library, cufile.version,
               cufile.compat_mode ? "compatibility mode: nvidia-fs not loaded" : "nvidia-fs loaded",
               cufile.batch ? ", batch API" : ", no batch API");
    else
        printf("cufile: %s (%s)\n", state[cufile.state], cufile.reason);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version"))
        return cmd_version(0, NULL);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "teraio: unknown command '%s' (try 'teraio --help')\n", argv[1]);
    return 2;
}
