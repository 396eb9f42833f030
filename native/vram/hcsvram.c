/*
 * libhcsvram: holds a process to its share of a GPU's memory (docs/vram.md).
 *
 * Loaded with LD_PRELOAD, it sits between the program (or the CUDA runtime) and the CUDA driver
 * (libcuda.so.1) and wraps the driver's memory calls: the cuMemAlloc family counts what the process
 * holds and answers CUDA_ERROR_OUT_OF_MEMORY (2) once an allocation would take it over the limit,
 * cuMemFree gives the memory back, cuMemGetInfo reports the share (total = the limit, free = what is
 * left of it). The limit is HCS_VRAM_LIMIT_BYTES, a whole number of bytes; without it every call
 * passes through untouched.
 *
 * Programs reach the driver three ways, and all three are covered:
 *   - linked calls (cuMemAlloc_v2 ...): this library's exported symbols come first;
 *   - dlsym(handle_of_libcuda, "cuMemAlloc_v2"): a handle's lookup never sees preloaded objects, so
 *     dlsym itself is wrapped and answers the wrapper for the names below;
 *   - cuGetProcAddress (how CUDA >= 11.3 runtimes resolve every driver entry point): wrapped, and the
 *     pointer it returns for a memory call is swapped for the wrapper.
 *
 * With HCS_VRAM_SHARE_FILE set as well, every process of the job that names the same file draws on one
 * share: the count lives in that file, mapped shared, under a process-shared robust mutex, with one slot
 * per process (a process killed while it held memory is found dead and its bytes given back).
 *
 * The virtual memory management API's physical allocations (cuMemCreate / cuMemRelease, what PyTorch's
 * expandable segments use) and allocations from memory pools (cuMemAllocFromPoolAsync) count too.
 *
 * Limits (see docs/vram.md): memory from calls not wrapped here (arrays, what a pool keeps reserved
 * after frees, the context's own reservation) is not counted.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned int CUdeviceptr_v1;
typedef void *CUstream;
typedef unsigned long long cuuint64_t;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef void *CUmemoryPool;
/* The driver's CUmemAllocationProp (cuda.h), of which only the location's type is read. */
typedef struct {
    int type;
    int requestedHandleTypes;
    struct {
        int type;
        int id;
    } location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType, gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;
#define CU_MEM_LOCATION_TYPE_DEVICE 1

#define CUDA_SUCCESS 0
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_FOUND 500
/* cuGetProcAddress flag: the per-thread default stream variants (the _ptsz entry points). */
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2ULL

#define LIMIT_ENV "HCS_VRAM_LIMIT_BYTES"
#define SHARE_ENV "HCS_VRAM_SHARE_FILE"
#define EXPORT __attribute__((visibility("default")))
#if defined(__has_attribute)
#if __has_attribute(musttail)
#define MUST_TAIL __attribute__((musttail))
#endif
#endif
#ifndef MUST_TAIL
#define MUST_TAIL
#endif

/* ---- the limit and the count ------------------------------------------------------------------ */

static int enforcing;   /* a limit is set: count and refuse */
static size_t limit;    /* bytes this process (or, with a share file, the job) may hold */
static _Atomic size_t used; /* what this process holds */
static atomic_int refusal_reported;

/* The job-wide share (HCS_VRAM_SHARE_FILE): one region per share, mapped shared by every process of the
 * job. `total` is the sum of the slots' bytes; both change only under `lock`, a process-shared robust
 * mutex, so a process killed while holding it leaves a lock the next process takes over (EOWNERDEAD). */
#define SHARE_MAGIC 0x48435356524d3031ULL /* "HCSVRM01" */
#define SHARE_VERSION 1
#define SHARE_SLOTS 256

struct share_slot {
    pid_t pid;                /* 0: free */
    unsigned long long start; /* the process's start time (clock ticks since boot), against pid reuse */
    size_t bytes;             /* what it holds */
};

struct share_region {
    unsigned long long magic;
    unsigned int version, slots;
    size_t limit; /* set by the process that created the file */
    size_t total;
    pthread_mutex_t lock;
    struct share_slot slot[SHARE_SLOTS];
};

static struct share_region *region; /* NULL: the count is this process's own */
static int my_slot = -1;            /* this process image's slot, once it allocated */
static pid_t my_pid;

static void refused(size_t n, size_t held, const char *who) {
    if (!atomic_exchange(&refusal_reported, 1))
        fprintf(stderr,
                "hcsvram: refused a GPU allocation of %zu bytes: %s %zu of its %zu byte share (" LIMIT_ENV ")\n",
                n, who, held, limit);
}

/* State and start time of a process from /proc/<pid>/stat: 1 when read. */
static int proc_stat(pid_t pid, char *state, unsigned long long *start) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t len = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (len <= 0)
        return 0;
    buf[len] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    if (!p || p[1] != ' ')
        return 0;
    p += 2;
    *state = *p;
    /* After the name: field 3 is the state, field 22 the start time. */
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p)
            return 0;
        p++;
    }
    *start = strtoull(p, NULL, 10);
    return 1;
}

