/*
 * A stand-in for the CUDA driver (libcuda.so.1) for the interceptor's tests and benchmark: the memory
 * calls of the real driver's ABI over a fake pool of HCS_STUB_POOL_BYTES (default 80 GiB). A device
 * pointer is a small host block holding the allocation's size, so frees are O(1) and exact.
 * HCS_STUB_SPIN makes every allocate and free spin that many loop turns, like a driver call that costs time.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned int CUdeviceptr_v1;
typedef void *CUstream;
typedef unsigned long long cuuint64_t;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_FOUND 500

static size_t pool = 80ULL << 30;
static _Atomic size_t in_use;
static long spin_loops;

__attribute__((constructor)) static void start(void) {
    const char *p = getenv("HCS_STUB_POOL_BYTES");
    if (p && *p)
        pool = strtoull(p, NULL, 10);
    const char *l = getenv("HCS_STUB_SPIN");
    if (l && *l)
        spin_loops = strtol(l, NULL, 10);
}

/* A busy loop, not the clock: reading the clock may itself be a system call costing microseconds. */
static void spin(void) {
    for (volatile long i = 0; i < spin_loops; i = i + 1)
        ;
}

/* Count n bytes against the pool, as a driver does before it maps them. */
static int charge(size_t n) {
    size_t cur = atomic_load(&in_use);
    do {
        if (n > pool || cur > pool - n)
            return 0;
    } while (!atomic_compare_exchange_weak(&in_use, &cur, cur + n));
    return 1;
}

static CUresult take(CUdeviceptr *dptr, size_t n) {
    spin();
    if (!dptr || n == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!charge(n))
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t *block = malloc(sizeof(size_t) * 2);
    block[0] = n;
    block[1] = 0;
    *dptr = (CUdeviceptr)(uintptr_t)block;
    return CUDA_SUCCESS;
}

static CUresult give(CUdeviceptr p) {
    spin();
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    size_t *block = (size_t *)(uintptr_t)p;
    atomic_fetch_sub(&in_use, block[0]);
    free(block);
    return CUDA_SUCCESS;
}

/* What a real driver needs before it allocates (vram_probe's "init"): nothing here. */
CUresult cuInit(unsigned int flags) {
    (void)flags;
    return CUDA_SUCCESS;
}
CUresult cuDeviceGet(int *device, int ordinal) {
    *device = ordinal;
    return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRetain(void **context, int device) {
    *context = (void *)(uintptr_t)(device + 1);
    return CUDA_SUCCESS;
}
CUresult cuCtxSetCurrent(void *context) {
    (void)context;
    return CUDA_SUCCESS;
}

/* The pre-3.2 calls hand out 32-bit device pointers: ids into a small table. */
#define V1_SLOTS 4096
static size_t v1_sizes[V1_SLOTS];
static pthread_mutex_t v1_lock = PTHREAD_MUTEX_INITIALIZER;

CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int n) {
    if (!dptr || n == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&v1_lock);
    for (unsigned int i = 1; i < V1_SLOTS; i++) {
        if (v1_sizes[i])
            continue;
        if (!charge(n))
            break;
        v1_sizes[i] = n;
        pthread_mutex_unlock(&v1_lock);
        *dptr = i << 12;
        return CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&v1_lock);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuMemFree(CUdeviceptr_v1 p) {
    unsigned int i = p >> 12;
    if (i == 0 || i >= V1_SLOTS)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&v1_lock);
    size_t n = v1_sizes[i];
    v1_sizes[i] = 0;
    pthread_mutex_unlock(&v1_lock);
    if (!n)
        return CUDA_ERROR_INVALID_VALUE;
    atomic_fetch_sub(&in_use, n);
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t n) { return take(dptr, n); }
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t n, unsigned int flags) {
    (void)flags;
    return take(dptr, n);
}
/* Rows padded to 512 bytes, as a driver aligns them. */
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned int e) {
    (void)e;
    if (!pitch)
        return CUDA_ERROR_INVALID_VALUE;
    size_t padded = (width + 511) / 512 * 512;
    CUresult rc = take(dptr, padded * height);
    if (rc == CUDA_SUCCESS)
        *pitch = padded;
    return rc;
}
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t n, CUstream s) {
    (void)s;
    return take(dptr, n);
}
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t n, CUstream s) {
    (void)s;
    return take(dptr, n);
}
CUresult cuMemFree_v2(CUdeviceptr p) { return give(p); }
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) {
    (void)s;
    return give(p);
}
CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) {
    (void)s;
    return give(p);
}
/* The virtual memory management API's physical allocations: a handle is a block like a device pointer. Host
 * locations (type 2 and up) take host memory, not the pool's. */
typedef struct {
    int type, requestedHandleTypes;
    struct {
        int type, id;
    } location;
    void *win32HandleMetaData;
    unsigned char allocFlags[8];
} CUmemAllocationProp;

