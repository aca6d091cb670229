/*
 * tests/c/test_trace.c — the trace builder and the "teraio-trace" file.
 *
 * Proves: the builder merges a kernel's repeated access to one tensor and
 * refuses what the file could not hold; a trace saved and loaded back is
 * equal field by field; and each kind of malformed file is refused with the
 * right code and the exact "origin:line: field '...'" message, so a user can
 * find the bad line without reading the parser.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "common/util.h"
#include "teraio/trace.h"

/* The example from docs/formats.md; the error tests edit one line of it. */
static const char *const example_lines[] = {
    "teraio-trace 1\n",                                            /* 1 */
    "# A toy iteration: forward, backward, optimizer step.\n",     /* 2 */
    "model toy-mlp batch 1\n",                                     /* 3 */
    "counts 4 6 10\n",                                             /* 4 */
    "# tensor <id> <bytes> <kind> <global|intermediate> [name]\n", /* 5 */
    "tensor 0 2097152 parameter global fc.weight\n",               /* 6 */
    "tensor 1 4194304 optimizer_state global fc.weight.exp_avg\n", /* 7 */
    "tensor 2 1048576 activation intermediate fc.out\n",           /* 8 */
    "tensor 3 4096 temporary intermediate\n",                      /* 9 */
    "# kernel <index> <duration_ns> <name> <r|w|rw>:<tensor>...\n",/* 10 */
    "kernel 0 100 aten::mm r:0 w:2\n",                             /* 11 */
    "kernel 1 200 aten::relu r:2 w:3\n",                           /* 12 */
    "kernel 2 300 aten::mul_ rw:3\n",                              /* 13 */
    "kernel 3 400 aten::mm r:3 r:0\n",                             /* 14 */
    "kernel 4 500 aten::relu_backward r:2\n",                      /* 15 */
    "kernel 5 600 aten::_fused_adam rw:0 rw:1\n",                  /* 16 */
};
#define N_LINES (sizeof example_lines / sizeof example_lines[0])

/* The example with line `line` (1-based) replaced by `with` (NULL: removed),
 * and cut after line `last` (N_LINES: keep all).  Caller frees. */
static char *example_edit(unsigned line, const char *with, unsigned last)
{
    static char buf[4096];
    buf[0] = '\0';
    for (unsigned i = 1; i <= last; i++) {
        const char *l = i == line ? with : example_lines[i - 1];
        if (l)
            strcat(buf, l);
    }
    return strdup(buf);
}

static int parse_text(const char *text, tio_trace **out)
{
    return tio_trace_parse(text, strlen(text), "t.tio", out);
}

/* Parse `text`, expect failure `code` with exactly `message`. */
static void expect_error(char *text, int code, const char *message)
{
    tio_trace *t = (tio_trace *)0x1;
    int rc = parse_text(text, &t);
    free(text);
    if (rc != code || strcmp(tio_last_error(), message) != 0)
        print_error("rc %d, message \"%s\"\n", rc, tio_last_error());
    assert_int_equal(rc, code);
    assert_null(t);
    assert_string_equal(tio_last_error(), message);
}

static const char *tmp_path(const char *name)
{
    static char path[4096];
    const char *dir = tio_env("TEST_TMPDIR");
    if (!dir || !*dir)
        dir = "/tmp";
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return path;
}