/* Whether the process of a slot still lives (a zombie has given its GPU memory back). */
static int slot_alive(const struct share_slot *sl) {
    if (kill(sl->pid, 0) != 0 && errno == ESRCH)
        return 0;
    char state;
    unsigned long long start;
    if (proc_stat(sl->pid, &state, &start))
        return state != 'Z' && state != 'X' && (!sl->start || start == sl->start);
    return 1;
}

/* Under the lock: give back the bytes of processes that are gone. 1 when any were. */
static int reap(void) {
    int any = 0;
    for (int i = 0; i < SHARE_SLOTS; i++) {
        struct share_slot *sl = &region->slot[i];
        if (!sl->pid || sl->pid == my_pid || slot_alive(sl))
            continue;
        region->total -= sl->bytes < region->total ? sl->bytes : region->total;
        memset(sl, 0, sizeof *sl);
        any = 1;
    }
    return any;
}

static int share_lock(void) {
    int rc = pthread_mutex_lock(&region->lock);
    if (rc == EOWNERDEAD) {
        /* Its holder died inside: the slots are the truth, the total is made from them again. */
        size_t total = 0;
        for (int i = 0; i < SHARE_SLOTS; i++)
            if (region->slot[i].pid)
                total += region->slot[i].bytes;
        region->total = total;
        pthread_mutex_consistent(&region->lock);
        rc = 0;
    }
    return rc == 0;
}

/* Under the lock: this process image's slot, taken on first use; -1 when every slot is held by a live
 * process. A slot already under this pid is from before an exec (the old image's memory went with it). */
static int claim(void) {
    /* my_slot is reset in a child of fork (and an exec loads this library afresh): no getpid per call. */
    if (my_slot >= 0 && region->slot[my_slot].pid == my_pid)
        return my_slot;
    pid_t pid = my_pid = getpid();
    int free_slot = -1;
    for (int i = 0; i < SHARE_SLOTS; i++) {
        struct share_slot *sl = &region->slot[i];
        if (sl->pid == pid) {
            region->total -= sl->bytes < region->total ? sl->bytes : region->total;
            sl->bytes = 0;
            free_slot = i;
            break;
        }
        if (!sl->pid && free_slot < 0)
            free_slot = i;
    }
    if (free_slot < 0 && reap())
        for (int i = 0; i < SHARE_SLOTS && free_slot < 0; i++)
            if (!region->slot[i].pid)
                free_slot = i;
    if (free_slot < 0)
        return -1;
    struct share_slot *sl = &region->slot[free_slot];
    char state;
    unsigned long long start = 0;
    proc_stat(pid, &state, &start);
    sl->pid = pid;
    sl->start = start;
    sl->bytes = atomic_load(&used); /* this image's (0 unless its slot was lost) */
    region->total += sl->bytes;
    my_slot = free_slot;
    return my_slot;
}

static int share_reserve(size_t n) {
    if (!share_lock()) {
        refused(n, 0, "the share's lock cannot be taken;");
        return 0;
    }
    int ok = 0;
    int i = claim();
    if (i < 0) {
        if (!atomic_exchange(&refusal_reported, 1))
            fprintf(stderr, "hcsvram: refused a GPU allocation: the share file (" SHARE_ENV ") has no free slot "
                            "(%d processes hold GPU memory)\n", SHARE_SLOTS);
    } else {
        ok = n <= limit && region->total <= limit - n;
        if (!ok && reap())
            ok = n <= limit && region->total <= limit - n;
        if (ok) {
            region->total += n;
            region->slot[i].bytes += n;
            atomic_fetch_add_explicit(&used, n, memory_order_relaxed);
        } else {
            refused(n, region->total, "the job's processes hold");
        }
    }
    pthread_mutex_unlock(&region->lock);
    return ok;
}

static void share_release(size_t n) {
    atomic_fetch_sub_explicit(&used, n, memory_order_relaxed);
    if (!share_lock())
        return;
    int i = claim();
    if (i >= 0) {
        struct share_slot *sl = &region->slot[i];
        size_t back = n < sl->bytes ? n : sl->bytes;
        sl->bytes -= back;
        region->total -= back < region->total ? back : region->total;
    }
    pthread_mutex_unlock(&region->lock);
}

/* What the share holds now, for cuMemGetInfo (the processes that are gone given back first). */
static size_t share_used(void) {
    if (!region)
        return atomic_load_explicit(&used, memory_order_relaxed);
    if (!share_lock())
        return limit;
    reap();
    size_t total = region->total;
    pthread_mutex_unlock(&region->lock);
    return total;
}

/* Take n bytes of the share, or say no; a compare-and-swap so that concurrent threads never overshoot. */
static int reserve(size_t n) {
    if (region)
        return share_reserve(n);
    size_t cur = atomic_load_explicit(&used, memory_order_relaxed);
    do {
        if (n > limit || cur > limit - n) {
            refused(n, cur, "this process holds");
            return 0;
        }
    } while (!atomic_compare_exchange_weak_explicit(&used, &cur, cur + n, memory_order_relaxed,
                                                    memory_order_relaxed));
    return 1;
}

static void release(size_t n) {
    if (region)
        share_release(n);
    else
        atomic_fetch_sub_explicit(&used, n, memory_order_relaxed);
}

