/*
 * engine/backing_file.c — one preallocated backing file per SSD directory:
 * checking the directory, creating and preallocating the file, and the probe
 * that decides between O_DIRECT and buffered I/O by doing a real aligned
 * write and read.
 *
 * Why preallocate: a full disk then shows at create time (-ENOSPC), never
 * halfway through an offload.  Why a random name and a lock: another user's
 * file must not be able to block ours (a predictable name made create fail
 * with EEXIST), and a file whose lock nobody holds belongs to a job that
 * died, so the next engine in that directory removes it (and logs it).  Why probe with real I/O: file systems that
 * refuse O_DIRECT (tmpfs, some FUSE and network file systems) accept the
 * open flag on some kernels and fail only the first transfer.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "engine/engine_internal.h"

int tio_dir_check(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        int err = errno;
        if (err == ENOENT)
            return tio_fail(-ENOENT, "ssd directory '%s' does not exist", path);
        if (err == ENOTDIR)
            return tio_fail(-ENOTDIR, "ssd directory '%s': a component of the path is not a "
                            "directory", path);
        return tio_fail(-err, "ssd directory '%s': %s", path, strerror(err));
    }
    if (!S_ISDIR(st.st_mode))
        return tio_fail(-ENOTDIR, "ssd directory '%s' is not a directory", path);
    if (access(path, W_OK | X_OK) != 0)
        return tio_fail(-EACCES, "ssd directory '%s' is not writable", path);
    return 0;
}

/* Write a 4 KiB pattern at offset 0 and read it back through `fd`.
 * Returns 0 or -errno. */
static int probe_pio(int fd)
{
    void *buf;
    if (posix_memalign(&buf, TIO_EXTENT_ALIGN, 2 * TIO_EXTENT_ALIGN) != 0)
        return -ENOMEM;
    unsigned char *w = buf, *r = w + TIO_EXTENT_ALIGN;
    for (uint32_t i = 0; i < TIO_EXTENT_ALIGN; i++)
        w[i] = (unsigned char)(i * 7u + 1u);
    int rc = 0;
    ssize_t n = pwrite(fd, w, TIO_EXTENT_ALIGN, 0);
    if (n != (ssize_t)TIO_EXTENT_ALIGN)
        rc = n < 0 ? -errno : -EIO;
    if (!rc) {
        n = pread(fd, r, TIO_EXTENT_ALIGN, 0);
        if (n != (ssize_t)TIO_EXTENT_ALIGN)
            rc = n < 0 ? -errno : -EIO;
        else if (memcmp(w, r, TIO_EXTENT_ALIGN) != 0)
            rc = -EIO;
    }
    free(buf);
    return rc;
}

static int preallocate(tio_dir *d)
{
    if (fallocate(d->fd, 0, 0, (off_t)d->file_bytes) == 0)
        return 0;
    int err = errno;
    if (err == EOPNOTSUPP)
        err = ftruncate(d->fd, (off_t)d->file_bytes) == 0 ? 0 : errno;
    if (err)
        return tio_fail(-err, "cannot preallocate %llu bytes for '%s': %s",
                        (unsigned long long)d->file_bytes, d->file, strerror(err));
    return 0;
}

/* A backing file's name: "teraio.<pid>.<hex>.<dir index>.data" (the hex
 * part was a per-process counter before it became random; both match). */
static bool is_backing_file(const char *name)
{
    const char *p = name;
    if (strncmp(p, "teraio.", 7) != 0)
        return false;
    p += 7;
    static const char *const parts[3] = {"0123456789", "0123456789abcdef", "0123456789"};
    for (int i = 0; i < 3; i++) {
        size_t n = strspn(p, parts[i]);
        if (n == 0 || p[n] != '.')
            return false;
        p += n + 1;
    }
    return strcmp(p, "data") == 0;
}