static void test_builder_merges_and_refuses(void **state)
{
    (void)state;
    tio_trace *t;
    uint32_t id;
    assert_int_equal(tio_trace_create("m", &t), 0);
    assert_int_equal(tio_trace_add_tensor(t, 10, TIO_KIND_ACTIVATION, false, "a", &id), 0);
    assert_int_equal(id, 0);
    assert_int_equal(tio_trace_add_tensor(t, 20, TIO_KIND_PARAMETER, true, NULL, &id), 0);
    assert_int_equal(id, 1);
    assert_int_equal(tio_trace_add_access(t, 0, TIO_ACCESS_READ), -EINVAL); /* no kernel */
    assert_int_equal(tio_trace_add_kernel(t, "k0", 5), 0);
    assert_int_equal(tio_trace_add_access(t, 0, TIO_ACCESS_READ), 0);
    assert_int_equal(tio_trace_add_access(t, 1, TIO_ACCESS_READ), 0);
    assert_int_equal(tio_trace_add_access(t, 0, TIO_ACCESS_WRITE), 0); /* merges */
    assert_int_equal(tio_trace_add_access(t, 0, TIO_ACCESS_READ), 0);  /* merges */
    assert_int_equal(t->n_accesses, 2);
    assert_int_equal(t->kernels[0].n_accesses, 2);
    assert_int_equal(t->accesses[0].tensor, 0);
    assert_int_equal(t->accesses[0].mode, TIO_ACCESS_READ | TIO_ACCESS_WRITE);
    assert_int_equal(t->accesses[1].mode, TIO_ACCESS_READ);
    assert_int_equal(tio_trace_add_kernel(t, "k1", 7), 0);
    assert_int_equal(tio_trace_add_access(t, 1, TIO_ACCESS_WRITE), 0); /* new kernel: new access */
    assert_int_equal(t->n_accesses, 3);
    assert_int_equal(t->kernels[1].first_access, 2);

    assert_int_equal(tio_trace_add_access(t, 2, TIO_ACCESS_READ), TIO_EUNKNOWN);
    assert_int_equal(tio_trace_add_access(t, 0, 0), -EINVAL);
    assert_int_equal(tio_trace_add_access(t, 0, 4), -EINVAL);
    assert_int_equal(tio_trace_add_tensor(t, 0, TIO_KIND_ACTIVATION, false, NULL, NULL), -EINVAL);
    assert_int_equal(tio_trace_add_tensor(t, 1, (tio_tensor_kind)5, false, NULL, NULL), -EINVAL);
    assert_int_equal(tio_trace_add_tensor(t, 1, TIO_KIND_TEMPORARY, false, "a b", NULL), -EINVAL);
    assert_int_equal(tio_trace_add_tensor(t, 1, TIO_KIND_TEMPORARY, false, "", NULL), -EINVAL);
    assert_int_equal(tio_trace_add_kernel(t, "", 1), -EINVAL);
    assert_int_equal(tio_trace_add_kernel(t, NULL, 1), -EINVAL);
    assert_int_equal(tio_trace_add_kernel(t, "a\tb", 1), -EINVAL);
    assert_int_equal(t->n_tensors, 2);
    assert_int_equal(t->n_kernels, 2);
    assert_int_equal(tio_trace_iteration_ns(t), 12);
    assert_int_equal(tio_trace_validate(t), 0);

    /* A tensor nobody accesses makes the trace invalid. */
    assert_int_equal(tio_trace_add_tensor(t, 30, TIO_KIND_TEMPORARY, false, NULL, NULL), 0);
    assert_int_equal(tio_trace_validate(t), TIO_EPARSE);
    assert_string_equal(tio_last_error(), "tensor 2 is never accessed by any kernel");
    assert_int_equal(tio_trace_save(t, tmp_path("invalid.tio")), TIO_EPARSE);
    tio_trace_destroy(t);

    assert_int_equal(tio_trace_create("two\nlines", &t), -EINVAL);
    assert_null(t);
    assert_string_equal(tio_tensor_kind_name(TIO_KIND_OPTIMIZER_STATE), "optimizer_state");
    assert_null(tio_tensor_kind_name((tio_tensor_kind)9));
}

static void assert_traces_equal(const tio_trace *a, const tio_trace *b)
{
    if (a->model)
        assert_string_equal(a->model, b->model);
    else
        assert_null(b->model);
    assert_int_equal(a->n_tensors, b->n_tensors);
    assert_int_equal(a->n_kernels, b->n_kernels);
    assert_int_equal(a->n_accesses, b->n_accesses);
    for (uint32_t i = 0; i < a->n_tensors; i++) {
        assert_int_equal(b->tensors[i].id, i);
        assert_true(a->tensors[i].bytes == b->tensors[i].bytes);
        assert_int_equal(a->tensors[i].kind, b->tensors[i].kind);
        assert_int_equal(a->tensors[i].global, b->tensors[i].global);
        if (a->tensors[i].name)
            assert_string_equal(a->tensors[i].name, b->tensors[i].name);
        else
            assert_null(b->tensors[i].name);
    }
    for (uint32_t k = 0; k < a->n_kernels; k++) {
        assert_string_equal(a->kernels[k].name, b->kernels[k].name);
        assert_true(a->kernels[k].duration_ns == b->kernels[k].duration_ns);
        assert_int_equal(a->kernels[k].first_access, b->kernels[k].first_access);
        assert_int_equal(a->kernels[k].n_accesses, b->kernels[k].n_accesses);
    }
    for (uint32_t i = 0; i < a->n_accesses; i++) {
        assert_int_equal(a->accesses[i].tensor, b->accesses[i].tensor);
        assert_int_equal(a->accesses[i].mode, b->accesses[i].mode);
    }
}