CUresult cuMemCreate(unsigned long long *handle, size_t n, const CUmemAllocationProp *prop, unsigned long long flags) {
    (void)flags;
    if (!prop || prop->location.type != 1) {
        size_t *block = calloc(2, sizeof(size_t));
        *handle = (unsigned long long)(uintptr_t)block;
        return CUDA_SUCCESS;
    }
    return take((CUdeviceptr *)handle, n);
}
/* block[1] counts the extra references of cuMemRetainAllocationHandle (whose address is the handle here). */
CUresult cuMemRetainAllocationHandle(unsigned long long *handle, void *addr) {
    ((size_t *)addr)[1]++;
    *handle = (unsigned long long)(uintptr_t)addr;
    return CUDA_SUCCESS;
}
CUresult cuMemRelease(unsigned long long handle) {
    size_t *block = (size_t *)(uintptr_t)handle;
    if (block && block[1]) {
        block[1]--;
        return CUDA_SUCCESS;
    }
    return give(handle);
}
/* Memory pools: the default pool of a device is the only one here. */
CUresult cuDeviceGetDefaultMemPool(void **pool, int device) {
    *pool = (void *)(uintptr_t)(device + 16);
    return CUDA_SUCCESS;
}
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t n, void *mempool, CUstream s) {
    (void)mempool;
    (void)s;
    return take(dptr, n);
}
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t n, void *mempool, CUstream s) {
    (void)mempool;
    (void)s;
    return take(dptr, n);
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    size_t u = atomic_load(&in_use);
    *free_bytes = pool - u;
    *total = pool;
    return CUDA_SUCCESS;
}
CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total) {
    size_t u = atomic_load(&in_use);
    *free_bytes = (unsigned int)(pool - u > 0xffffffffULL ? 0xffffffffULL : pool - u);
    *total = (unsigned int)(pool > 0xffffffffULL ? 0xffffffffULL : pool);
    return CUDA_SUCCESS;
}

/* How the driver answers cuGetProcAddress: the _v2 entry point from CUDA 3.2 on, the _ptsz one for the
 * per-thread default stream. */
static CUresult lookup(const char *symbol, void **pfn, int version, cuuint64_t flags);

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    return lookup(symbol, pfn, version, flags);
}
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags, int *status) {
    CUresult rc = lookup(symbol, pfn, version, flags);
    if (status)
        *status = rc == CUDA_SUCCESS ? 0 : 1;
    return rc;
}

static CUresult lookup(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    int v2 = version >= 3020, ptsz = (flags & 2) != 0;
    void *fn = NULL;
    if (!strcmp(symbol, "cuMemAlloc"))
        fn = v2 ? (void *)cuMemAlloc_v2 : (void *)cuMemAlloc;
    else if (!strcmp(symbol, "cuMemFree"))
        fn = v2 ? (void *)cuMemFree_v2 : (void *)cuMemFree;
    else if (!strcmp(symbol, "cuMemGetInfo"))
        fn = v2 ? (void *)cuMemGetInfo_v2 : (void *)cuMemGetInfo;
    else if (!strcmp(symbol, "cuMemAllocPitch"))
        fn = (void *)cuMemAllocPitch_v2;
    else if (!strcmp(symbol, "cuMemAllocManaged"))
        fn = (void *)cuMemAllocManaged;
    else if (!strcmp(symbol, "cuMemAllocAsync"))
        fn = ptsz ? (void *)cuMemAllocAsync_ptsz : (void *)cuMemAllocAsync;
    else if (!strcmp(symbol, "cuMemFreeAsync"))
        fn = ptsz ? (void *)cuMemFreeAsync_ptsz : (void *)cuMemFreeAsync;
    else if (!strcmp(symbol, "cuMemCreate"))
        fn = (void *)cuMemCreate;
    else if (!strcmp(symbol, "cuMemRelease"))
        fn = (void *)cuMemRelease;
    else if (!strcmp(symbol, "cuMemRetainAllocationHandle"))
        fn = (void *)cuMemRetainAllocationHandle;
    else if (!strcmp(symbol, "cuMemAllocFromPoolAsync"))
        fn = ptsz ? (void *)cuMemAllocFromPoolAsync_ptsz : (void *)cuMemAllocFromPoolAsync;
    else if (!strcmp(symbol, "cuGetProcAddress"))
        fn = version >= 12000 ? (void *)cuGetProcAddress_v2 : (void *)cuGetProcAddress;
    *pfn = fn;
    return fn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

/* The same calls under names no interceptor wraps: the benchmark's baseline within one process. */
CUresult hcs_stub_alloc(CUdeviceptr *dptr, size_t n) __attribute__((alias("cuMemAlloc_v2")));
CUresult hcs_stub_free(CUdeviceptr p) __attribute__((alias("cuMemFree_v2")));
