/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_base.h — libddp's foundation: result codes, dtypes, reduction ops, log levels, the
 * allocator type, DDP_API, and (in the implementation) the private helpers every other libddp
 * header shares: clocks, allocation, string and environment parsing, logging.
 *
 * Users never include it themselves: every libddp header includes it. It depends on nothing.
 * Its implementation is built by whichever libddp header that needs it sees DDP_IMPLEMENTATION
 * (ddp_sampler.h only needs the declarations, so the sampler stays usable with plain C99).
 *
 * BUILD OPTIONS (define before including any libddp header)
 *   DDP_STATIC             global           every public function static (a private copy)
 *   DDP_MALLOC/DDP_FREE    impl. file only  allocator; define both or neither
 *   DDP_ASSERT(c)          impl. file only  checks for programmer bugs only (default: assert)
 *
 * FEATURE MACROS: none needed. The implementation file may include its own system headers
 * first and define no feature macro, as C99/C11 (strict -std=c99 too) or C++. libddp calls
 * nothing that glibc hides behind _GNU_SOURCE (accept4, pipe2 and sched_getaffinity go through
 * syscall(2), SO_PEERCRED's struct ucred is spelled out); it needs POSIX.1-2008 plus glibc's
 * default extras (syscall, usleep, MAP_ANONYMOUS): the set glibc calls _DEFAULT_SOURCE, which
 * every compiler mode but a strict -std=cNN gives by default. When neither _DEFAULT_SOURCE nor
 * _GNU_SOURCE is in effect, the implementation defines _DEFAULT_SOURCE before its own system
 * headers and, if <features.h> has already run (an earlier #include), runs it again, so every
 * system header included from there on has POSIX. ISO C headers included before that keep
 * their ISO-only contents: libddp uses nothing POSIX from <stdio.h>, <stdlib.h> or <string.h>,
 * and declares what it uses of <time.h> (clock_gettime, nanosleep, gmtime_r, the two clock ids, exactly
 * as POSIX and Linux define them) when that came first without them. A POSIX header included
 * first under strict ISO C cannot be repaired and stops the build with an #error that says so.
 * The rest of that file sees _DEFAULT_SOURCE; code of your own there that uses POSIX should still
 * ask for it at the top, as POSIX says: glibc's later headers may count on the earlier ones
 * having it (<sys/wait.h> leaves WIFEXITED & co. to an ISO-only <stdlib.h>).
 */
/* The feature set (above), chosen before any system header of the implementation, ddp_base.h's
 * own <stdint.h> included. glibc's <features.h> (guard _FEATURES_H) starts by undefining all it
 * derived, so including it again recomputes the set; musl's (same guard) derives _BSD_SOURCE
 * from _DEFAULT_SOURCE, and its headers test that at each include. A POSIX header that came
 * first without that set is past repair (its guard keeps the rest out): say so. */
#if defined(DDP_BASE_IMPLEMENTATION) && !defined(_DEFAULT_SOURCE) && !defined(_GNU_SOURCE)
#if defined(__GLIBC__) && !defined(__USE_MISC) && (defined(_UNISTD_H) || defined(_FCNTL_H) || \
    defined(_NETDB_H) || defined(_SYS_SOCKET_H) || defined(_SYS_MMAN_H) || defined(_NET_IF_H))
#error "libddp: <unistd.h>, <fcntl.h>, <netdb.h>, <sys/socket.h>, <sys/mman.h> or <net/if.h> came before libddp's implementation without glibc's default features (strict -std=cNN and no feature macro, or _POSIX_C_SOURCE/_XOPEN_SOURCE alone), so it lacks what libddp needs (syscall, SO_PEERCRED, ...): include it after libddp, or define _DEFAULT_SOURCE at the top of the file"
#endif
#define _DEFAULT_SOURCE 1
#ifdef _FEATURES_H
#undef _FEATURES_H
#include <features.h>
#endif
#endif
/* DDP_IMPLEMENTATION builds the names (ddp_strerror & co.) here; the private helpers are built
 * when a header that uses them asks (DDP_BASE_IMPLEMENTATION). */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_BASE_NAMES_IMPLEMENTATION)
#define DDP_BASE_NAMES_IMPLEMENTATION
#endif
#ifndef DDP_BASE_H_INCLUDED
#define DDP_BASE_H_INCLUDED

