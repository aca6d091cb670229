/*
 * common/atomic_file.c — files that only ever appear whole (trace, plan and
 * loader-state saves) and files that say whether their creator still lives
 * (temporary files, the engine's backing files).
 *
 * A save writes a temporary file next to the target and renames it over the
 * target, so a reader sees the old file or the new one, never half of one.
 * Shared directories (/tmp, a scratch folder of a cluster) make this an
 * attack surface: another user can plant a symbolic link where the target
 * or the temporary file will be, and a program that follows it overwrites
 * whatever the link names with its own rights.  So the temporary file is
 * created with O_CREAT|O_EXCL|O_NOFOLLOW under an unpredictable name,
 * through a descriptor of the target's directory (openat), and renamed with
 * renameat, which replaces a link instead of following it; a target that is
 * a symbolic link is refused, and a link owned by another user is never
 * followed at all.
 *
 * Liveness: the creator of a temporary or backing file holds an exclusive
 * flock on it for as long as it lives; the kernel drops the lock when the
 * process dies, however it dies.  tio_remove_unlocked deletes the files of a
 * naming pattern whose lock nobody holds: what a killed job left behind.
 * tio_create_locked closes the window between creating a file and locking it
 * by checking, once locked, that the name still is its file (a concurrent
 * clean-up may have taken the name in that window: then it tries again).
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>

#include "common/util.h"

#define CREATE_TRIES 16

uint64_t tio_random_u64(void)
{
    uint64_t v;
    if (getrandom(&v, sizeof v, GRND_NONBLOCK) == (ssize_t)sizeof v)
        return v;
    /* No entropy yet (early boot): unique enough for a file name. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    v = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec << 20 ^
        (uint64_t)getpid() << 40 ^ tio_now_ns();
    return v;
}

/* Is the file at `fd` still the one `name` names in `dirfd`? */
static bool name_is(int dirfd, const char *name, int fd)
{
    struct stat a, b;
    return fstat(fd, &a) == 0 && fstatat(dirfd, name, &b, AT_SYMLINK_NOFOLLOW) == 0 &&
           a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

int tio_create_locked(int dirfd, const char *name, int flags, mode_t mode)
{
    int fd = openat(dirfd, name, flags | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0)
        return -errno;
    int rc;
    while ((rc = flock(fd, LOCK_EX)) != 0 && errno == EINTR)
        ;
    if (rc != 0) {
        int e = errno;
        unlinkat(dirfd, name, 0);
        close(fd);
        return -e;
    }
    if (!name_is(dirfd, name, fd)) {
        close(fd); /* a clean-up removed it before we locked it */
        return -EAGAIN;
    }
    return fd;
}

int tio_remove_unlocked(int dirfd, bool (*match)(const char *name, void *ctx), void *ctx,
                        void (*removed)(const char *name, void *ctx))
{
    int dup_fd = dup(dirfd);
    DIR *dir = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
    if (!dir) {
        int e = errno;
        if (dup_fd >= 0)
            close(dup_fd);
        return -e;
    }
    rewinddir(dir);
    int n = 0;
    for (struct dirent *de; (de = readdir(dir));) {
        if (!match(de->d_name, ctx))
            continue;
        int fd = openat(dirfd, de->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0)
            continue;
        struct stat st;
        if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
            flock(fd, LOCK_EX | LOCK_NB) == 0 && name_is(dirfd, de->d_name, fd) &&
            unlinkat(dirfd, de->d_name, 0) == 0) {
            n++;
            if (removed)
                removed(de->d_name, ctx);
        }
        close(fd);
    }
    closedir(dir);
    return n;
}

/* ---- atomic saves ------------------------------------------------------ */

/* Open `path` itself for writing: a character device (/dev/null), a FIFO
 * or a socket cannot be replaced by a file, and must not be.  O_NONBLOCK
 * makes a FIFO without a reader fail (ENXIO) instead of waiting forever. */
static int open_in_place(tio_atomic_file *af, const char *path, bool fifo)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd >= 0) {
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
        if (!(af->f = fdopen(fd, "w")))
            close(fd);
    }
    if (!af->f) {
        int e = errno;
        tio_atomic_abort(af);
        if (fifo && e == ENXIO)
            return tio_fail(-e, "%s: cannot write: no process reads this FIFO", path);
        return tio_fail(-e, "%s: cannot open for writing: %s", path, strerror(e));
    }
    return 0;
}

static bool ours(const struct stat *st)
{
    return st->st_uid == geteuid() || st->st_uid == 0;
}

static bool special(mode_t m)
{
    return S_ISFIFO(m) || S_ISCHR(m) || S_ISSOCK(m);
}

/* A temporary file of the target `ctx` (a name in the same directory):
 * "<target>.tmp.<hex digits and dots>". */
static bool is_tmp_of(const char *name, void *ctx)
{
    const char *target = ctx;
    size_t n = strlen(target);
    if (strncmp(name, target, n) != 0 || strncmp(name + n, ".tmp.", 5) != 0 || !name[n + 5])
        return false;
    return strspn(name + n + 5, "0123456789abcdef.") == strlen(name + n + 5);
}

static void log_removed_tmp(const char *name, void *ctx)
{
    tio_log(TIO_LOG_INFO, "removed stale temporary file '%s' (its writer is gone)", name);
}

/* The checks before an atomic replace; *keep_mode gets the mode to keep
 * (-1: new file, 0600).  Returns 1 to write in place, 0 to replace, or an
 * error (the message names the path). */