/* Map the share file, creating it when it is new; NULL (and why on stderr) when it cannot be used. */
static struct share_region *attach(const char *path) {
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    struct share_region *r = MAP_FAILED;
    struct stat st = {0};
    const char *why = NULL;
    if (fd < 0)
        why = errno == ELOOP ? "a symbolic link" : strerror(errno);
    else if (flock(fd, LOCK_EX) != 0 || fstat(fd, &st) != 0)
        why = strerror(errno);
    else if (!S_ISREG(st.st_mode))
        why = "not a regular file";
    else if (st.st_uid != geteuid())
        why = "owned by another user";
    else if (st.st_size != 0 && st.st_size != (off_t)sizeof *r)
        why = "not a share file of this version (wrong size)";
    else if (st.st_size == 0 && ftruncate(fd, sizeof *r) != 0)
        why = strerror(errno);
    if (!why) {
        r = mmap(NULL, sizeof *r, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (r == MAP_FAILED)
            why = strerror(errno);
    }
    if (!why && st.st_size == 0) {
        /* New (the file lock keeps the other processes out until it is ready): the creator's limit is the share. */
        pthread_mutexattr_t attr;
        pthread_mutexattr_init(&attr);
        pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
        pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
        pthread_mutex_init(&r->lock, &attr);
        pthread_mutexattr_destroy(&attr);
        r->version = SHARE_VERSION;
        r->slots = SHARE_SLOTS;
        r->limit = limit;
        r->total = 0;
        r->magic = SHARE_MAGIC;
    } else if (!why && (r->magic != SHARE_MAGIC || r->version != SHARE_VERSION || r->slots != SHARE_SLOTS)) {
        why = "not a share file of this version";
    }
    if (fd >= 0) {
        flock(fd, LOCK_UN);
        close(fd);
    }
    if (why) {
        fprintf(stderr, "hcsvram: cannot use the share file %s (" SHARE_ENV "): %s; every GPU allocation of this "
                        "process will be refused\n", path, why);
        if (r != MAP_FAILED)
            munmap(r, sizeof *r);
        return NULL;
    }
    if (r->limit != limit)
        fprintf(stderr, "hcsvram: " LIMIT_ENV "=%zu differs from the share's %zu bytes (%s); the share's holds\n",
                limit, r->limit, path);
    return r;
}

/* ---- live allocations: device pointer -> size ------------------------------------------------------ */

/* Sharded open-addressing tables (linear probing, backward-shift deletion), one lock per shard, so that
 * threads allocating at once rarely wait on each other. Key 0 marks an empty slot: the driver never
 * returns a null device pointer on success. */
#define SHARDS 64

struct shard {
    pthread_mutex_t lock;
    CUdeviceptr *keys;
    size_t *sizes;
    size_t mask; /* capacity - 1; capacity is a power of two, 0 before the first insert */
    size_t count;
} __attribute__((aligned(64)));

/* Device pointers (cuMemAlloc ...) and physical allocation handles (cuMemCreate) are kept apart: the two kinds
 * of value come from different spaces and must never be confused. */
static struct shard ptr_shards[SHARDS], handle_shards[SHARDS];
/* Handles retained again with cuMemRetainAllocationHandle: handle -> how many releases are still owed before the
 * memory goes (the driver hands out the same handle, and counts references). */
static struct shard retain_shards[SHARDS];

static inline uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

static inline struct shard *shard_of(struct shard *table, CUdeviceptr p) { return &table[mix(p) & (SHARDS - 1)]; }
static inline size_t home(const struct shard *s, CUdeviceptr p) { return (mix(p) >> 6) & s->mask; }

static int grow(struct shard *s) {
    size_t cap = s->keys ? (s->mask + 1) * 2 : 64;
    CUdeviceptr *keys = calloc(cap, sizeof *keys);
    size_t *sizes = calloc(cap, sizeof *sizes);
    if (!keys || !sizes) {
        free(keys);
        free(sizes);
        return 0;
    }
    CUdeviceptr *old_keys = s->keys;
    size_t *old_sizes = s->sizes;
    size_t old_cap = old_keys ? s->mask + 1 : 0;
    s->keys = keys;
    s->sizes = sizes;
    s->mask = cap - 1;
    for (size_t i = 0; i < old_cap; i++) {
        if (!old_keys[i])
            continue;
        size_t j = home(s, old_keys[i]);
        while (keys[j])
            j = (j + 1) & s->mask;
        keys[j] = old_keys[i];
        sizes[j] = old_sizes[i];
    }
    free(old_keys);
    free(old_sizes);
    return 1;
}

/* Record p -> n. Returns 0 when the host is out of memory for the table. *stale gets the size of an
 * entry p already had (memory freed behind our back, e.g. by a call not wrapped here), else 0. */
static int track(struct shard *table, CUdeviceptr p, size_t n, size_t *stale) {
    struct shard *s = shard_of(table, p);
    int ok = 1;
    *stale = 0;
    pthread_mutex_lock(&s->lock);
    if ((!s->keys || (s->count + 1) * 2 > s->mask + 1) && !grow(s)) {
        ok = 0;
    } else {
        size_t i = home(s, p);
        while (s->keys[i] && s->keys[i] != p)
            i = (i + 1) & s->mask;
        if (s->keys[i] == p)
            *stale = s->sizes[i];
        else
            s->count++;
        s->keys[i] = p;
        s->sizes[i] = n;
    }
    pthread_mutex_unlock(&s->lock);
    return ok;
}

/* Forget p; returns 1 and its size when it was tracked. */
static int untrack(struct shard *table, CUdeviceptr p, size_t *n) {
    struct shard *s = shard_of(table, p);
    int found = 0;
    pthread_mutex_lock(&s->lock);
    if (s->keys) {
        size_t i = home(s, p);
        while (s->keys[i] && s->keys[i] != p)
            i = (i + 1) & s->mask;
        if (s->keys[i] == p) {
            found = 1;
            *n = s->sizes[i];
            /* Backward-shift deletion: move later entries of the probe run into the hole. */
            size_t j = i;
            for (;;) {
                j = (j + 1) & s->mask;
                if (!s->keys[j])
                    break;
                size_t k = home(s, s->keys[j]);
                if ((j > i && (k <= i || k > j)) || (j < i && k <= i && k > j)) {
                    s->keys[i] = s->keys[j];
                    s->sizes[i] = s->sizes[j];
                    i = j;
                }
            }
            s->keys[i] = 0;
            s->count--;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return found;
}

/* ---- the driver's real entry points ------------------------------------------------------------ */

static void *(*real_dlsym)(void *, const char *);
static pthread_once_t dlsym_once = PTHREAD_ONCE_INIT;

static void find_real_dlsym(void) {
    /* dlsym is versioned: GLIBC_2.34 where libdl was merged into libc, older names before. */
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"};
    for (size_t i = 0; i < sizeof versions / sizeof *versions && !real_dlsym; i++)
        real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    if (!real_dlsym) {
        fprintf(stderr, "hcsvram: cannot find the C library's dlsym; GPU memory calls cannot be forwarded\n");
        abort();
    }
}

static inline void need_dlsym(void) {
    if (__builtin_expect(real_dlsym == NULL, 0))
        pthread_once(&dlsym_once, find_real_dlsym);
}

/* The driver's own function of that exported name: the next definition after this library (libcuda
 * linked by the program), else from libcuda.so.1 when the runtime opened it privately. */
static void *resolve(const char *name) {
    need_dlsym();
    void *fn = real_dlsym(RTLD_NEXT, name);
    if (!fn) {
        void *handle = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        if (handle)
            fn = real_dlsym(handle, name);
    }
    return fn;
}

/* One slot per exported entry point: the real function, learnt from whichever way the program found it. */
#define SLOT(name) static void *_Atomic real_##name
SLOT(cuMemAlloc_v2);
SLOT(cuMemAlloc);
SLOT(cuMemAllocManaged);
SLOT(cuMemAllocPitch_v2);
SLOT(cuMemAllocPitch);
SLOT(cuMemAllocAsync);
SLOT(cuMemAllocAsync_ptsz);
SLOT(cuMemFree_v2);
SLOT(cuMemFree);
SLOT(cuMemFreeAsync);
SLOT(cuMemFreeAsync_ptsz);
SLOT(cuMemGetInfo_v2);
SLOT(cuMemGetInfo);
SLOT(cuGetProcAddress_v2);
SLOT(cuGetProcAddress);
SLOT(cuMemCreate);
SLOT(cuMemRelease);
SLOT(cuMemRetainAllocationHandle);
SLOT(cuMemAllocFromPoolAsync);
SLOT(cuMemAllocFromPoolAsync_ptsz);

#define REAL(name, type)                                                                     \
    type fn = (type)atomic_load_explicit(&real_##name, memory_order_acquire);                \
    if (__builtin_expect(fn == NULL, 0)) {                                                   \
        fn = (type)resolve(#name);                                                           \
        if (!fn)                                                                             \
            return CUDA_ERROR_NOT_FOUND;                                                     \
        atomic_store_explicit(&real_##name, (void *)fn, memory_order_release);               \
    }

/* ---- the wrappers ---------------------------------------------------------------------------------- */

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*alloc_v1_fn)(CUdeviceptr_v1 *, unsigned int);
typedef CUresult (*managed_fn)(CUdeviceptr *, size_t, unsigned int);
typedef CUresult (*pitch_fn)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
typedef CUresult (*pitch_v1_fn)(CUdeviceptr_v1 *, unsigned int *, unsigned int, unsigned int, unsigned int);
typedef CUresult (*async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*free_v1_fn)(CUdeviceptr_v1);
typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);
typedef CUresult (*info_fn)(size_t *, size_t *);
typedef CUresult (*info_v1_fn)(unsigned int *, unsigned int *);
typedef CUresult (*proc_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*proc_v2_fn)(const char *, void **, int, cuuint64_t, int *);
typedef CUresult (*create_fn)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                              unsigned long long);
typedef CUresult (*release_fn)(CUmemGenericAllocationHandle);
typedef CUresult (*retain_fn)(CUmemGenericAllocationHandle *, void *);
typedef CUresult (*pool_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);

/* Free what the driver allocated but the limit cannot allow (no count is touched). */
static void give_back(CUdeviceptr p) {
    free_fn fn = (free_fn)atomic_load_explicit(&real_cuMemFree_v2, memory_order_acquire);
    if (!fn)
        fn = (free_fn)resolve("cuMemFree_v2");
    if (fn)
        fn(p);
}

static void give_back_v1(CUdeviceptr_v1 p) {
    free_v1_fn fn = (free_v1_fn)atomic_load_explicit(&real_cuMemFree, memory_order_acquire);
    if (!fn)
        fn = (free_v1_fn)resolve("cuMemFree");
    if (fn)
        fn(p);
}

/* After the driver allocated p of n reserved bytes: record it. When it cannot be recorded (no host
 * memory for the table), give it back: untracked memory would escape the limit. */
static int keep_in(struct shard *table, CUdeviceptr p, size_t n) {
    size_t stale;
    if (!track(table, p, n, &stale))
        return 0;
    if (stale)
        release(stale);
    return 1;
}

static int keep(CUdeviceptr p, size_t n) { return keep_in(ptr_shards, p, n); }

/* The driver answered rc to a free of p, forgotten (n bytes, when tracked) before the call so that another thread
 * handed the same address meanwhile is not confused with it: its bytes come back, or it is recorded again when
 * the driver kept it. */
static CUresult freed(CUresult rc, struct shard *table, CUdeviceptr p, int tracked, size_t n) {
    if (tracked) {
        if (rc == CUDA_SUCCESS)
            release(n);
        else
            keep_in(table, p, n);
    }
    return rc;
}

/* How to give back an allocation the count cannot keep: with cuMemFreeAsync on its stream, cuMemRelease for a
 * handle, else cuMemFree_v2. */
struct undo {
    free_async_fn async;
    CUstream stream;
    int handle;
};

/* The driver answered rc to an allocation of n reserved bytes at *p: settle the count. A failed call gives the
 * bytes back; a success is recorded in table, or (no host memory for the table) given back to the driver and
 * refused, since untracked memory would escape the limit. */
static CUresult counted(CUresult rc, struct shard *table, const CUdeviceptr *p, size_t n, struct undo undo) {
    if (rc != CUDA_SUCCESS) {
        release(n);
    } else if (!keep_in(table, *p, n)) {
        if (undo.handle) {
            release_fn fn = (release_fn)atomic_load_explicit(&real_cuMemRelease, memory_order_acquire);
            if (!fn)
                fn = (release_fn)resolve("cuMemRelease");
            if (fn)
                fn(*p);
        } else if (undo.async)
            undo.async(*p, undo.stream);
        else
            give_back(*p);
        release(n);
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    return rc;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    REAL(cuMemAlloc_v2, alloc_fn)
    if (!enforcing)
        return fn(dptr, bytesize);
    if (!reserve(bytesize))
        return CUDA_ERROR_OUT_OF_MEMORY;
    return counted(fn(dptr, bytesize), ptr_shards, dptr, bytesize, (struct undo){0});
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    REAL(cuMemAllocManaged, managed_fn)
    if (!enforcing)
        return fn(dptr, bytesize, flags);
    if (!reserve(bytesize))
        return CUDA_ERROR_OUT_OF_MEMORY;
    return counted(fn(dptr, bytesize, flags), ptr_shards, dptr, bytesize, (struct undo){0});
}

/* A pitched allocation of `asked` reserved bytes came back `total` bytes long: settle the difference and
 * record it. 0 (with nothing left reserved) when the padding does not fit or it cannot be recorded: the
 * caller gives the memory back. */
static int settle_pitch(CUdeviceptr p, size_t asked, size_t total) {
    if (total > asked && !reserve(total - asked)) {
        release(asked);
        return 0;
    }
    if (total < asked)
        release(asked - total);
    if (!keep(p, total)) {
        release(total);
        return 0;
    }
    return 1;
}

/* The driver picks the pitch, so the size is known only afterwards: reserve width * height first, then
 * the padding, and give the allocation back when the padding does not fit. */
EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                   unsigned int element) {
    REAL(cuMemAllocPitch_v2, pitch_fn)
    if (!enforcing)
        return fn(dptr, pitch, width, height, element);
    if (height && width > SIZE_MAX / height)
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t asked = width * height;
    if (!reserve(asked))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = fn(dptr, pitch, width, height, element);
    if (rc != CUDA_SUCCESS) {
        release(asked);
        return rc;
    }
    size_t total = height && *pitch > SIZE_MAX / height ? SIZE_MAX : *pitch * height;
    if (settle_pitch(*dptr, asked, total))
        return rc;
    give_back(*dptr);
    *dptr = 0;
    *pitch = 0;
    return CUDA_ERROR_OUT_OF_MEMORY;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    REAL(cuMemFree_v2, free_fn)
    if (!enforcing)
        return fn(dptr);
    /* Forget first: once the driver has it back, another thread may be handed the same address. */
    size_t n = 0;
    int tracked = untrack(ptr_shards, dptr, &n);
    return freed(fn(dptr), ptr_shards, dptr, tracked, n);
}

static CUresult alloc_async(async_fn fn, free_async_fn undo, CUdeviceptr *dptr, size_t bytesize, CUstream s) {
    if (!enforcing)
        return fn(dptr, bytesize, s);
    if (!reserve(bytesize))
        return CUDA_ERROR_OUT_OF_MEMORY;
    return counted(fn(dptr, bytesize, s), ptr_shards, dptr, bytesize, (struct undo){.async = undo, .stream = s});
}

static CUresult free_async(free_async_fn fn, CUdeviceptr dptr, CUstream s) {
    if (!enforcing)
        return fn(dptr, s);
    size_t n = 0;
    int tracked = untrack(ptr_shards, dptr, &n);
    return freed(fn(dptr, s), ptr_shards, dptr, tracked, n);
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream s) {
    REAL(cuMemAllocAsync, async_fn)
    async_fn alloc = fn;
    {
        REAL(cuMemFreeAsync, free_async_fn)
        return alloc_async(alloc, fn, dptr, bytesize, s);
    }
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream s) {
    REAL(cuMemAllocAsync_ptsz, async_fn)
    async_fn alloc = fn;
    {
        REAL(cuMemFreeAsync_ptsz, free_async_fn)
        return alloc_async(alloc, fn, dptr, bytesize, s);
    }
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s) {
    REAL(cuMemFreeAsync, free_async_fn)
    return free_async(fn, dptr, s);
}

EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s) {
    REAL(cuMemFreeAsync_ptsz, free_async_fn)
    return free_async(fn, dptr, s);
}

/* The virtual memory management API: cuMemCreate makes physical memory (mapped later with cuMemMap, which takes
 * nothing more), cuMemRelease gives its handle back. Memory on the host (a host location) is not the card's. */
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                            unsigned long long flags) {
    REAL(cuMemCreate, create_fn)
    if (!enforcing || (prop && prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE))
        return fn(handle, size, prop, flags);
    if (!reserve(size))
        return CUDA_ERROR_OUT_OF_MEMORY;
    return counted(fn(handle, size, prop, flags), handle_shards, handle, size, (struct undo){.handle = 1});
}

/* Another reference to the physical memory behind a mapped address: its release must not give the bytes back
 * while the first handle still holds them. */
EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
    REAL(cuMemRetainAllocationHandle, retain_fn)
    CUresult rc = fn(handle, addr);
    size_t owed = 0, stale;
    if (rc == CUDA_SUCCESS && enforcing) {
        untrack(retain_shards, *handle, &owed);
        track(retain_shards, *handle, owed + 1, &stale);
    }
    return rc;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    REAL(cuMemRelease, release_fn)
    if (!enforcing)
        return fn(handle);
    size_t n = 0, owed = 0, stale;
    if (untrack(retain_shards, handle, &owed)) {
        /* A retained reference: the memory stays until the last release. */
        CUresult rc = fn(handle);
        if (rc != CUDA_SUCCESS || owed > 1)
            track(retain_shards, handle, rc == CUDA_SUCCESS ? owed - 1 : owed, &stale);
        return rc;
    }
    int tracked = untrack(handle_shards, handle, &n);
    return freed(fn(handle), handle_shards, handle, tracked, n);
}