static void log_removed(const char *name, void *ctx)
{
    const tio_dir *d = ctx;
    tio_log(TIO_LOG_WARN, "engine: removed stale backing file '%s/%s' (no process holds its "
            "lock: the job that made it is gone)", d->path, name);
}

static bool is_backing_file_of(const char *name, void *ctx)
{
    return is_backing_file(name);
}

/* Create the backing file under a fresh random name, locked, with O_DIRECT
 * unless `buffered`.  Returns the descriptor or -errno. */
static int create_file(tio_dir *d, bool buffered)
{
    size_t len = strlen(d->path) + 80;
    free(d->file);
    free(d->name);
    d->file = malloc(len);
    d->name = malloc(64);
    if (!d->file || !d->name)
        return -ENOMEM;
    int fd = -EEXIST;
    for (int tries = 0; tries < 16 && (fd == -EEXIST || fd == -EAGAIN); tries++) {
        snprintf(d->name, 64, "teraio.%ld.%016llx.%u.data", (long)getpid(),
                 (unsigned long long)tio_random_u64(), d->index);
        snprintf(d->file, len, "%s/%s", d->path, d->name);
        fd = tio_create_locked(d->dirfd, d->name, O_RDWR | (buffered ? 0 : O_DIRECT), 0600);
    }
    return fd;
}

int tio_backing_file_open(tio_engine *e, tio_dir *d)
{
    d->dirfd = open(d->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d->dirfd < 0) {
        int err = errno;
        return tio_fail(-err, "ssd directory '%s': cannot open: %s", d->path, strerror(err));
    }
    /* Backing files whose lock nobody holds were left by a job that died
     * (kill -9, OOM killer, a node reset): they only take space. */
    tio_remove_unlocked(d->dirfd, is_backing_file_of, d, log_removed);
    bool refuse_direct = e->test.probe_fail & TIO_PROBE_FAIL_ODIRECT;
    d->fd = refuse_direct ? -EINVAL : create_file(d, false);
    d->direct = true;
    if (d->fd == -EINVAL) {
        d->fd = create_file(d, true);
        d->direct = false;
    }
    if (d->fd < 0) {
        int err = -d->fd;
        d->fd = -1;
        if (!d->file)
            return tio_fail(-ENOMEM, "engine: out of memory");
        return tio_fail(-err, "cannot create backing file '%s': %s", d->file, strerror(err));
    }
    d->created = true;
    int rc = preallocate(d);
    if (rc)
        return rc;
    rc = probe_pio(d->fd);
    if (rc == -EINVAL && d->direct) {
        /* O_DIRECT accepted at open, refused at the first transfer: turn it
         * off on the same descriptor, which keeps the lock. */
        if (fcntl(d->fd, F_SETFL, fcntl(d->fd, F_GETFL) & ~O_DIRECT) != 0) {
            int err = errno;
            return tio_fail(-err, "cannot turn O_DIRECT off for '%s': %s", d->file,
                            strerror(err));
        }
        d->direct = false;
        rc = probe_pio(d->fd);
    }
    if (rc)
        return tio_fail(rc, "probe write/read of 4096 bytes in '%s' failed: %s", d->file,
                        tio_strerror(rc));
    if (!d->direct) {
        char text[300];
        snprintf(text, sizeof text, "buffered I/O: O_DIRECT refused by %s", d->path);
        tio_engine_append_reason(e, text);
        tio_log(TIO_LOG_WARN, "engine: %s%s: data goes through the page cache (slower, uses "
                "host memory)", text, refuse_direct ? " (forced by a test hook)" : "");
    }
    return 0;
}

void tio_backing_file_close(tio_dir *d)
{
    if (d->created && d->dirfd >= 0)
        unlinkat(d->dirfd, d->name, 0); /* before close: the lock covers it */
    d->created = false;
    if (d->fd >= 0)
        close(d->fd);
    d->fd = -1;
    if (d->dirfd >= 0)
        close(d->dirfd);
    d->dirfd = -1;
}
