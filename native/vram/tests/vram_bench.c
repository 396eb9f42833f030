/*
 * Allocate/free pairs against the stub CUDA driver (benchmarks/vram_overhead.py), in one process: blocks
 * of pairs through the stub's unwrapped aliases (the baseline) alternate with blocks through the driver's
 * names (the interceptor's wrappers when it is preloaded), so load on the machine hits both alike.
 * Prints the median nanoseconds per pair of each and the median of the two's difference within a block
 * pair: "<baseline> <through the driver's names> <difference>".
 * Usage: vram_bench BLOCKS PAIRS_PER_BLOCK SIZE THREADS linked|getproc
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long cuuint64_t;
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*proc_fn)(const char *, void **, int, cuuint64_t, int *);

CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult hcs_stub_alloc(CUdeviceptr *, size_t);
CUresult hcs_stub_free(CUdeviceptr);

static alloc_fn wrapped_alloc = cuMemAlloc_v2;
static free_fn wrapped_free = cuMemFree_v2;
static long blocks, pairs;
static size_t size;

struct times {
    double *bare, *wrapped;
};

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static double block(alloc_fn a, free_fn f) {
    CUdeviceptr p;
    double start = now();
    for (long i = 0; i < pairs; i++) {
        if (a(&p, size) != 0) {
            fprintf(stderr, "allocation failed\n");
            exit(1);
        }
        f(p);
    }
    return (now() - start) / pairs;
}

static void *loop(void *arg) {
    struct times *t = arg;
    for (long b = 0; b < blocks; b++) {
        if (b % 2) { /* alternate which goes first, so drift favours neither */
            t->bare[b] = block(hcs_stub_alloc, hcs_stub_free);
            t->wrapped[b] = block(wrapped_alloc, wrapped_free);
        } else {
            t->wrapped[b] = block(wrapped_alloc, wrapped_free);
            t->bare[b] = block(hcs_stub_alloc, hcs_stub_free);
        }
    }
    return NULL;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, long n) {
    qsort(v, n, sizeof *v, by_value);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: vram_bench BLOCKS PAIRS_PER_BLOCK SIZE THREADS linked|getproc\n");
        return 2;
    }
    blocks = atol(argv[1]);
    pairs = atol(argv[2]);
    size = strtoull(argv[3], NULL, 10);
    int threads = atoi(argv[4]);
    if (threads < 1 || threads > 64)
        return 2;
    if (!strcmp(argv[5], "getproc")) {
        proc_fn get = (proc_fn)dlsym(dlopen("libcuda.so.1", RTLD_NOW), "cuGetProcAddress_v2");
        get("cuMemAlloc", (void **)&wrapped_alloc, 12000, 0, NULL);
        get("cuMemFree", (void **)&wrapped_free, 12000, 0, NULL);
    }
    double *bare = calloc(blocks * threads, sizeof *bare), *wrapped = calloc(blocks * threads, sizeof *wrapped);
    struct times t[64];
    pthread_t id[64];
    for (int k = 0; k < threads; k++) {
        t[k].bare = bare + k * blocks;
        t[k].wrapped = wrapped + k * blocks;
        pthread_create(&id[k], NULL, loop, &t[k]);
    }
    for (int k = 0; k < threads; k++)
        pthread_join(id[k], NULL);
    long n = blocks * threads;
    double *diff = calloc(n, sizeof *diff);
    for (long i = 0; i < n; i++)
        diff[i] = wrapped[i] - bare[i];
    printf("%.1f %.1f %.1f\n", median(bare, n), median(wrapped, n), median(diff, n));
    return 0;
}