#include <stddef.h>
#include <stdint.h>

/* The one definition of DDP_API: every libddp header gets it from here, so headers included
 * in any order agree (an unused static function is no warning under DDP_STATIC). */
#ifndef DDP_API
#if defined(DDP_STATIC) && (defined(__GNUC__) || defined(__clang__))
#define DDP_API static __attribute__((unused))
#elif defined(DDP_STATIC)
#define DDP_API static
#else
#define DDP_API extern
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define DDP_VERSION_MAJOR 0
#define DDP_VERSION_MINOR 2

typedef enum { DDP_SUCCESS = 0, DDP_ERR_INVALID_ARGUMENT, DDP_ERR_INVALID_USAGE, DDP_ERR_SYSTEM,
               DDP_ERR_REMOTE, DDP_ERR_TIMEOUT, DDP_ERR_ABORTED, DDP_ERR_OUT_OF_MEMORY,
               DDP_ERR_MISMATCH, DDP_ERR_AUTH, DDP_ERR_UNSUPPORTED, DDP_ERR_INTERNAL,
               DDP_ERR_REMOVED } ddp_result_t;
#define DDP_NUM_RESULTS 13

/* Values are NCCL's (ncclDataType_t / ncclRedOp_t), so the NCCL transport can cast directly. */
typedef enum { DDP_INT8 = 0, DDP_UINT8, DDP_INT32, DDP_UINT32, DDP_INT64, DDP_UINT64,
               DDP_FLOAT16, DDP_FLOAT32, DDP_FLOAT64, DDP_BFLOAT16 } ddp_dtype_t;
#define DDP_NUM_DTYPES 10
typedef enum { DDP_SUM = 0, DDP_PROD, DDP_MAX, DDP_MIN, DDP_AVG } ddp_op_t;
#define DDP_NUM_OPS 5

typedef enum { DDP_LOG_NONE = 0, DDP_LOG_WARN, DDP_LOG_INFO, DDP_LOG_TRACE } ddp_log_level_t;
/* A trainer's logger (desc.log_fn): each line of libddp's log, without libddp's prefix, with its
 * level and rank (-1 before the rank is known). Called from libddp's threads too. */
typedef void (*ddp_log_fn_t)(void *user, ddp_log_level_t level, int rank, const char *msg);

/* What operation a call is: the one numbering of libddp's operations, used by the algorithms'
 * message tags and their digests, the communicator's queue and log lines, and the transports
 * (ddp_device_call_t's kind, the signatures of collectives a transport runs itself). The values
 * are part of the transport ABI (transports/ddp_transport.h) and of every message's tag digest:
 * never renumber, only append before the end. */
typedef enum {
    DDP_CALL_ALL_REDUCE = 1, DDP_CALL_REDUCE_SCATTER, DDP_CALL_ALL_GATHER, DDP_CALL_BROADCAST,
    DDP_CALL_BARRIER, DDP_CALL_REDUCE, DDP_CALL_GATHER, DDP_CALL_SCATTER, DDP_CALL_ALL_TO_ALL,
    DDP_CALL_SEND, DDP_CALL_RECV
} ddp_call_kind_t;

/* Run-time allocator (all or none). Zero = DDP_MALLOC/DDP_FREE. */
typedef struct ddp_allocator {
    void *(*alloc)(size_t size, void *user);
    void (*free)(void *ptr, void *user);
    void *user;
} ddp_allocator_t;

DDP_API const char *ddp_strerror(ddp_result_t r);                   /* never NULL */
DDP_API size_t ddp_dtype_size(ddp_dtype_t dtype);                   /* 0 if invalid */
DDP_API const char *ddp_dtype_name(ddp_dtype_t dtype);              /* "float32", ... */
DDP_API const char *ddp_op_name(ddp_op_t op);                       /* "sum", ... */

#ifdef __cplusplus
}
#endif
#endif /* DDP_BASE_H_INCLUDED */

/* ============================================================================================
 * IMPLEMENTATION: the names (no system dependency: ddp_sampler.h builds them too) ...
 * ========================================================================================== */
#if (defined(DDP_BASE_IMPLEMENTATION) || defined(DDP_BASE_NAMES_IMPLEMENTATION)) && \
    !defined(DDP_BASE_NAMES_IMPL_INCLUDED)
