/*
 * Drives the CUDA memory calls the way programs and runtimes do, for the interceptor's tests. Each
 * argument is one step; each step prints one line ("<step> <result>..."):
 *   alloc:N alloc_v1:N managed:N pitch:W:H async:N   linked calls (cuMemAlloc_v2, cuMemAlloc, ...)
 *   dlsym:N          cuMemAlloc_v2 found with dlsym on the handle of libcuda.so.1
 *   getproc:N        the CUDA runtime's path: dlsym(libcuda, "cuGetProcAddress_v2"), then "cuMemAlloc"
 *   getproc_ptsz:N   cuMemAllocAsync through cuGetProcAddress for the per-thread default stream
 *   free:I           frees allocation number I (0-based, in order made) with the call matching its kind
 *   info info_v1 info_getproc   cuMemGetInfo (_v2, v1, through cuGetProcAddress): "<free> <total>"
 *   which:NAME       the object dlsym(libcuda, NAME) resolves to; which_proc:NAME the same for cuGetProcAddress
 *   threads:T:S:R    T threads allocate S bytes at a time until refused ("held <bytes>"), then each frees
 *                    and re-allocates one block R times, then frees everything ("after <in-use per info>")
 *   next             dlsym(RTLD_NEXT, ...) from a library still finds the next library's symbol
 *   init             a real driver needs a context before it allocates: cuInit, then device 0's primary
 *                    context made current (for the threads of "threads" too); the stub answers 0 at once
 *   time:N:S         N cuMemAlloc_v2 / cuMemFree_v2 pairs of S bytes, timed ("time <ns per pair>")
 *   pairs:B:N:S      B alternating blocks of N pairs of S bytes: through the linked names (the interceptor's
 *                    wrappers when it is preloaded) and through the driver's own functions, found in its ELF
 *                    symbol table, which no preload can wrap: "pairs <object of each> <median ns per pair of
 *                    the driver's own> <of the linked names> <median difference within a block pair>"
 *   create:N create_host:N   cuMemCreate of N bytes on device 0 (on the host), the virtual memory API's
 *                    physical allocation; free:I releases it (cuMemRelease)
 *   retain:I         cuMemRetainAllocationHandle on the memory of handle I (the stub takes the handle for its
 *                    address; not for a real driver, where the memory would have to be mapped): a new handle J
 *   pool:N           cuMemAllocFromPoolAsync from device 0's default memory pool; free:I frees it (cuMemFreeAsync)
 *   fill:S           allocate S bytes at a time until refused and keep them: "fill <bytes held>"
 *   hold             print "hold" and wait for a line on stdin (lets a test start other processes meanwhile)
 *   spawn:N          fork a child that makes its own context ("init"; so spawn before init), allocates N bytes and
 *                    keeps them until "kill": "spawn <its result>" (100: the parent had a context already)
 *   kill             SIGKILL the child of "spawn" and reap it (its memory goes back as with a crash): "kill 0"
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdint.h>
#include <libgen.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned int CUdeviceptr_v1;
typedef void *CUstream;
typedef unsigned long long cuuint64_t;

CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemAlloc(CUdeviceptr_v1 *, unsigned int);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned int);
CUresult cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemFree(CUdeviceptr_v1);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemGetInfo(unsigned int *, unsigned int *);
typedef struct {
    int type, requestedHandleTypes;
    struct {
        int type, id;
    } location;
    void *win32HandleMetaData;
    unsigned char allocFlags[8];
} CUmemAllocationProp;
CUresult cuMemCreate(unsigned long long *, size_t, const CUmemAllocationProp *, unsigned long long);
CUresult cuMemRelease(unsigned long long);
CUresult cuMemRetainAllocationHandle(unsigned long long *, void *);
CUresult cuDeviceGetDefaultMemPool(void **, int);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, void *, CUstream);
CUresult cuInit(unsigned int);
CUresult cuDeviceGet(int *, int);
CUresult cuDevicePrimaryCtxRetain(void **, int);
CUresult cuCtxSetCurrent(void *);
int hcs_next(void);

typedef CUresult (*proc_v2_fn)(const char *, void **, int, cuuint64_t, int *);

enum kind { V2, V1, ASYNC, HANDLE };
static struct {
    CUdeviceptr p;
    enum kind kind;
} held[4096];
static int n_held;
static pid_t child; /* the process of "spawn" */
static void *context; /* device 0's primary context once "init" ran; threads make it current */