static void test_round_trip(void **state)
{
    (void)state;
    tio_trace *t, *back;
    assert_int_equal(tio_trace_create("llama3-8b  batch 32\tseq 2048 # not a comment", &t), 0);
    static const struct {
        uint64_t bytes;
        tio_tensor_kind kind;
        bool global;
        const char *name;
    } tensors[] = {
        {4096, TIO_KIND_PARAMETER, true, "layers.0.attn.wq"},
        {4096, TIO_KIND_GRADIENT, true, NULL},
        {8192, TIO_KIND_OPTIMIZER_STATE, true, "exp_avg#0"},
        {UINT64_C(1) << 40, TIO_KIND_ACTIVATION, false, "act\xc3\xa9"},
        {UINT64_C(18446744073709551615) - (UINT64_C(1) << 41), TIO_KIND_TEMPORARY, false, "t"},
    };
    for (uint32_t i = 0; i < 5; i++) {
        uint32_t id;
        assert_int_equal(tio_trace_add_tensor(t, tensors[i].bytes, tensors[i].kind,
                                              tensors[i].global, tensors[i].name, &id),
                         0);
        assert_int_equal(id, i);
    }
    assert_int_equal(tio_trace_add_kernel(t, "aten::embedding", 0), 0);
    assert_int_equal(tio_trace_add_access(t, 0, TIO_ACCESS_READ), 0);
    assert_int_equal(tio_trace_add_access(t, 3, TIO_ACCESS_WRITE), 0);
    assert_int_equal(tio_trace_add_kernel(t, "aten::empty", 1), 0); /* no accesses */
    assert_int_equal(tio_trace_add_kernel(t, "aten::add_", UINT64_C(1) << 62), 0);
    assert_int_equal(tio_trace_add_access(t, 4, TIO_ACCESS_READ | TIO_ACCESS_WRITE), 0);
    assert_int_equal(tio_trace_add_access(t, 3, TIO_ACCESS_READ), 0);
    assert_int_equal(tio_trace_add_access(t, 1, TIO_ACCESS_WRITE), 0);
    assert_int_equal(tio_trace_add_kernel(t, "optimizer.step", 123456789), 0);
    assert_int_equal(tio_trace_add_access(t, 2, TIO_ACCESS_READ | TIO_ACCESS_WRITE), 0);
    assert_int_equal(tio_trace_add_access(t, 0, TIO_ACCESS_READ | TIO_ACCESS_WRITE), 0);
    assert_int_equal(tio_trace_add_access(t, 1, TIO_ACCESS_READ), 0);

    const char *path = tmp_path("roundtrip.tio");
    assert_int_equal(tio_trace_save(t, path), 0);
    assert_int_equal(tio_trace_load(path, &back), 0);
    assert_traces_equal(t, back);
    assert_int_equal(tio_trace_validate(back), 0);
    tio_trace_destroy(back);

    /* Without a model line. */
    free(t->model);
    t->model = NULL;
    assert_int_equal(tio_trace_save(t, path), 0);
    assert_int_equal(tio_trace_load(path, &back), 0);
    assert_traces_equal(t, back);
    tio_trace_destroy(back);
    tio_trace_destroy(t);
}

/* The example as file version `version` (one digit), line `line` replaced
 * by `with` (as example_edit; 0: none), and `records` appended. */
static char *example_records(char version, unsigned line, const char *with, const char *records)
{
    char *base = example_edit(line, with, N_LINES);
    base[strlen("teraio-trace ")] = version;
    char *out = malloc(strlen(base) + strlen(records) + 1);
    assert_non_null(out);
    strcpy(out, base);
    strcat(out, records);
    free(base);
    return out;
}

/* The example as version 2 with `free` records appended (each a line). */
static char *example_with_free(const char *records)
{
    return example_records('2', 0, NULL, records);
}

/* Version 2's free records: the kernel before which an intermediate tensor
 * was freed (the program held it past its last access).  They load, round
 * trip (saved as version 2; a trace without them is saved as version 1),
 * and every malformed one is refused with its line. */