/* An allocation from a memory pool is freed with cuMemFreeAsync (or cuMemFree), which give its bytes back. */
static CUresult alloc_from_pool(pool_fn fn, free_async_fn undo, CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                CUstream s) {
    if (!enforcing)
        return fn(dptr, bytesize, pool, s);
    if (!reserve(bytesize))
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct undo back = {.async = undo, .stream = s};
    return counted(fn(dptr, bytesize, pool, s), ptr_shards, dptr, bytesize, back);
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream s) {
    REAL(cuMemAllocFromPoolAsync, pool_fn)
    pool_fn alloc = fn;
    {
        REAL(cuMemFreeAsync, free_async_fn)
        return alloc_from_pool(alloc, fn, dptr, bytesize, pool, s);
    }
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream s) {
    REAL(cuMemAllocFromPoolAsync_ptsz, pool_fn)
    pool_fn alloc = fn;
    {
        REAL(cuMemFreeAsync_ptsz, free_async_fn)
        return alloc_from_pool(alloc, fn, dptr, bytesize, pool, s);
    }
}

/* The share as the program sees it: total = the limit, free = what is left of it, and never more than
 * the card really has free (other processes use the card too). */
static void share_info(size_t *free_bytes, size_t *total_bytes) {
    size_t u = share_used();
    size_t left = u < limit ? limit - u : 0;
    if (free_bytes && *free_bytes > left)
        *free_bytes = left;
    if (total_bytes && *total_bytes > limit)
        *total_bytes = limit;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    REAL(cuMemGetInfo_v2, info_fn)
    CUresult rc = fn(free_bytes, total_bytes);
    if (rc == CUDA_SUCCESS && enforcing)
        share_info(free_bytes, total_bytes);
    return rc;
}