#define DDP_BASE_NAMES_IMPL_INCLUDED
/* The allocator macros, for every libddp implementation (the sampler's too): all or none. */
#include <stdlib.h>
#if defined(DDP_MALLOC) && defined(DDP_FREE)
#elif !defined(DDP_MALLOC) && !defined(DDP_FREE)
#define DDP_MALLOC(sz) malloc(sz)
#define DDP_FREE(p) free(p)
#else
#error "libddp: define both DDP_MALLOC and DDP_FREE, or neither"
#endif
/* ---------------------------------------------------------------- names */
DDP_API const char *ddp_strerror(ddp_result_t r) {
    switch (r) {
    case DDP_SUCCESS: return "success";
    case DDP_ERR_INVALID_ARGUMENT: return "invalid argument";
    case DDP_ERR_INVALID_USAGE: return "invalid usage";
    case DDP_ERR_SYSTEM: return "system call failed";
    case DDP_ERR_REMOTE: return "remote rank failed or disconnected";
    case DDP_ERR_TIMEOUT: return "timed out";
    case DDP_ERR_ABORTED: return "aborted";
    case DDP_ERR_OUT_OF_MEMORY: return "out of memory";
    case DDP_ERR_MISMATCH: return "ranks disagree (mismatched call, count, dtype or world size)";
    case DDP_ERR_AUTH: return "authentication failed (job secret or connection key)";
    case DDP_ERR_UNSUPPORTED: return "unsupported";
    case DDP_ERR_INTERNAL: return "internal error";
    case DDP_ERR_REMOVED: return "this rank was removed from the communicator by a shrink";
    }
    return "unknown ddp_result_t";
}

DDP_API size_t ddp_dtype_size(ddp_dtype_t d) {
    switch (d) {
    case DDP_INT8: case DDP_UINT8: return 1;
    case DDP_FLOAT16: case DDP_BFLOAT16: return 2;
    case DDP_INT32: case DDP_UINT32: case DDP_FLOAT32: return 4;
    case DDP_INT64: case DDP_UINT64: case DDP_FLOAT64: return 8;
    }
    return 0;
}

DDP_API const char *ddp_dtype_name(ddp_dtype_t d) {
    static const char *const names[DDP_NUM_DTYPES] = {"int8", "uint8", "int32", "uint32", "int64",
        "uint64", "float16", "float32", "float64", "bfloat16"};
    return ((unsigned)d < DDP_NUM_DTYPES) ? names[d] : "invalid-dtype";
}

DDP_API const char *ddp_op_name(ddp_op_t op) {
    static const char *const names[DDP_NUM_OPS] = {"sum", "prod", "max", "min", "avg"};
    return ((unsigned)op < DDP_NUM_OPS) ? names[op] : "invalid-op";
}

#endif /* DDP_BASE_NAMES_IMPLEMENTATION */

/* ============================================================================================
 * ... and the private helpers: _ddp_ / _DDP_, static, for the other libddp headers)
 * ========================================================================================== */
#if defined(DDP_BASE_IMPLEMENTATION) && !defined(DDP_BASE_IMPL_INCLUDED)
#define DDP_BASE_IMPL_INCLUDED

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sched.h>

/* <time.h> came first under strict ISO C (-std=c99 and no feature macro): its POSIX half was
 * left out, and its include guard keeps it out. What libddp uses of it, as POSIX declares it;
 * the clock ids are Linux's (<linux/time.h>). */
#if !defined(CLOCK_MONOTONIC) && defined(__linux__)
#if defined(_TIME_BITS) && _TIME_BITS == 64 && __SIZEOF_LONG__ == 4
#error "libddp: <time.h> was included under strict ISO C before libddp, with _TIME_BITS=64: include libddp first, or compile with -std=gnu99/-D_DEFAULT_SOURCE"
#endif
#define CLOCK_REALTIME 0
#define CLOCK_MONOTONIC 1
#ifdef __cplusplus
extern "C" {
#endif
extern int clock_gettime(clockid_t clock_id, struct timespec *tp);
extern int nanosleep(const struct timespec *rqtp, struct timespec *rmtp);
extern struct tm *gmtime_r(const time_t *timep, struct tm *result);
#ifdef __cplusplus
}
#endif
#endif

#ifndef DDP_ASSERT
#include <assert.h>
#define DDP_ASSERT(c) assert(c)
#endif