static void test_free_records(void **state)
{
    (void)state;
    char *text = example_with_free("# held by Python past its last use\nfree 3 5\nfree 2 6\n");
    tio_trace *t, *back;
    assert_int_equal(parse_text(text, &t), 0);
    free(text);
    assert_int_equal(t->tensors[3].free_kernel, 5);
    assert_int_equal(t->tensors[2].free_kernel, 6);
    assert_int_equal(t->tensors[0].free_kernel, 0);
    const char *path = tmp_path("free.tio");
    assert_int_equal(tio_trace_save(t, path), 0);
    assert_int_equal(tio_trace_load(path, &back), 0);
    for (uint32_t i = 0; i < 4; i++)
        assert_int_equal(back->tensors[i].free_kernel, t->tensors[i].free_kernel);
    char head[32] = {0};
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    assert_non_null(fgets(head, sizeof head, f));
    fclose(f);
    assert_string_equal(head, "teraio-trace 3\n"); /* saved with the count of free records */
    tio_trace_destroy(back);

    assert_int_equal(tio_trace_set_free_kernel(t, 0, 6), -EINVAL); /* global */
    assert_int_equal(tio_trace_set_free_kernel(t, 3, 7), -EINVAL);
    assert_int_equal(tio_trace_set_free_kernel(t, 3, 0), -EINVAL);
    assert_int_equal(tio_trace_set_free_kernel(t, 4, 3), TIO_EUNKNOWN);
    assert_int_equal(tio_trace_set_free_kernel(t, 3, 3), 0); /* last access is 3 */
    assert_int_equal(tio_trace_validate(t), TIO_EPARSE);
    assert_string_equal(tio_last_error(), "tensor 3: free kernel 3 is not in (3, 6] (after its "
                                          "last access, at most the kernel count)");
    t->tensors[3].free_kernel = 0;
    t->tensors[2].free_kernel = 0;
    assert_int_equal(tio_trace_save(t, path), 0);
    f = fopen(path, "r");
    assert_non_null(f);
    assert_non_null(fgets(head, sizeof head, f));
    fclose(f);
    assert_string_equal(head, "teraio-trace 1\n");
    tio_trace_destroy(t);

    expect_error(example_edit(16, "kernel 5 600 aten::_fused_adam rw:0 rw:1\nfree 3 5\n",
                              N_LINES),
                 TIO_EPARSE,
                 "t.tio:17: field 'record': expected end of file after the last kernel, got "
                 "'free'");
    expect_error(example_with_free("free 0 6\n"), TIO_EPARSE,
                 "t.tio:17: field 'tensor': expected an intermediate tensor, tensor 0 is global");
    expect_error(example_with_free("free 4 6\n"), TIO_EPARSE,
                 "t.tio:17: field 'tensor': expected a tensor id below 4, got '4'");
    expect_error(example_with_free("free 3 3\n"), TIO_EPARSE,
                 "t.tio:17: field 'kernel': expected a kernel in (3, 6] (after the tensor's last "
                 "access), got '3'");
    expect_error(example_with_free("free 3 7\n"), TIO_EPARSE,
                 "t.tio:17: field 'kernel': expected a kernel in (3, 6] (after the tensor's last "
                 "access), got '7'");
    expect_error(example_with_free("free 3 5\nfree 3 6\n"), TIO_EPARSE,
                 "t.tio:18: field 'tensor': expected one free record per tensor, tensor 3 has "
                 "two");
    expect_error(example_with_free("free 3 5 9\n"), TIO_EPARSE,
                 "t.tio:17: field 'free': expected end of line, got '9'");
    expect_error(example_with_free("kernel 6 1 x\n"), TIO_EPARSE,
                 "t.tio:17: field 'record': expected 'free' or end of file after the last "
                 "kernel, got 'kernel'");
}

/* The example as version 3: the counts line ends with the number of free
 * records, `n_frees`, and the file must have exactly that many. */
static char *example_v3(const char *n_frees, const char *records)
{
    char counts[64];
    snprintf(counts, sizeof counts, "counts 4 6 10%s\n", n_frees);
    return example_records('3', 4, counts, records);
}

/* Version 3 counts its free records and ends in a newline: a file cut after
 * or inside a free record (which version 2 cannot tell from a complete one)
 * is refused. */