/* The pre-3.2 entry points, with 32-bit sizes and device pointers (still exported by the driver). */
EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize) {
    REAL(cuMemAlloc, alloc_v1_fn)
    if (!enforcing)
        return fn(dptr, bytesize);
    if (!reserve(bytesize))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = fn(dptr, bytesize);
    if (rc != CUDA_SUCCESS) {
        release(bytesize);
    } else if (!keep(*dptr, bytesize)) {
        give_back_v1(*dptr);
        release(bytesize);
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    return rc;
}

EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int width, unsigned int height,
                                unsigned int element) {
    REAL(cuMemAllocPitch, pitch_v1_fn)
    if (!enforcing)
        return fn(dptr, pitch, width, height, element);
    size_t asked = (size_t)width * height;
    if (!reserve(asked))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = fn(dptr, pitch, width, height, element);
    if (rc != CUDA_SUCCESS) {
        release(asked);
        return rc;
    }
    if (settle_pitch(*dptr, asked, (size_t)*pitch * height))
        return rc;
    give_back_v1(*dptr);
    *dptr = 0;
    *pitch = 0;
    return CUDA_ERROR_OUT_OF_MEMORY;
}

EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr) {
    REAL(cuMemFree, free_v1_fn)
    if (!enforcing)
        return fn(dptr);
    size_t n = 0;
    int tracked = untrack(ptr_shards, dptr, &n);
    return freed(fn(dptr), ptr_shards, dptr, tracked, n);
}

