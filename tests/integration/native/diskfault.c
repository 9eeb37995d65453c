/* A disk that misbehaves on command, for gray-failure tests (tests/integration/diskfault.py): loaded into a
 * broker process with LD_PRELOAD, it wraps fsync, fdatasync, write, pwrite and pwrite64. For files under
 * DISKFAULT_PREFIX it reads DISKFAULT_CONTROL (at most every 50 ms) and then:
 *   "slow MS"  sleeps MS milliseconds before each fsync/fdatasync (a disk whose flushes take seconds)
 *   "eio"      fails each fsync/fdatasync and write with EIO (a dying disk)
 *   anything else, or no file: passes every call through. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

enum mode { PASS, SLOW, EIO_ };
static enum mode cached_mode = PASS;
static long cached_ms = 0;
static struct timespec checked_at = {0, 0};

static void refresh(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long elapsed = (now.tv_sec - checked_at.tv_sec) * 1000 + (now.tv_nsec - checked_at.tv_nsec) / 1000000;
    if (checked_at.tv_sec != 0 && elapsed < 50) return;
    checked_at = now;
    cached_mode = PASS;
    const char *control = getenv("DISKFAULT_CONTROL");
    if (control == NULL) return;
    FILE *f = fopen(control, "r");
    if (f == NULL) return;
    char word[16] = {0};
    long ms = 0;
    int got = fscanf(f, "%15s %ld", word, &ms);
    fclose(f);
    if (got >= 1 && strcmp(word, "eio") == 0) cached_mode = EIO_;
    if (got == 2 && strcmp(word, "slow") == 0) { cached_mode = SLOW; cached_ms = ms; }
}

static int under_prefix(int fd) {
    const char *prefix = getenv("DISKFAULT_PREFIX");
    if (prefix == NULL || fd < 0) return 0;
    char link[64], path[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return 0;
    path[n] = 0;
    return strncmp(path, prefix, strlen(prefix)) == 0;
}

static enum mode mode_for(int fd) {
    refresh();
    if (cached_mode == PASS || !under_prefix(fd)) return PASS;
    return cached_mode;
}

static int flush_fault(int fd) {
    enum mode m = mode_for(fd);
    if (m == EIO_) { errno = EIO; return -1; }
    if (m == SLOW) {
        struct timespec pause = {cached_ms / 1000, (cached_ms % 1000) * 1000000L};
        nanosleep(&pause, NULL);
    }
    return 0;
}

int fsync(int fd) {
    static int (*real)(int) = NULL;
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    if (flush_fault(fd) < 0) return -1;
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int) = NULL;
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    if (flush_fault(fd) < 0) return -1;
    return real(fd);
}

ssize_t write(int fd, const void *buf, size_t count) {
    static ssize_t (*real)(int, const void *, size_t) = NULL;
    if (!real) real = (ssize_t (*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
    if (fd > 2 && mode_for(fd) == EIO_) { errno = EIO; return -1; }
    return real(fd, buf, count);
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset) {
    static ssize_t (*real)(int, const void *, size_t, off_t) = NULL;
    if (!real) real = (ssize_t (*)(int, const void *, size_t, off_t))dlsym(RTLD_NEXT, "pwrite");
    if (mode_for(fd) == EIO_) { errno = EIO; return -1; }
    return real(fd, buf, count, offset);
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off_t offset) {
    static ssize_t (*real)(int, const void *, size_t, off_t) = NULL;
    if (!real) real = (ssize_t (*)(int, const void *, size_t, off_t))dlsym(RTLD_NEXT, "pwrite64");
    if (mode_for(fd) == EIO_) { errno = EIO; return -1; }
    return real(fd, buf, count, offset);
}