#if defined(__GNUC__) || defined(__clang__)
#define _DDP_PRIVATE static __attribute__((unused))
#else
#define _DDP_PRIVATE static
#endif

#define _DDP_DEFAULT_TIMEOUT_MS 600000
#define _DDP_DEFAULT_SPIN_US 50

/* ---------------------------------------------------------------- small utilities */
_DDP_PRIVATE int64_t _ddp_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Milliseconds left before deadline_us (a deadline of 0 means none): what poll() should get. */
_DDP_PRIVATE int _ddp_ms_left(int64_t deadline_us) {
    int64_t left;
    if (deadline_us == 0) return -1;
    left = deadline_us - _ddp_now_us();
    if (left <= 0) return 0;
    return left / 1000 > INT_MAX ? INT_MAX : (int)((left + 999) / 1000);
}

_DDP_PRIVATE int64_t _ddp_deadline(int timeout_ms) {
    return timeout_ms < 0 ? 0 : _ddp_now_us() + (int64_t)timeout_ms * 1000;
}

_DDP_PRIVATE void *_ddp_alloc(const ddp_allocator_t *a, size_t n) {
    return (a && a->alloc) ? a->alloc(n, a->user) : DDP_MALLOC(n);
}
_DDP_PRIVATE void _ddp_free(const ddp_allocator_t *a, void *p) {
    if (!p) return;
    if (a && a->free) a->free(p, a->user); else DDP_FREE(p);
}
_DDP_PRIVATE void *_ddp_calloc(const ddp_allocator_t *a, size_t n) {
    void *p = _ddp_alloc(a, n);
    if (p) memset(p, 0, n);
    return p;
}

_DDP_PRIVATE void _ddp_strlcpy(char *dst, const char *src, size_t cap) {
    size_t n;
    if (!cap) return;
    n = src ? strlen(src) : 0;
    if (n >= cap) n = cap - 1;
    if (n) memcpy(dst, src, n);
    dst[n] = 0;
}

/* Parses a whole decimal integer in [lo, hi]; 0 on success. */
_DDP_PRIVATE int _ddp_parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    long v;
    if (!s || !*s) return -1;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

_DDP_PRIVATE size_t _ddp_parse_size(const char *s) {
    char *end;
    unsigned long long v;
    if (!s || !*s) return 0;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno) return 0;
    if (*end == 'k' || *end == 'K') v <<= 10, end++;
    else if (*end == 'm' || *end == 'M') v <<= 20, end++;
    return *end ? 0 : (size_t)v;
}

/* DDP_DEBUG's level (NCCL_DEBUG's names); -1 for a value that is none of them. */
_DDP_PRIVATE int _ddp_log_level_parse(const char *s) {
    if (!s || !*s) return DDP_LOG_WARN;   /* failures are always told, as NCCL's WARN */
    if (!strcasecmp(s, "NONE") || !strcmp(s, "0") || !strcasecmp(s, "OFF")) return DDP_LOG_NONE;
    if (!strcasecmp(s, "WARN") || !strcasecmp(s, "VERSION")) return DDP_LOG_WARN;
    if (!strcasecmp(s, "INFO")) return DDP_LOG_INFO;
    if (!strcasecmp(s, "TRACE")) return DDP_LOG_TRACE;
    return -1;
}

/* An unknown value means WARN (the communicator's init says so). */
_DDP_PRIVATE int _ddp_log_level_from_env(void) {
    const int l = _ddp_log_level_parse(getenv("DDP_DEBUG"));
    return l < 0 ? DDP_LOG_WARN : l;
}

static const char *const _ddp_level_names[] = {"", "WARN", "INFO", "TRACE"};

/* One write(2) per line so ranks sharing a terminal never interleave mid-line. */
/* "[ddp rank 3] " (or "[ddp init] " before the rank is known), then for WARN the wall-clock time
 * in UTC (ISO 8601, to the millisecond: lines of several hosts sort together), then the level. */