EXPORT CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total_bytes) {
    REAL(cuMemGetInfo, info_v1_fn)
    CUresult rc = fn(free_bytes, total_bytes);
    if (rc == CUDA_SUCCESS && enforcing) {
        size_t f = free_bytes ? *free_bytes : 0, t = total_bytes ? *total_bytes : 0;
        share_info(&f, &t);
        if (free_bytes)
            *free_bytes = (unsigned int)f;
        if (total_bytes)
            *total_bytes = (unsigned int)t;
    }
    return rc;
}

/* ---- the lookup paths: dlsym and cuGetProcAddress -------------------------------------------------- */

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags);
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags, int *status);

/* An exported driver name this library stands in for, with its wrapper and slot. */
struct entry {
    const char *name;
    void *wrapper;
    void *_Atomic *slot;
};

#define ENTRY(name) {#name, (void *)name, &real_##name}
static const struct entry entries[] = {
    ENTRY(cuMemAlloc_v2),       ENTRY(cuMemAlloc),          ENTRY(cuMemAllocManaged),
    ENTRY(cuMemAllocPitch_v2),  ENTRY(cuMemAllocPitch),     ENTRY(cuMemAllocAsync),
    ENTRY(cuMemAllocAsync_ptsz), ENTRY(cuMemFree_v2),       ENTRY(cuMemFree),
    ENTRY(cuMemFreeAsync),      ENTRY(cuMemFreeAsync_ptsz), ENTRY(cuMemGetInfo_v2),
    ENTRY(cuMemGetInfo),        ENTRY(cuGetProcAddress_v2), ENTRY(cuGetProcAddress),
    ENTRY(cuMemCreate),         ENTRY(cuMemRelease),        ENTRY(cuMemAllocFromPoolAsync),
    ENTRY(cuMemAllocFromPoolAsync_ptsz), ENTRY(cuMemRetainAllocationHandle),
};
#define N_ENTRIES (sizeof entries / sizeof *entries)