static void test_free_records_counted(void **state)
{
    (void)state;
    tio_trace *t;
    char *text = example_v3(" 2", "free 3 5\nfree 2 6\n");
    assert_int_equal(parse_text(text, &t), 0);
    free(text);
    assert_int_equal(t->tensors[3].free_kernel, 5);
    assert_int_equal(t->tensors[2].free_kernel, 6);
    tio_trace_destroy(t);
    text = example_v3(" 0", "");
    assert_int_equal(parse_text(text, &t), 0);
    free(text);
    tio_trace_destroy(t);
    expect_error(example_v3(" 2", "free 3 5\n"), TIO_EPARSE,
                 "t.tio:4: field 'n_frees': expected 1 (the free records the file has), got '2'");
    expect_error(example_v3(" 1", "free 3 5\nfree 2 6\n"), TIO_EPARSE,
                 "t.tio:4: field 'n_frees': expected 2 (the free records the file has), got '1'");
    /* cut inside the last record's kernel number: 6 would read as a valid 5 */
    expect_error(example_v3(" 2", "free 3 6\nfree 2 5"), TIO_EPARSE,
                 "t.tio:18: field 'end': expected a newline at the end of the file (a version 3 "
                 "file ends in one; this one may be cut short)");
    expect_error(example_v3("", "free 3 5\n"), TIO_EPARSE,
                 "t.tio:4: field 'n_frees': expected an unsigned integer, got end of line");
}

/* A trace the size of a small real model, built at random, survives the round trip. */
static void test_round_trip_large(void **state)
{
    (void)state;
    tio_trace *t, *back;
    uint64_t x = 88172645463325252ull;
    assert_int_equal(tio_trace_create(NULL, &t), 0);
    for (uint32_t i = 0; i < 5000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        assert_int_equal(tio_trace_add_tensor(t, 1 + x % (1u << 30), (tio_tensor_kind)(x % 5),
                                              x % 3 == 0, i % 2 ? "n" : NULL, NULL),
                         0);
    }
    for (uint32_t k = 0; k < 20000; k++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        assert_int_equal(tio_trace_add_kernel(t, "aten::op", x % 100000), 0);
        for (uint32_t j = 0; j < x % 20; j++)
            assert_int_equal(tio_trace_add_access(t, (uint32_t)((x >> 8) + j * 7919) % 5000,
                                                  (uint8_t)(1 + (x >> (j + 3)) % 3)),
                             0);
    }
    for (uint32_t i = 0; i < 5000; i++) { /* every tensor used at least once */
        assert_int_equal(tio_trace_add_kernel(t, "touch", 1), 0);
        assert_int_equal(tio_trace_add_access(t, i, TIO_ACCESS_READ), 0);
    }
    const char *path = tmp_path("large.tio");
    assert_int_equal(tio_trace_save(t, path), 0);
    assert_int_equal(tio_trace_load(path, &back), 0);
    assert_traces_equal(t, back);
    tio_trace_destroy(back);
    tio_trace_destroy(t);
}

static void test_example_parses(void **state)
{
    (void)state;
    tio_trace *t;
    char *text = example_edit(0, NULL, N_LINES);
    assert_int_equal(parse_text(text, &t), 0);
    free(text);
    assert_string_equal(t->model, "toy-mlp batch 1");
    assert_int_equal(t->n_tensors, 4);
    assert_int_equal(t->n_kernels, 6);
    assert_int_equal(t->n_accesses, 10);
    assert_true(t->tensors[1].bytes == 4194304);
    assert_int_equal(t->tensors[1].kind, TIO_KIND_OPTIMIZER_STATE);
    assert_true(t->tensors[1].global);
    assert_false(t->tensors[2].global);
    assert_string_equal(t->tensors[1].name, "fc.weight.exp_avg");
    assert_null(t->tensors[3].name);
    assert_string_equal(t->kernels[5].name, "aten::_fused_adam");
    assert_true(t->kernels[5].duration_ns == 600);
    assert_int_equal(t->kernels[5].first_access, 8);
    assert_int_equal(t->accesses[4].tensor, 3);
    assert_int_equal(t->accesses[4].mode, TIO_ACCESS_READ | TIO_ACCESS_WRITE);
    assert_int_equal(t->accesses[1].mode, TIO_ACCESS_WRITE);
    tio_trace_destroy(t);

    /* CRLF line ends, tabs, runs of blanks, blank lines and comments are fine. */
    const char *loose = "teraio-trace 1\r\n\r\ncounts 1 1 1\r\n  # c\r\n"
                        "tensor\t0  8 activation   intermediate\r\n\nkernel 0 5 k\tr:0   \r\n# end";
    assert_int_equal(parse_text(loose, &t), 0);
    assert_null(t->model);
    assert_null(t->tensors[0].name);
    assert_string_equal(t->kernels[0].name, "k");
    assert_int_equal(t->accesses[0].mode, TIO_ACCESS_READ);
    tio_trace_destroy(t);

    assert_int_equal(parse_text("teraio-trace 1\nmodel\ncounts 0 0 0\n", &t), 0);
    assert_string_equal(t->model, "");
    assert_int_equal(t->n_kernels, 0);
    tio_trace_destroy(t);
}