static void *driver(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror());
        exit(3);
    }
    return h;
}

static void *proc(const char *name, cuuint64_t flags) {
    proc_v2_fn get = (proc_v2_fn)dlsym(driver(), "cuGetProcAddress_v2");
    void *fn = NULL;
    int status = 0;
    if (!get || get(name, &fn, 12000, flags, &status) != 0)
        return NULL;
    return fn;
}

static const char *object_of(void *fn) {
    Dl_info info;
    if (!fn || !dladdr(fn, &info) || !info.dli_fname)
        return "none";
    return basename((char *)info.dli_fname);
}

static void kept(CUresult rc, CUdeviceptr p, enum kind kind) {
    if (rc == 0) {
        held[n_held].p = p;
        held[n_held].kind = kind;
        n_held++;
    }
}

struct worker {
    size_t size, rounds, bytes;
    CUdeviceptr blocks[4096];
    int n;
};

static void *work(void *arg) {
    struct worker *w = arg;
    CUdeviceptr p;
    if (context)
        cuCtxSetCurrent(context);
    while (w->n < 4096 && cuMemAlloc_v2(&p, w->size) == 0) {
        w->blocks[w->n++] = p;
        w->bytes += w->size;
    }
    return NULL;
}

/* ---- the driver's own functions, for timing the interceptor inside one process -------------------- */

struct own_lookup {
    const char *name;
    void *fn;
};

/* How many symbols a GNU hash table covers: the highest bucket's chain, followed to its end. */
static size_t gnu_hash_symbols(const uint32_t *table) {
    uint32_t buckets = table[0], offset = table[1], bloom = table[2];
    const uint32_t *bucket = table + 4 + bloom * (sizeof(ElfW(Addr)) / 4), *chain = bucket + buckets;
    uint32_t last = 0;
    for (uint32_t b = 0; b < buckets; b++)
        if (bucket[b] > last)
            last = bucket[b];
    if (last < offset)
        return offset;
    while (!(chain[last - offset] & 1))
        last++;
    return last + 1;
}

static int find_own(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct own_lookup *want = data;
    if (!strstr(info->dlpi_name, "libcuda.so"))
        return 0;
    const ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
            dyn = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    const ElfW(Sym) *symbols = NULL;
    const char *names = NULL;
    size_t count = 0;
    for (; dyn && dyn->d_tag != DT_NULL; dyn++) {
        /* glibc relocates these entries in place; an unrelocated one is an offset from the base. */
        ElfW(Addr) at = dyn->d_un.d_ptr < info->dlpi_addr ? info->dlpi_addr + dyn->d_un.d_ptr : dyn->d_un.d_ptr;
        if (dyn->d_tag == DT_SYMTAB)
            symbols = (const ElfW(Sym) *)at;
        else if (dyn->d_tag == DT_STRTAB)
            names = (const char *)at;
        else if (dyn->d_tag == DT_HASH)
            count = ((const uint32_t *)at)[1];
        else if (dyn->d_tag == DT_GNU_HASH && !count)
            count = gnu_hash_symbols((const uint32_t *)at);
    }
    for (size_t k = 0; symbols && names && k < count; k++)
        if (symbols[k].st_value && ELF64_ST_TYPE(symbols[k].st_info) == STT_FUNC &&
            !strcmp(names + symbols[k].st_name, want->name)) {
            want->fn = (void *)(info->dlpi_addr + symbols[k].st_value);
            return 1;
        }
    return 0;
}

static void *driver_own(const char *name) {
    struct own_lookup want = {name, NULL};
    dl_iterate_phdr(find_own, &want);
    return want.fn;
}

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);