static const struct entry *entry_named(const char *name) {
    for (size_t i = 0; i < N_ENTRIES; i++)
        if (strcmp(entries[i].name, name) == 0)
            return &entries[i];
    return NULL;
}

/* Remember the real function behind an entry (never a wrapper of ours: that would call itself). */
static void learn(const struct entry *e, void *real) {
    if (real && real != e->wrapper)
        atomic_store_explicit(e->slot, real, memory_order_release);
}

static void swap_proc(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags) {
    static const struct {
        const char *name, *v2, *v1, *ptsz;
        int v2_since;
    } procs[] = {
        {"cuMemAlloc", "cuMemAlloc_v2", "cuMemAlloc", NULL, 3020},
        {"cuMemAllocPitch", "cuMemAllocPitch_v2", "cuMemAllocPitch", NULL, 3020},
        {"cuMemFree", "cuMemFree_v2", "cuMemFree", NULL, 3020},
        {"cuMemGetInfo", "cuMemGetInfo_v2", "cuMemGetInfo", NULL, 3020},
        {"cuMemAllocManaged", NULL, "cuMemAllocManaged", NULL, 0},
        {"cuMemAllocAsync", NULL, "cuMemAllocAsync", "cuMemAllocAsync_ptsz", 0},
        {"cuMemFreeAsync", NULL, "cuMemFreeAsync", "cuMemFreeAsync_ptsz", 0},
        {"cuGetProcAddress", "cuGetProcAddress_v2", "cuGetProcAddress", NULL, 12000},
        {"cuMemCreate", NULL, "cuMemCreate", NULL, 0},
        {"cuMemRelease", NULL, "cuMemRelease", NULL, 0},
        {"cuMemRetainAllocationHandle", NULL, "cuMemRetainAllocationHandle", NULL, 0},
        {"cuMemAllocFromPoolAsync", NULL, "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz", 0},
    };
    if (!symbol || symbol[0] != 'c' || symbol[1] != 'u')
        return;
    for (size_t i = 0; i < sizeof procs / sizeof *procs; i++) {
        if (strcmp(procs[i].name, symbol) != 0)
            continue;
        const char *name = procs[i].v1;
        if (procs[i].ptsz && (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))
            name = procs[i].ptsz;
        else if (procs[i].v2 && cuda_version >= procs[i].v2_since)
            name = procs[i].v2;
        const struct entry *e = entry_named(name);
        learn(e, *pfn);
        *pfn = e->wrapper;
        return;
    }
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags,
                                    int *status) {
    REAL(cuGetProcAddress_v2, proc_v2_fn)
    CUresult rc = fn(symbol, pfn, cuda_version, flags, status);
    if (rc == CUDA_SUCCESS && enforcing && pfn && *pfn)
        swap_proc(symbol, pfn, cuda_version, flags);
    return rc;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags) {
    REAL(cuGetProcAddress, proc_fn)
    CUresult rc = fn(symbol, pfn, cuda_version, flags);
    if (rc == CUDA_SUCCESS && enforcing && pfn && *pfn)
        swap_proc(symbol, pfn, cuda_version, flags);
    return rc;
}