static void test_parse_errors(void **state)
{
    (void)state;
    expect_error(example_edit(0, NULL, 14), TIO_EPARSE,
                 "t.tio:15: field 'kernel': expected 'kernel' (kernel 4 of 6), got end of file");
    expect_error(example_edit(0, NULL, 7), TIO_EPARSE,
                 "t.tio:8: field 'tensor': expected 'tensor' (tensor 2 of 4), got end of file");
    expect_error(strdup("teraio-trace 1\ncounts 1 1 1\ntensor 0 8 activation"), TIO_EPARSE,
                 "t.tio:3: field 'scope': expected 'global' or 'intermediate', got end of line");
    expect_error(strdup(""), TIO_EPARSE,
                 "t.tio:1: field 'header': expected 'teraio-trace <version>' (1 to 3), got end of file");
    expect_error(example_edit(7, "tensor 1 41943x4 optimizer_state global\n", N_LINES), TIO_EPARSE,
                 "t.tio:7: field 'bytes': expected an unsigned integer, got '41943x4'");
    expect_error(example_edit(7, "tensor 1 18446744073709551616 parameter global\n", N_LINES),
                 TIO_EPARSE,
                 "t.tio:7: field 'bytes': expected an unsigned integer below 2^64, "
                 "got '18446744073709551616'");
    expect_error(example_edit(7, "tensor 1 -5 parameter global\n", N_LINES), TIO_EPARSE,
                 "t.tio:7: field 'bytes': expected an unsigned integer, got '-5'");
    expect_error(example_edit(7, "tensor 1 0 parameter global\n", N_LINES), TIO_EPARSE,
                 "t.tio:7: field 'bytes': expected a size > 0, got '0'");
    expect_error(example_edit(12, "kernel 1 2e3 aten::relu r:2 w:3\n", N_LINES), TIO_EPARSE,
                 "t.tio:12: field 'duration_ns': expected an unsigned integer, got '2e3'");
    expect_error(example_edit(8, "tensor 2 1048576 weights intermediate\n", N_LINES), TIO_EPARSE,
                 "t.tio:8: field 'kind': expected one of parameter, gradient, optimizer_state, "
                 "activation, temporary, got 'weights'");
    expect_error(example_edit(8, "tensor 2 1048576 activation local\n", N_LINES), TIO_EPARSE,
                 "t.tio:8: field 'scope': expected 'global' or 'intermediate', got 'local'");
    expect_error(example_edit(1, "teraio-trace 4\n", N_LINES), TIO_EVERSION,
                 "t.tio:1: field 'version': expected 1 to 3 (the versions this build reads), "
                 "got '4'");
    expect_error(example_edit(1, "teraio-trace one\n", N_LINES), TIO_EPARSE,
                 "t.tio:1: field 'version': expected an unsigned integer, got 'one'");
    expect_error(example_edit(1, "teraio-plan 1\n", N_LINES), TIO_EPARSE,
                 "t.tio:1: field 'header': expected 'teraio-trace <version>' (1 to 3), got 'teraio-plan'");
    /* Kernel 3 missing: kernel 4 comes where kernel 3 should. */
    expect_error(example_edit(14, NULL, N_LINES), TIO_EPARSE,
                 "t.tio:14: field 'index': expected 3 (indices are sequential), got '4'");
    expect_error(example_edit(7, "tensor 2 4194304 optimizer_state global\n", N_LINES),
                 TIO_EPARSE, "t.tio:7: field 'id': expected 1 (ids are sequential), got '2'");
    expect_error(example_edit(15, "kernel 4 500 aten::relu_backward r:7\n", N_LINES), TIO_EPARSE,
                 "t.tio:15: field 'access': expected a tensor id below 4, got 'r:7'");
    expect_error(example_edit(15, "kernel 4 500 aten::relu_backward x:2\n", N_LINES), TIO_EPARSE,
                 "t.tio:15: field 'access': expected r:<tensor>, w:<tensor> or rw:<tensor>, "
                 "got 'x:2'");
    expect_error(example_edit(15, "kernel 4 500 aten::relu_backward r:\n", N_LINES), TIO_EPARSE,
                 "t.tio:15: field 'access': expected r:<tensor>, w:<tensor> or rw:<tensor>, "
                 "got 'r:'");
    expect_error(example_edit(15, "kernel 4 500 aten::relu_backward r:2 w:2\n", N_LINES),
                 TIO_EPARSE,
                 "t.tio:15: field 'access': expected each tensor at most once per kernel, "
                 "got 'w:2'");
    expect_error(example_edit(15, "kernel 4 500 aten::relu_backward r:2 w:3\n", N_LINES),
                 TIO_EPARSE,
                 "t.tio:16: field 'access': expected at most 10 accesses in all (counts line 4), "
                 "got 'rw:1'");
    expect_error(example_edit(15, "kernel 4 500 aten::relu_backward\n", N_LINES), TIO_EPARSE,
                 "t.tio:4: field 'n_accesses': expected 9 (the accesses the kernels list), "
                 "got '10'");
    expect_error(example_edit(16, "kernel 5 600 aten::_fused_adam rw:0 w:2\n", N_LINES),
                 TIO_EPARSE, "t.tio:7: field 'id': tensor 1 is never accessed by any kernel");
    expect_error(example_edit(4, "counts 4 6\n", N_LINES), TIO_EPARSE,
                 "t.tio:4: field 'n_accesses': expected an unsigned integer, got end of line");
    expect_error(example_edit(4, "counts 4 4294967296 10\n", N_LINES), TIO_EPARSE,
                 "t.tio:4: field 'n_kernels': expected an unsigned integer below 2^32, "
                 "got '4294967296'");
    expect_error(example_edit(4, "counts 4 5 10\n", N_LINES), TIO_EPARSE,
                 "t.tio:16: field 'record': expected end of file after the last kernel, "
                 "got 'kernel'");
    expect_error(example_edit(4, "tensors 4 6 10\n", N_LINES), TIO_EPARSE,
                 "t.tio:4: field 'record': expected 'counts', got 'tensors'");
    expect_error(example_edit(9, "tensor 3 4096 temporary intermediate a b\n", N_LINES),
                 TIO_EPARSE, "t.tio:9: field 'tensor': expected end of line, got 'b'");
    expect_error(example_edit(11, "kernel 0 100\n", N_LINES), TIO_EPARSE,
                 "t.tio:11: field 'name': expected a kernel name without control characters, "
                 "got end of line");
    expect_error(example_edit(9, "kernel 0 100 aten::mm r:0 w:2\n", N_LINES), TIO_EPARSE,
                 "t.tio:9: field 'record': expected 'tensor' (tensor 3 of 4), got 'kernel'");
    expect_error(example_edit(3, "model bad\x01text\n", N_LINES), TIO_EPARSE,
                 "t.tio:3: field 'model': expected text without control characters");
    expect_error(example_edit(12, "kernel 1 18446744073709551516 aten::relu r:2 w:3\n", N_LINES),
                 TIO_EPARSE,
                 "t.tio:12: field 'duration_ns': expected durations summing below 2^64, "
                 "got '18446744073709551516'");

    /* A counts line far larger than the file: refused without a huge allocation. */
    tio_trace *t;
    const char *lying = "teraio-trace 1\ncounts 4000000000 2000000000 4000000000\n"
                        "tensor 0 8 activation intermediate\n";
    assert_int_equal(parse_text(lying, &t), TIO_EPARSE);
    assert_string_equal(tio_last_error(),
                        "t.tio:4: field 'tensor': expected 'tensor' (tensor 1 of 4000000000), "
                        "got end of file");
}