static double ns_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static double timed_pairs(alloc_fn a, free_fn f, long n, size_t size) {
    CUdeviceptr p;
    double start = ns_now();
    for (long k = 0; k < n; k++)
        if (a(&p, size) != 0 || f(p) != 0) {
            fprintf(stderr, "pairs: an allocate/free pair failed\n");
            exit(1);
        }
    return (ns_now() - start) / n;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, long n) {
    qsort(v, n, sizeof *v, by_value);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static pthread_barrier_t barrier;

static void *churn(void *arg) {
    struct worker *w = arg;
    if (context)
        cuCtxSetCurrent(context);
    pthread_barrier_wait(&barrier);
    for (size_t r = 0; r < w->rounds; r++) {
        if (w->n == 0) {
            CUdeviceptr p;
            if (cuMemAlloc_v2(&p, w->size) == 0)
                w->blocks[w->n++] = p;
            continue;
        }
        cuMemFree_v2(w->blocks[w->n - 1]);
        if (cuMemAlloc_v2(&w->blocks[w->n - 1], w->size) != 0)
            w->n--;
    }
    while (w->n > 0)
        cuMemFree_v2(w->blocks[--w->n]);
    return NULL;
}

/* cuInit, then device 0's primary context made current. */
static CUresult init_context(void) {
    int device = 0;
    CUresult rc = cuInit(0);
    if (rc == 0)
        rc = cuDeviceGet(&device, 0);
    if (rc == 0)
        rc = cuDevicePrimaryCtxRetain(&context, device);
    if (rc == 0)
        rc = cuCtxSetCurrent(context);
    return rc;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    for (int i = 1; i < argc; i++) {
        char *step = argv[i], *arg = strchr(step, ':');
        if (arg)
            *arg++ = '\0';
        CUdeviceptr p = 0;
        CUresult rc;
        if (!strcmp(step, "alloc")) {
            rc = cuMemAlloc_v2(&p, strtoull(arg, NULL, 10));
            kept(rc, p, V2);
            printf("alloc %d\n", rc);
        } else if (!strcmp(step, "alloc_v1")) {
            CUdeviceptr_v1 p1 = 0;
            rc = cuMemAlloc(&p1, (unsigned int)strtoul(arg, NULL, 10));
            kept(rc, p1, V1);
            printf("alloc_v1 %d\n", rc);
        } else if (!strcmp(step, "managed")) {
            rc = cuMemAllocManaged(&p, strtoull(arg, NULL, 10), 1);
            kept(rc, p, V2);
            printf("managed %d\n", rc);
        } else if (!strcmp(step, "pitch")) {
            char *h = strchr(arg, ':');
            *h++ = '\0';
            size_t pitch = 0;
            rc = cuMemAllocPitch_v2(&p, &pitch, strtoull(arg, NULL, 10), strtoull(h, NULL, 10), 4);
            kept(rc, p, V2);
            printf("pitch %d %zu\n", rc, pitch);
        } else if (!strcmp(step, "async")) {
            rc = cuMemAllocAsync(&p, strtoull(arg, NULL, 10), NULL);
            kept(rc, p, ASYNC);
            printf("async %d\n", rc);
        } else if (!strcmp(step, "dlsym")) {
            CUresult (*fn)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))dlsym(driver(), "cuMemAlloc_v2");
            rc = fn(&p, strtoull(arg, NULL, 10));
            kept(rc, p, V2);
            printf("dlsym %d\n", rc);
        } else if (!strcmp(step, "getproc") || !strcmp(step, "getproc_ptsz")) {
            int ptsz = !strcmp(step, "getproc_ptsz");
            if (ptsz) {
                CUresult (*fn)(CUdeviceptr *, size_t, CUstream) =
                    (CUresult(*)(CUdeviceptr *, size_t, CUstream))proc("cuMemAllocAsync", 2);
                rc = fn(&p, strtoull(arg, NULL, 10), NULL);
                kept(rc, p, ASYNC);
            } else {
                CUresult (*fn)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))proc("cuMemAlloc", 0);
                rc = fn(&p, strtoull(arg, NULL, 10));
                kept(rc, p, V2);
            }
            printf("%s %d\n", step, rc);
        } else if (!strcmp(step, "free")) {
            int k = atoi(arg);
            if (held[k].kind == V1)
                rc = cuMemFree((CUdeviceptr_v1)held[k].p);
            else if (held[k].kind == HANDLE)
                rc = cuMemRelease(held[k].p);
            else if (held[k].kind == ASYNC)
                rc = cuMemFreeAsync(held[k].p, NULL);
            else
                rc = cuMemFree_v2(held[k].p);
            printf("free %d\n", rc);
        } else if (!strcmp(step, "free_getproc")) {
            CUresult (*fn)(CUdeviceptr) = (CUresult(*)(CUdeviceptr))proc("cuMemFree", 0);
            rc = fn(held[atoi(arg)].p);
            printf("free_getproc %d\n", rc);
        } else if (!strcmp(step, "info") || !strcmp(step, "info_getproc")) {
            size_t f = 0, t = 0;
            if (!strcmp(step, "info"))
                rc = cuMemGetInfo_v2(&f, &t);
            else
                rc = ((CUresult(*)(size_t *, size_t *))proc("cuMemGetInfo", 0))(&f, &t);
            printf("%s %d %zu %zu\n", step, rc, f, t);
        } else if (!strcmp(step, "info_v1")) {
            unsigned int f = 0, t = 0;
            rc = cuMemGetInfo(&f, &t);
            printf("info_v1 %d %u %u\n", rc, f, t);
        } else if (!strcmp(step, "which")) {
            printf("which %s %s\n", arg, object_of(dlsym(driver(), arg)));
        } else if (!strcmp(step, "which_proc")) {
            printf("which_proc %s %s\n", arg, object_of(proc(arg, 0)));
        } else if (!strcmp(step, "threads")) {
            int threads = atoi(strtok(arg, ":"));
            size_t size = strtoull(strtok(NULL, ":"), NULL, 10), rounds = strtoull(strtok(NULL, ":"), NULL, 10);
            struct worker *w = calloc(threads, sizeof *w);
            pthread_t *t = calloc(threads, sizeof *t);
            for (int k = 0; k < threads; k++) {
                w[k].size = size;
                w[k].rounds = rounds;
                pthread_create(&t[k], NULL, work, &w[k]);
            }
            size_t total = 0;
            for (int k = 0; k < threads; k++) {
                pthread_join(t[k], NULL);
                total += w[k].bytes;
            }
            printf("held %zu\n", total);
            pthread_barrier_init(&barrier, NULL, threads);
            for (int k = 0; k < threads; k++)
                pthread_create(&t[k], NULL, churn, &w[k]);
            for (int k = 0; k < threads; k++)
                pthread_join(t[k], NULL);
            size_t f = 0, tot = 0;
            cuMemGetInfo_v2(&f, &tot);
            printf("after %zu\n", tot - f);
        } else if (!strcmp(step, "init")) {
            printf("init %d\n", init_context());
        } else if (!strcmp(step, "time")) {
            long pairs = atol(strtok(arg, ":"));
            size_t size = strtoull(strtok(NULL, ":"), NULL, 10);
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            for (long k = 0; k < pairs; k++) {
                if (cuMemAlloc_v2(&p, size) != 0 || cuMemFree_v2(p) != 0) {
                    fprintf(stderr, "time: pair %ld failed\n", k);
                    return 1;
                }
            }
            clock_gettime(CLOCK_MONOTONIC, &t1);
            printf("time %.1f\n", ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / pairs);
        } else if (!strcmp(step, "pairs")) {
            long blocks = atol(strtok(arg, ":")), n = atol(strtok(NULL, ":"));
            size_t size = strtoull(strtok(NULL, ":"), NULL, 10);
            alloc_fn own_alloc = (alloc_fn)driver_own("cuMemAlloc_v2"), linked_alloc = cuMemAlloc_v2;
            free_fn own_free = (free_fn)driver_own("cuMemFree_v2"), linked_free = cuMemFree_v2;
            if (!own_alloc || !own_free || blocks < 1 || n < 1) {
                printf("pairs none\n");
                continue;
            }
            double *own = calloc(blocks, sizeof *own), *linked = calloc(blocks, sizeof *linked),
                   *diff = calloc(blocks, sizeof *diff);
            for (long b = 0; b < blocks; b++) {
                if (b % 2) { /* alternate which goes first, so drift favours neither */
                    own[b] = timed_pairs(own_alloc, own_free, n, size);
                    linked[b] = timed_pairs(linked_alloc, linked_free, n, size);
                } else {
                    linked[b] = timed_pairs(linked_alloc, linked_free, n, size);
                    own[b] = timed_pairs(own_alloc, own_free, n, size);
                }
                diff[b] = linked[b] - own[b];
            }
            printf("pairs %s ", object_of((void *)own_alloc));
            printf("%s %.1f %.1f %.1f\n", object_of((void *)linked_alloc), median(own, blocks), median(linked, blocks),
                   median(diff, blocks));
            free(own);
            free(linked);
            free(diff);
        } else if (!strcmp(step, "create") || !strcmp(step, "create_host")) {
            /* Pinned memory (type 1) at device 0, or on the host (location type 2). */
            CUmemAllocationProp prop = {.type = 1, .location = {.type = strcmp(step, "create") ? 2 : 1, .id = 0}};
            rc = cuMemCreate(&p, strtoull(arg, NULL, 10), &prop, 0);
            kept(rc, p, HANDLE);
            printf("%s %d\n", step, rc);
        } else if (!strcmp(step, "retain")) {
            rc = cuMemRetainAllocationHandle(&p, (void *)(uintptr_t)held[atoi(arg)].p);
            kept(rc, p, HANDLE);
            printf("retain %d\n", rc);
        } else if (!strcmp(step, "pool")) {
            void *pool = NULL;
            rc = cuDeviceGetDefaultMemPool(&pool, 0);
            if (rc == 0)
                rc = cuMemAllocFromPoolAsync(&p, strtoull(arg, NULL, 10), pool, NULL);
            kept(rc, p, ASYNC);
            printf("pool %d\n", rc);
        } else if (!strcmp(step, "fill")) {
            size_t size = strtoull(arg, NULL, 10), total = 0;
            while (n_held < (int)(sizeof held / sizeof *held) && cuMemAlloc_v2(&p, size) == 0) {
                kept(0, p, V2);
                total += size;
            }
            printf("fill %zu\n", total);
        } else if (!strcmp(step, "hold")) {
            char line[16];
            printf("hold\n");
            if (!fgets(line, sizeof line, stdin))
                line[0] = '\0';
        } else if (!strcmp(step, "spawn")) {
            int to_parent[2], to_child[2];
            if (pipe(to_parent) || pipe(to_child))
                return 4;
            child = fork();
            if (child == 0) {
                close(to_child[1]); /* so that the read below ends when the parent does */
                /* A CUDA context does not survive fork: a child of a parent that ran "init" could not use the
                 * driver, so on a real card "spawn" comes before "init" and the child makes its own context. */
                char c = (char)(context ? 100 : init_context());
                if (!c)
                    c = (char)cuMemAlloc_v2(&p, strtoull(arg, NULL, 10));
                if (write(to_parent[1], &c, 1) != 1 || read(to_child[0], &c, 1) < 0)
                    _exit(1);
                _exit(0);
            }
            close(to_child[0]);
            close(to_parent[1]);
            char c = 0;
            if (child < 0 || read(to_parent[0], &c, 1) != 1)
                return 4;
            printf("spawn %d\n", (int)c);
        } else if (!strcmp(step, "kill")) {
            int status = 0;
            kill(child, SIGKILL);
            printf("kill %d\n", waitpid(child, &status, 0) == child ? 0 : 1);
        } else if (!strcmp(step, "next")) {
            printf("next %c\n", hcs_next());
        } else {
            fprintf(stderr, "unknown step %s\n", step);
            return 2;
        }
    }
    return 0;
}