/* dlsym(handle, "cuMemAlloc_v2") on the driver's handle: the wrapper, once the real one is known. */
static __attribute__((noinline)) void *dlsym_entry(void *handle, const char *symbol) {
    const struct entry *e = entry_named(symbol);
    if (!e)
        return NULL;
    void *real = real_dlsym(handle, symbol);
    if (!real)
        return NULL;
    learn(e, real);
    return e->wrapper;
}

EXPORT void *dlsym(void *handle, const char *symbol) {
    need_dlsym();
    if (enforcing && handle != RTLD_NEXT && symbol[0] == 'c' && symbol[1] == 'u') {
        void *wrapper = dlsym_entry(handle, symbol);
        if (wrapper)
            return wrapper;
    }
    /* A tail call (a jump), so the C library still sees the caller's return address: RTLD_NEXT and
     * RTLD_DEFAULT are resolved relative to the calling object, which must be the program's, not this
     * library. Compilers make it a jump from -O2 on (the Makefile's flags); tests/executors/test_vram.py
     * checks RTLD_NEXT from another library. */
    MUST_TAIL return real_dlsym(handle, symbol);
}

/* ---- start-up ---------------------------------------------------------------------------------------- */

/* A child of fork starts with no CUDA context of its own: nothing it inherited is its allocation, and a
 * shard lock another thread held at the fork would never be released. */
static void after_fork_in_child(void) {
    struct shard *tables[] = {ptr_shards, handle_shards, retain_shards};
    for (size_t t = 0; t < 3; t++) {
        for (size_t i = 0; i < SHARDS; i++) {
            struct shard *sh = &tables[t][i];
            pthread_mutex_init(&sh->lock, NULL);
            free(sh->keys);
            free(sh->sizes);
            sh->keys = NULL;
            sh->sizes = NULL;
            sh->mask = 0;
            sh->count = 0;
        }
    }
    atomic_store(&used, 0);
    my_slot = -1; /* the child takes a slot of its own when it allocates */
}

/* At a normal exit the driver takes the process's memory back: so does its slot (a killed process's slot is
 * found dead by the next process that needs the room). */
__attribute__((destructor)) static void stop(void) {
    if (!region || my_slot < 0 || my_pid != getpid() || !share_lock())
        return;
    struct share_slot *sl = &region->slot[my_slot];
    if (sl->pid == my_pid) {
        region->total -= sl->bytes < region->total ? sl->bytes : region->total;
        memset(sl, 0, sizeof *sl);
    }
    my_slot = -1;
    pthread_mutex_unlock(&region->lock);
}

__attribute__((constructor)) static void start(void) {
    for (size_t i = 0; i < SHARDS; i++) {
        pthread_mutex_init(&ptr_shards[i].lock, NULL);
        pthread_mutex_init(&handle_shards[i].lock, NULL);
        pthread_mutex_init(&retain_shards[i].lock, NULL);
    }
    need_dlsym();
    const char *value = getenv(LIMIT_ENV);
    if (!value || !*value)
        return;
    /* A limit that cannot be read fails closed (a share of 0 bytes): running unlimited would hand the
     * process the whole card. */
    char *end = NULL;
    unsigned long long bytes = 0;
    int ok = value[0] >= '0' && value[0] <= '9';
    if (ok) {
        bytes = strtoull(value, &end, 10);
        ok = *end == '\0' && !(bytes == ULLONG_MAX);
    }
    if (!ok) {
        fprintf(stderr,
                "hcsvram: " LIMIT_ENV "=%s is not a whole number of bytes (expected e.g. 17179869184 for 16 GiB); "
                "every GPU allocation of this process will be refused\n",
                value);
        bytes = 0;
    }
    limit = (size_t)bytes;
    const char *share = getenv(SHARE_ENV);
    if (ok && share && *share) {
        region = attach(share);
        if (region && share_lock()) {
            limit = region->limit;
            /* A slot under this pid is this process's before an exec: that image's memory went with it. */
            for (int i = 0; i < SHARE_SLOTS; i++) {
                struct share_slot *sl = &region->slot[i];
                if (sl->pid == getpid()) {
                    region->total -= sl->bytes < region->total ? sl->bytes : region->total;
                    memset(sl, 0, sizeof *sl);
                }
            }
            pthread_mutex_unlock(&region->lock);
        } else if (region) {
            limit = 0;
        } else
            limit = 0; /* fails closed, like an unreadable limit */
    }
    enforcing = 1;
    pthread_atfork(NULL, NULL, after_fork_in_child);
}