static void test_load_errors(void **state)
{
    (void)state;
    tio_trace *t;
    const char *path = tmp_path("does-not-exist.tio");
    remove(path);
    assert_int_equal(tio_trace_load(path, &t), -ENOENT);
    assert_null(t);
    assert_non_null(strstr(tio_last_error(), "does-not-exist.tio"));

    path = tmp_path("garbled.tio");
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("teraio-trace 1\ncounts 1 1 1\ntensor 0 12q activation intermediate\n", f);
    fclose(f);
    assert_int_equal(tio_trace_load(path, &t), TIO_EPARSE);
    char expected[4200];
    snprintf(expected, sizeof expected,
             "%s:3: field 'bytes': expected an unsigned integer, got '12q'", path);
    assert_string_equal(tio_last_error(), expected);
}

/* Paths that are not plain regular files, each once handled wrongly:
 *   - loading a FIFO waited forever for a writer;
 *   - files under /proc report 0 bytes: the reader trusted the size and
 *     said "got end of file" about a file that has text;
 *   - saving to an existing path that is not a regular file renamed a file
 *     over it (as root, `teraio plan ... -o /dev/null` replaced /dev/null);
 *     saving through a symbolic link replaced the link, and a replaced file
 *     lost its permissions. */
static void test_special_paths(void **state)
{
    (void)state;
    tio_trace *t, *back;
    char *text = example_edit(0, NULL, N_LINES);
    assert_int_equal(parse_text(text, &t), 0);
    free(text);
    char dir[4096], fifo[4200], file[4200], link[4200], dangling[4200], sub[4200];
    char expected[4400];
    snprintf(dir, sizeof dir, "%s", tmp_path("special.XXXXXX"));
    assert_non_null(mkdtemp(dir));
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    snprintf(file, sizeof file, "%s/file.tio", dir);
    snprintf(link, sizeof link, "%s/link.tio", dir);
    snprintf(dangling, sizeof dangling, "%s/dangling.tio", dir);
    snprintf(sub, sizeof sub, "%s/sub", dir);

    /* A FIFO: no writer, no reader, then a reader.  alarm() turns a call
     * that blocks into a failed test. */
    assert_int_equal(mkfifo(fifo, 0600), 0);
    alarm(10);
    back = (tio_trace *)0x1;
    assert_int_equal(tio_trace_load(fifo, &back), -EINVAL);
    assert_null(back);
    snprintf(expected, sizeof expected, "%s: not a regular file", fifo);
    assert_string_equal(tio_last_error(), expected);
    assert_int_equal(tio_trace_save(t, fifo), -ENXIO);
    snprintf(expected, sizeof expected, "%s: cannot write: no process reads this FIFO", fifo);
    assert_string_equal(tio_last_error(), expected);
    int rd = open(fifo, O_RDONLY | O_NONBLOCK);
    assert_true(rd >= 0);
    assert_int_equal(tio_trace_save(t, fifo), 0);
    char buf[4096];
    ssize_t n = read(rd, buf, sizeof buf);
    close(rd);
    alarm(0);
    assert_true(n > 0);
    struct stat st;
    assert_int_equal(stat(fifo, &st), 0);
    assert_true(S_ISFIFO(st.st_mode));
    assert_int_equal(tio_trace_parse(buf, (size_t)n, "fifo", &back), 0);
    assert_traces_equal(t, back);
    tio_trace_destroy(back);

    /* A file of mode 0640 is replaced and keeps its mode.  Saved through a
     * symbolic link, it is refused (saves never write through links, issue
     * 12): the link stays, the file is unchanged. */
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fputs("old\n", f);
    fclose(f);
    assert_int_equal(chmod(file, 0640), 0);
    assert_int_equal(symlink("file.tio", link), 0);
    assert_int_equal(tio_trace_save(t, link), -ELOOP);
    assert_non_null(strstr(tio_last_error(), "a symbolic link"));
    assert_int_equal(lstat(link, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    assert_int_equal(stat(file, &st), 0);
    assert_int_equal(st.st_size, 4);
    assert_int_equal(tio_trace_save(t, file), 0);
    assert_int_equal(stat(file, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0640);
    assert_int_equal(tio_trace_load(file, &back), 0);
    assert_traces_equal(t, back);
    tio_trace_destroy(back);

    /* A link to nothing, and a directory: refused, nothing left behind. */
    assert_int_equal(symlink("missing.tio", dangling), 0);
    assert_int_equal(tio_trace_save(t, dangling), -ENOENT);
    assert_int_equal(mkdir(sub, 0755), 0);
    assert_int_equal(tio_trace_save(t, sub), -EISDIR);
    snprintf(expected, sizeof expected, "%s: cannot write: is a directory", sub);
    assert_string_equal(tio_last_error(), expected);
    DIR *d = opendir(dir);
    assert_non_null(d);
    int entries = 0;
    for (struct dirent *e; (e = readdir(d));)
        entries += e->d_name[0] != '.';
    closedir(d);
    assert_int_equal(entries, 5); /* fifo, file.tio, link.tio, dangling.tio, sub */

    /* /proc/self/status reports 0 bytes but has text. */
    back = (tio_trace *)0x1;
    assert_int_equal(tio_trace_load("/proc/self/status", &back), TIO_EPARSE);
    assert_null(back);
    assert_string_equal(tio_last_error(), "/proc/self/status:1: field 'header': expected "
                                          "'teraio-trace <version>' (1 to 3), got 'Name:'");

    unlink(fifo);
    unlink(file);
    unlink(link);
    unlink(dangling);
    rmdir(sub);
    rmdir(dir);
    tio_trace_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_builder_merges_and_refuses),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_round_trip_large),
        cmocka_unit_test(test_free_records),
        cmocka_unit_test(test_free_records_counted),
        cmocka_unit_test(test_example_parses),
        cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_special_paths),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
