/*
 * tests/c/test_atomic_save.c — saves into a directory shared with another,
 * hostile user (issue 12, item 5).
 *
 * Before the fix, tio_atomic_open resolved the target with realpath and
 * opened "<target>.tmp.<pid>" with O_CREAT|O_TRUNC: symbolic links that an
 * unprivileged user planted in a shared directory made root's `teraio plan
 * -o` and `data sample --save` overwrite or truncate root-only files.  Here
 * the user `nobody` (through setpriv) plants links, a FIFO and a file of its
 * own in a sticky, world-writable directory, and root saves traces and plans
 * there.  No root-only file may change; new files are root's, mode 0600.
 * The test skips, saying why, only where it cannot switch to `nobody`
 * (not root, no setpriv).  It also checks the clean-up of temporary files
 * that dead writers left: removed when unlocked, kept while their writer
 * holds its lock.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/file.h>
#include <sys/stat.h>

#include "common/util.h"
#include "teraio/plan.h"
#include "teraio/trace.h"

#define AS_NOBODY "setpriv --reuid=nobody --regid=nogroup --clear-groups -- "

static char g_shared[PATH_MAX], g_secret[PATH_MAX], g_victim[PATH_MAX + 16];
static uid_t g_nobody;

/* Run `cmd` (sh) as nobody; its exit status. */
static int as_nobody(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int as_nobody(const char *fmt, ...)
{
    char cmd[3 * PATH_MAX], full[3 * PATH_MAX + 128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    snprintf(full, sizeof full, AS_NOBODY "sh -c '%s'", cmd);
    return system(full);
}

static int setup(void **state)
{
    struct passwd *pw = getpwnam("nobody");
    if (geteuid() != 0 || !pw || system(AS_NOBODY "true 2>/dev/null") != 0)
        return 0; /* the test says why it skips */
    g_nobody = pw->pw_uid;
    snprintf(g_shared, sizeof g_shared, "/tmp/teraio-shared.XXXXXX");
    snprintf(g_secret, sizeof g_secret, "/tmp/teraio-secret.XXXXXX");
    if (!mkdtemp(g_shared) || !mkdtemp(g_secret) || chmod(g_shared, 01777) != 0 ||
        chmod(g_secret, 0700) != 0)
        return -1;
    snprintf(g_victim, sizeof g_victim, "%s/victim", g_secret);
    FILE *f = fopen(g_victim, "w");
    if (!f)
        return -1;
    fputs("root only\n", f);
    fclose(f);
    return chmod(g_victim, 0600);
}

static int teardown(void **state)
{
    if (!g_shared[0])
        return 0;
    char cmd[2 * PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", g_shared, g_secret);
    return system(cmd);
}

static void skip_unless_nobody(void)
{
    if (!g_shared[0]) {
        print_message("skipped: cannot switch to user nobody here (needs root and setpriv)\n");
        skip();
    }
}

static void assert_victim_intact(void)
{
    char buf[64] = "";
    FILE *f = fopen(g_victim, "r");
    assert_non_null(f);
    assert_non_null(fgets(buf, sizeof buf, f));
    fclose(f);
    assert_string_equal(buf, "root only\n");
    struct stat st;
    assert_int_equal(stat(g_victim, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0600);
}

static tio_trace *small_trace(void)
{
    tio_trace *t;
    uint32_t id;
    assert_int_equal(tio_trace_create("shared dir", &t), 0);
    assert_int_equal(tio_trace_add_tensor(t, 4096, TIO_KIND_ACTIVATION, false, NULL, &id), 0);
    assert_int_equal(tio_trace_add_kernel(t, "k", 10), 0);
    assert_int_equal(tio_trace_add_access(t, id, TIO_ACCESS_WRITE), 0);
    return t;
}

static void in_shared(char *out, const char *name)
{
    snprintf(out, PATH_MAX + 64, "%s/%s", g_shared, name);
}

/* Links planted where the target will be, or where the old code put its
 * temporary file: nothing is written through them. */
static void test_saves_refuse_links_planted_by_another_user(void **state)
{
    skip_unless_nobody();
    tio_trace *t = small_trace();
    char path[PATH_MAX + 64], tmp[PATH_MAX + 96];
    struct stat st;

    /* The target itself: refused, the link stays. */
    in_shared(path, "plan.tio");
    assert_int_equal(as_nobody("ln -s %s %s", g_victim, path), 0);
    assert_int_equal(tio_trace_save(t, path), -ELOOP);
    char want[2 * PATH_MAX];
    snprintf(want, sizeof want, "%s: cannot write: a symbolic link owned by another user "
             "(uid %u), not followed", path, (unsigned)g_nobody);
    assert_string_equal(tio_last_error(), want);
    tio_migration none[1];
    tio_plan plan = {.n_kernels = 1, .n_tensors = 1, .capacity_bytes = 4096, .migrations = none};
    assert_int_equal(tio_plan_save(&plan, path), -ELOOP);
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    assert_victim_intact();

    /* The old temporary name "<target>.tmp.<pid>": the save succeeds, into a
     * new file of root's, mode 0600. */
    in_shared(path, "state.tio");
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    assert_int_equal(as_nobody("ln -s %s %s", g_victim, tmp), 0);
    assert_int_equal(tio_trace_save(t, path), 0);
    assert_int_equal(tio_plan_save(&plan, path), 0);
    assert_victim_intact();
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(st.st_uid, 0);
    assert_int_equal(st.st_mode & 07777, 0600);
    assert_int_equal(lstat(tmp, &st), 0); /* not ours: left alone */
    assert_true(S_ISLNK(st.st_mode));

    /* A dangling link to where root could create a file: refused. */
    char created[PATH_MAX + 16];
    snprintf(created, sizeof created, "%s/created", g_secret);
    in_shared(path, "dangling.tio");
    assert_int_equal(as_nobody("ln -s %s %s", created, path), 0);
    assert_int_equal(tio_trace_save(t, path), -ELOOP);
    assert_int_equal(stat(created, &st), -1);
    tio_trace_destroy(t);
}

/* A file or FIFO of another user's at the target: a file is replaced by one
 * of root's, mode 0600 (never the planted mode); a FIFO is not written. */
static void test_saves_replace_files_of_another_user(void **state)
{
    skip_unless_nobody();
    tio_trace *t = small_trace();
    char path[PATH_MAX + 64];
    struct stat st;
    in_shared(path, "other.tio");
    assert_int_equal(as_nobody("echo planted > %s && chmod 0666 %s", path, path), 0);
    assert_int_equal(tio_trace_save(t, path), 0);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_uid, 0);
    assert_int_equal(st.st_mode & 07777, 0600);
    tio_trace *back;
    assert_int_equal(tio_trace_load(path, &back), 0);
    tio_trace_destroy(back);

    in_shared(path, "fifo.tio");
    assert_int_equal(as_nobody("mkfifo -m 0666 %s", path), 0);
    assert_int_equal(tio_trace_save(t, path), -EACCES);
    char want[2 * PATH_MAX];
    snprintf(want, sizeof want, "%s: cannot write: a FIFO owned by another user (uid %u)", path,
             (unsigned)g_nobody);
    assert_string_equal(tio_last_error(), want);
    tio_trace_destroy(t);
}

/* Temporary files of a target that a killed writer left behind are removed
 * at the next save (500 kill -9 saves left 369 before); one whose writer
 * still holds its lock is kept, as are other users' files. */
static void test_stale_temporary_files_are_removed(void **state)
{
    skip_unless_nobody();
    tio_trace *t = small_trace();
    char path[PATH_MAX + 64], dead[PATH_MAX + 96], live[PATH_MAX + 96], theirs[PATH_MAX + 96];
    in_shared(path, "st.tio");
    snprintf(dead, sizeof dead, "%s.tmp.7b.00112233aabbccdd", path);
    snprintf(live, sizeof live, "%s.tmp.7c.0123456789abcdef", path);
    snprintf(theirs, sizeof theirs, "%s.tmp.7d.fedcba9876543210", path);
    int fd = open(dead, O_WRONLY | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    close(fd);
    int held = open(live, O_WRONLY | O_CREAT | O_EXCL, 0600);
    assert_true(held >= 0);
    assert_int_equal(flock(held, LOCK_EX), 0);
    assert_int_equal(as_nobody("touch %s", theirs), 0);
    assert_int_equal(tio_trace_save(t, path), 0);
    struct stat st;
    assert_int_equal(stat(dead, &st), -1);
    assert_int_equal(stat(live, &st), 0);
    assert_int_equal(stat(theirs, &st), 0);
    close(held);
    assert_int_equal(tio_trace_save(t, path), 0);
    assert_int_equal(stat(live, &st), -1);
    assert_int_equal(stat(theirs, &st), 0);
    tio_trace_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_saves_refuse_links_planted_by_another_user),
        cmocka_unit_test(test_saves_replace_files_of_another_user),
        cmocka_unit_test(test_stale_temporary_files_are_removed),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