_DDP_PRIVATE int _ddp_log_head(char *line, size_t cap, int rank, int level) {
    char when[48] = "";
    if (level == DDP_LOG_WARN) {
        struct timespec ts;
        struct tm tm;
        size_t k;
        clock_gettime(CLOCK_REALTIME, &ts);
        if (gmtime_r(&ts.tv_sec, &tm) && (k = strftime(when, sizeof when - 8, "%Y-%m-%dT%H:%M:%S", &tm)) > 0)
            snprintf(when + k, sizeof when - k, ".%03dZ ", (int)(ts.tv_nsec / 1000000) % 1000);
    }
    return rank < 0 ? snprintf(line, cap, "[ddp init] %s%s ", when, _ddp_level_names[level])
                    : snprintf(line, cap, "[ddp rank %d] %s%s ", rank, when, _ddp_level_names[level]);
}

/* Where a communicator's (or a store's) lines go: the user's function, else a descriptor
 * (stderr, or DDP_DEBUG_FILE's file). */
typedef struct {
    ddp_log_fn_t fn;
    void *user;
    int fd;
} _ddp_log_sink_t;

/* One line to a sink (NULL: stderr): one write(2), so ranks sharing a file never interleave. */
_DDP_PRIVATE void _ddp_log_emit(const _ddp_log_sink_t *k, int rank, int level, const char *msg) {
    char line[2048];
    int n;
    if (k && k->fn) { k->fn(k->user, (ddp_log_level_t)level, rank, msg); return; }
    n = _ddp_log_head(line, sizeof line, rank, level);
    if (n < 0 || (size_t)n >= sizeof line) return;
    n += snprintf(line + n, sizeof line - (size_t)n, "%s", msg);
    if ((size_t)n >= sizeof line - 1) n = (int)sizeof line - 2;
    line[n++] = '\n';
    if (write(k ? k->fd : 2, line, (size_t)n) < 0) { /* nowhere left to report it */ }
}

_DDP_PRIVATE void _ddp_vlog_to(const _ddp_log_sink_t *k, int rank, int level, const char *fmt, va_list ap) {
    char msg[1900];
    vsnprintf(msg, sizeof msg, fmt, ap);
    _ddp_log_emit(k, rank, level, msg);
}

_DDP_PRIVATE void _ddp_vlog(int rank, int level, const char *fmt, va_list ap) {
    _ddp_vlog_to(NULL, rank, level, fmt, ap);
}

_DDP_PRIVATE void _ddp_log_str(int rank, int level, const char *msg) {
    _ddp_log_emit(NULL, rank, level, msg);
}

/* A wait that lasts says what it waits for, at WARN: after 10 s, 30 s, 60 s, then every 5
 * minutes (often enough to see, seldom enough not to flood a log). */
_DDP_PRIVATE int64_t _ddp_next_wait_note_ms(int64_t waited_ms) {
    return waited_ms < 10000 ? 10000 : waited_ms < 30000 ? 30000 : waited_ms < 60000 ? 60000
           : (waited_ms / 300000 + 1) * 300000;
}

_DDP_PRIVATE int _ddp_env_timeout_ms(void) {
    long v;
    const char *e = getenv("DDP_TIMEOUT_MS");
    if (e && _ddp_parse_long(e, -1, INT_MAX, &v) == 0 && v != 0) return (int)v;
    return _DDP_DEFAULT_TIMEOUT_MS;
}

/* Reads an integer environment variable; 1 if present and valid, 0 if absent, -1 if malformed. */
_DDP_PRIVATE int _ddp_env_int(const char *name, long lo, long hi, long *out) {
    const char *s = getenv(name);
    if (!s) return 0;
    return _ddp_parse_long(s, lo, hi, out) == 0 ? 1 : -1;
}

_DDP_PRIVATE uint64_t _ddp_random64(void) {
    uint64_t v = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, &v, sizeof v) != (ssize_t)sizeof v) v = 0;
        close(fd);
    }
    if (!v) v = (uint64_t)_ddp_now_us() * 6364136223846793005ull ^ (uint64_t)getpid();
    return v;
}

/* A wait of base_us scaled by a pseudo-random 0.5..1.5 (splitmix64's finaliser over the clock,
 * the pid and a stack address): ranks refused together retry apart, as connect backoff needs. */
_DDP_PRIVATE int64_t _ddp_jitter_us(int64_t base_us) {
    int here = 0;
    uint64_t x = (uint64_t)_ddp_now_us() * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid() * 0xff51afd7ed558ccdull ^
                 (uint64_t)(uintptr_t)&here;
    if (base_us <= 0) return 0;
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return base_us / 2 + (int64_t)(x % (uint64_t)(base_us + 1));
}

