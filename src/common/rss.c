/*
 * common/rss.c — the process's resident set as the OS counts it, for the
 * runtime's and the pager's statistics: the memory a cgroup limit or the
 * OOM killer sees, beside the resident bytes teraio accounts for tensors.
 *
 * /proc/self/statm's second field is the resident pages.  The file is
 * opened once and read with pread at offset 0 (the kernel regenerates it
 * on each read), so a sample costs one system call.
 */
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/util.h"

uint64_t tio_process_rss_bytes(void)
{
    static atomic_int fd = -1;
    int f = atomic_load(&fd);
    if (f < 0) {
        int opened = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
        if (opened < 0)
            return 0;
        int expected = -1;
        if (atomic_compare_exchange_strong(&fd, &expected, opened))
            f = opened;
        else {
            close(opened);
            f = expected;
        }
    }
    char buf[128];
    ssize_t n = pread(f, buf, sizeof buf - 1, 0);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    char *end;
    strtoull(buf, &end, 10);            /* total program size */
    unsigned long long pages = strtoull(end, NULL, 10);
    long page = sysconf(_SC_PAGESIZE);
    return (uint64_t)pages * (uint64_t)(page > 0 ? page : 4096);
}
