/*
 * engine/backing_file.c — one preallocated backing file per SSD directory:
 * checking the directory, creating and preallocating the file, and the probe
 * that decides between O_DIRECT and buffered I/O by doing a real aligned
 * write and read.
 *
 * Why preallocate: a full disk then shows at create time (-ENOSPC), never
 * halfway through an offload.  Why probe with real I/O: file systems that
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

int tio_backing_file_open(tio_engine *e, tio_dir *d, unsigned seq)
{
    size_t len = strlen(d->path) + 64;
    d->file = malloc(len);
    if (!d->file)
        return tio_fail(-ENOMEM, "engine: out of memory");
    snprintf(d->file, len, "%s/teraio.%ld.%u.%u.data", d->path, (long)getpid(), seq, d->index);
    int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
    bool refuse_direct = e->test.probe_fail & TIO_PROBE_FAIL_ODIRECT;
    d->fd = refuse_direct ? -1 : open(d->file, flags | O_DIRECT, 0600);
    d->direct = true;
    if (refuse_direct)
        errno = EINVAL;
    if (d->fd < 0 && errno == EINVAL) {
        d->fd = open(d->file, flags, 0600);
        d->direct = false;
    }
    if (d->fd < 0) {
        int err = errno;
        return tio_fail(-err, "cannot create backing file '%s': %s", d->file, strerror(err));
    }
    d->created = true;
    int rc = preallocate(d);
    if (rc)
        return rc;
    rc = probe_pio(d->fd);
    if (rc == -EINVAL && d->direct) {
        close(d->fd);
        d->fd = open(d->file, O_RDWR | O_CLOEXEC);
        d->direct = false;
        if (d->fd < 0) {
            int err = errno;
            return tio_fail(-err, "cannot reopen backing file '%s': %s", d->file, strerror(err));
        }
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
    if (d->fd >= 0)
        close(d->fd);
    d->fd = -1;
    if (d->created)
        unlink(d->file);
    d->created = false;
}