static int check_target(int dirfd, const char *base, const char *path, int *keep_mode)
{
    struct stat lst, st;
    *keep_mode = -1;
    if (fstatat(dirfd, base, &lst, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT)
            return 0;
        return tio_fail(-errno, "%s: cannot write: %s", path, strerror(errno));
    }
    if (S_ISLNK(lst.st_mode)) {
        if (!ours(&lst))
            return tio_fail(-ELOOP, "%s: cannot write: a symbolic link owned by another user "
                            "(uid %u), not followed", path, (unsigned)lst.st_uid);
        if (fstatat(dirfd, base, &st, 0) != 0)
            return tio_fail(-ENOENT, "%s: cannot write: a symbolic link to a missing file", path);
        if (S_ISDIR(st.st_mode))
            return tio_fail(-EISDIR, "%s: cannot write: is a directory", path);
        if (!special(st.st_mode))
            return tio_fail(-ELOOP, "%s: cannot write: a symbolic link; saves replace the file "
                            "atomically and do not write through links (give the path it "
                            "names)", path);
        lst = st; /* /dev/stdout and the like */
    }
    if (S_ISDIR(lst.st_mode))
        return tio_fail(-EISDIR, "%s: cannot write: is a directory", path);
    if (S_ISBLK(lst.st_mode))
        return tio_fail(-EINVAL, "%s: cannot write: a block device", path);
    if (special(lst.st_mode)) {
        if (!ours(&lst))
            return tio_fail(-EACCES, "%s: cannot write: a %s owned by another user (uid %u)",
                            path, S_ISFIFO(lst.st_mode) ? "FIFO" : "special file",
                            (unsigned)lst.st_uid);
        return 1;
    }
    if (lst.st_uid == geteuid())
        *keep_mode = (int)(lst.st_mode & 07777);
    return 0;
}

int tio_atomic_open(tio_atomic_file *af, const char *path)
{
    memset(af, 0, sizeof *af);
    af->dirfd = -1;
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (!(af->path = strdup(path)) || !(af->name = strdup(base))) {
        tio_atomic_abort(af);
        return tio_fail(-ENOMEM, "%s: out of memory", path);
    }
    if (!base[0] || !strcmp(base, ".") || !strcmp(base, "..")) {
        tio_atomic_abort(af);
        return tio_fail(-EISDIR, "%s: cannot write: is a directory", path);
    }
    char *dir = slash ? strndup(path, (size_t)(slash - path) + (slash == path)) : strdup(".");
    af->dirfd = dir ? open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    int e = errno;
    free(dir);
    if (af->dirfd < 0) {
        tio_atomic_abort(af);
        return tio_fail(-e, "%s: cannot open its directory: %s", path, strerror(e));
    }
    int keep_mode;
    int rc = check_target(af->dirfd, base, path, &keep_mode);
    if (rc == 1) {
        struct stat st;
        bool fifo = fstatat(af->dirfd, base, &st, 0) == 0 && S_ISFIFO(st.st_mode);
        close(af->dirfd);
        af->dirfd = -1;
        return open_in_place(af, path, fifo);
    }
    if (rc != 0) {
        tio_atomic_abort(af);
        return rc;
    }
    tio_remove_unlocked(af->dirfd, is_tmp_of, af->name, log_removed_tmp);
    size_t n = strlen(base) + 48;
    if (!(af->tmp_name = malloc(n))) {
        tio_atomic_abort(af);
        return tio_fail(-ENOMEM, "%s: out of memory", path);
    }
    int fd = -EEXIST;
    for (int i = 0; i < CREATE_TRIES && (fd == -EEXIST || fd == -EAGAIN); i++) {
        snprintf(af->tmp_name, n, "%s.tmp.%x.%016llx", base, (unsigned)getpid(),
                 (unsigned long long)tio_random_u64());
        fd = tio_create_locked(af->dirfd, af->tmp_name, O_WRONLY, 0600);
    }
    e = fd < 0 ? -fd : 0;
    if (!e && keep_mode >= 0 && fchmod(fd, (mode_t)keep_mode) != 0)
        e = errno;
    if (!e && !(af->f = fdopen(fd, "w")))
        e = errno;
    if (e) {
        if (fd >= 0) {
            unlinkat(af->dirfd, af->tmp_name, 0);
            close(fd);
        }
        free(af->tmp_name);
        af->tmp_name = NULL;
        tio_atomic_abort(af);
        return tio_fail(-e, "%s: cannot create a temporary file next to it: %s", path,
                        strerror(e));
    }
    return 0;
}

int tio_atomic_commit(tio_atomic_file *af)
{
    int e = 0;
    errno = 0;
    if (fflush(af->f) != 0 || ferror(af->f))
        e = errno ? errno : EIO;
    else if (af->tmp_name && fsync(fileno(af->f)) != 0)
        e = errno;
    /* Rename while the file is still open: its lock keeps a clean-up away. */
    if (!e && af->tmp_name && renameat(af->dirfd, af->tmp_name, af->dirfd, af->name) != 0)
        e = errno;
    if (!e && af->tmp_name) {
        free(af->tmp_name);
        af->tmp_name = NULL;
        fsync(af->dirfd); /* the new name survives a crash too */
    }
    int rc = e ? tio_fail(-e, "%s: write failed: %s", af->path, strerror(e)) : 0;
    if (fclose(af->f) != 0 && !rc)
        rc = tio_fail(-errno, "%s: write failed: %s", af->path, strerror(errno));
    af->f = NULL;
    tio_atomic_abort(af);
    return rc;
}

void tio_atomic_abort(tio_atomic_file *af)
{
    if (af->tmp_name && af->dirfd >= 0)
        unlinkat(af->dirfd, af->tmp_name, 0);
    if (af->f)
        fclose(af->f);
    if (af->dirfd >= 0)
        close(af->dirfd);
    free(af->path);
    free(af->name);
    free(af->tmp_name);
    memset(af, 0, sizeof *af);
    af->dirfd = -1;
}