/* ---------------------------------------------------------------- Linux calls glibc hides
 * accept4, pipe2 and sched_getaffinity are declared only under _GNU_SOURCE, which an includer's
 * earlier system headers may have settled without (FEATURE MACROS, above). The system calls
 * themselves do what glibc's wrappers do: close-on-exec stays atomic, so a fork + exec in
 * another thread never inherits the descriptor. */
/* libc's own accept4 and pipe2, not raw system calls: ThreadSanitizer (and any interposer)
 * must see them, or it loses the happens-before edges it draws through descriptors and reports
 * the shared-memory handshake between thread ranks as a race. glibc declares them only under
 * _GNU_SOURCE (musl under _BSD_SOURCE too, with the same prototypes): declared here otherwise. */
#if !defined(_GNU_SOURCE) && !defined(__cplusplus)
extern int accept4(int fd, struct sockaddr *addr, socklen_t *addrlen, int flags);
extern int pipe2(int fds[2], int flags);
#endif
_DDP_PRIVATE int _ddp_accept4(int fd, struct sockaddr *sa, socklen_t *len, int flags) {
    return accept4(fd, sa, len, flags);   /* SOCK_CLOEXEC, SOCK_NONBLOCK: atomic, no fork window */
}
_DDP_PRIVATE int _ddp_pipe2(int fds[2], int flags) {
    return pipe2(fds, flags);             /* O_CLOEXEC, O_NONBLOCK */
}

/* The CPUs this process may run on: its affinity mask (sched_getaffinity), 1024 CPUs as glibc's
 * cpu_set_t, as bytes (bit i of byte i/8: CPU i); all zero if unknown. */
#define _DDP_CPU_MASK_BYTES 128
_DDP_PRIVATE void _ddp_cpu_mask(unsigned char out[_DDP_CPU_MASK_BYTES]) {
    unsigned long mask[_DDP_CPU_MASK_BYTES / sizeof(unsigned long)];
    long i, got = syscall(SYS_sched_getaffinity, 0L, (unsigned long)sizeof mask, mask);
    memset(out, 0, _DDP_CPU_MASK_BYTES);
    for (i = 0; i < got * 8 && i < _DDP_CPU_MASK_BYTES * 8; i++)   /* the syscall returns bytes written */
        if (mask[i / (long)(8 * sizeof(unsigned long))] >> (i % (long)(8 * sizeof(unsigned long))) & 1ul)
            out[i / 8] = (unsigned char)(out[i / 8] | (1u << (i % 8)));
}

/* CPUs set in a mask of _ddp_cpu_mask's form. */
_DDP_PRIVATE int _ddp_cpu_mask_count(const unsigned char *m) {
    int i, n = 0;
    for (i = 0; i < _DDP_CPU_MASK_BYTES; i++) {
        unsigned b = m[i];
        for (; b; b &= b - 1) n++;
    }
    return n;
}

/* The CPUs this process may run on; 1 if unknown. */
_DDP_PRIVATE int _ddp_cpu_count(void) {
    unsigned char m[_DDP_CPU_MASK_BYTES];
    int n;
    _ddp_cpu_mask(m);
    n = _ddp_cpu_mask_count(m);
    return n > 0 ? n : 1;
}

/* FNV-1a (public domain hash, http://www.isthe.com/chongo/tech/comp/fnv/). */
_DDP_PRIVATE uint64_t _ddp_fnv1a(const void *data, size_t n, uint64_t h) {
    const unsigned char *p = (const unsigned char *)data;
    size_t i;
    for (i = 0; i < n; i++) { h ^= p[i]; h *= 1099511628211ull; }
    return h;
}
#define _DDP_FNV_INIT 14695981039346656037ull

/* The one name table of ddp_call_kind_t: "all_reduce", ..., "?" for anything else. */
#define _DDP_NUM_KINDS ((int)DDP_CALL_RECV + 1)
_DDP_PRIVATE const char *_ddp_kind_name(int kind) {
    static const char *const names[_DDP_NUM_KINDS] = {
        "?", "all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier", "reduce",
        "gather", "scatter", "all_to_all", "send", "recv"};
    return kind > 0 && kind < _DDP_NUM_KINDS ? names[kind] : "?";
}

#endif /* DDP_BASE_IMPLEMENTATION */
