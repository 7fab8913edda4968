// A null CUDA driver: measures ferry's host-side cost per request on a machine without a GPU.
//
// Built as libcuda.so.1 by scripts/host-cost.sh and found first through LD_LIBRARY_PATH, it
// answers the driver calls ferry and its bench make with no device at all: every copy runs at
// once on the calling thread (memmove), every stream and event is complete when asked, device
// memory is page-aligned host memory, an event's time is the host clock at its record. A
// submit + wait through ferry against raw cuMemcpyAsync + cuStreamSynchronize through it then
// differ by ferry's own host work (planning, routing, request bookkeeping, waiting), which on
// a GPU is part of what a caller waits for. Nothing timed through it is a GPU figure, and
// nothing asynchronous is modelled: tests that rely on a copy still running fail here.
// Calls it lacks make cudarc report the missing symbol.
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <pthread.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef uint64_t CUdeviceptr;
typedef void *CUcontext, *CUstream, *CUevent;
#define OK 0
#define INVALID 1

static int ctx_token;
static __thread CUcontext current;
struct alloc { uint64_t base, len; int type; };  // type 1 host (pinned), 2 device
static struct alloc allocs[65536];
static int nallocs;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void add(uint64_t b, uint64_t l, int t) {
  pthread_mutex_lock(&lock);
  if (nallocs < 65536) allocs[nallocs++] = (struct alloc){b, l, t};
  pthread_mutex_unlock(&lock);
}
static void del(uint64_t b) {
  pthread_mutex_lock(&lock);
  for (int i = 0; i < nallocs; i++) if (allocs[i].base == b) { allocs[i] = allocs[--nallocs]; break; }
  pthread_mutex_unlock(&lock);
}
static int find(uint64_t p) {
  int t = 0;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < nallocs; i++) if (p >= allocs[i].base && p < allocs[i].base + allocs[i].len) { t = allocs[i].type; break; }
  pthread_mutex_unlock(&lock);
  return t;
}
static double now_ms(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec / 1e6; }

CUresult cuInit(unsigned f) { (void)f; return OK; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return OK; }
CUresult cuDeviceGetCount(int *n) { *n = 1; return OK; }
CUresult cuDeviceGet(CUdevice *d, int o) { if (o != 0) return 101; *d = 0; return OK; }
CUresult cuDeviceGetName(char *n, int len, CUdevice d) { (void)d; snprintf(n, len, "null CUDA driver"); return OK; }
CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d) { (void)d; *b = (size_t)16 << 30; return OK; }
CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { *f = (size_t)15 << 30; *t = (size_t)16 << 30; return OK; }
CUresult cuDeviceGetPCIBusId(char *s, int len, CUdevice d) { (void)d; snprintf(s, len, "0000:00:00.0"); return OK; }
CUresult cuDeviceGetAttribute(int *v, int a, CUdevice d) {
  (void)d;
  switch (a) {
    case 11: *v = 2147483647; break;      // max pitch
    case 16: *v = 132; break;             // SMs
    case 36: *v = 2619000; break;
    case 37: *v = 6144; break;
    case 40: *v = 5; break;               // async engines
    case 75: *v = 9; break;
    case 76: *v = 0; break;
    case 100: *v = 0; break;
    default: *v = 1;
  }
  return OK;
}
CUresult cuDeviceCanAccessPeer(int *c, CUdevice a, CUdevice b) { (void)a; (void)b; *c = 0; return OK; }
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) { (void)d; *c = &ctx_token; return OK; }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { (void)d; return OK; }
CUresult cuCtxSetCurrent(CUcontext c) { current = c; return OK; }
CUresult cuCtxGetCurrent(CUcontext *c) { *c = current; return OK; }
CUresult cuCtxPushCurrent_v2(CUcontext c) { current = c; return OK; }
CUresult cuCtxPopCurrent_v2(CUcontext *c) { if (c) *c = current; return OK; }
CUresult cuCtxSynchronize(void) { return OK; }
CUresult cuCtxGetDevice(CUdevice *d) { *d = 0; return OK; }

CUresult cuStreamCreate(CUstream *s, unsigned f) { (void)f; *s = malloc(8); return OK; }
CUresult cuStreamCreateWithPriority(CUstream *s, unsigned f, int p) { (void)p; return cuStreamCreate(s, f); }
CUresult cuStreamDestroy_v2(CUstream s) { free(s); return OK; }
CUresult cuStreamSynchronize(CUstream s) { (void)s; return OK; }
CUresult cuStreamQuery(CUstream s) { (void)s; return OK; }
CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned f) { (void)s; (void)e; (void)f; return OK; }

CUresult cuEventCreate(CUevent *e, unsigned f) { (void)f; double *t = malloc(sizeof(double)); *t = now_ms(); *e = t; return OK; }
CUresult cuEventDestroy_v2(CUevent e) { free(e); return OK; }
CUresult cuEventRecord(CUevent e, CUstream s) { (void)s; *(double *)e = now_ms(); return OK; }
CUresult cuEventRecordWithFlags(CUevent e, CUstream s, unsigned f) { (void)f; return cuEventRecord(e, s); }
CUresult cuEventQuery(CUevent e) { (void)e; return OK; }
CUresult cuEventSynchronize(CUevent e) { (void)e; return OK; }
CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) { *ms = (float)(*(double *)b - *(double *)a); return OK; }
CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b) { return cuEventElapsedTime(ms, a, b); }

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  void *m = NULL;
  if (posix_memalign(&m, 4096, n ? n : 1)) return 2;
  *p = (uint64_t)m; add(*p, n ? n : 1, 2); return OK;
}
CUresult cuMemFree_v2(CUdeviceptr p) { del(p); free((void *)p); return OK; }
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) { (void)s; return cuMemAlloc_v2(p, n); }
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { (void)s; return cuMemFree_v2(p); }
CUresult cuMemHostAlloc(void **p, size_t n, unsigned f) {
  (void)f; void *m = NULL;
  if (posix_memalign(&m, 4096, n ? n : 1)) return 2;
  *p = m; add((uint64_t)m, n ? n : 1, 1); return OK;
}
CUresult cuMemAllocHost_v2(void **p, size_t n) { return cuMemHostAlloc(p, n, 0); }
CUresult cuMemFreeHost(void *p) { del((uint64_t)p); free(p); return OK; }
CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned f) { (void)f; add((uint64_t)p, n, 1); return OK; }
CUresult cuMemHostUnregister(void *p) { del((uint64_t)p); return OK; }
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned f) { (void)f; *d = (uint64_t)p; return OK; }
CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p) {
  int t = find(p);
  if (!t) return INVALID;
  switch (attr) {
    case 2: *(unsigned *)data = (unsigned)t; return OK;            // memory type
    case 1: *(CUcontext *)data = &ctx_token; return OK;            // context
    case 3: case 4: *(uint64_t *)data = p; return OK;              // device / host pointer
    case 9: *(int *)data = 0; return OK;                           // device ordinal
    case 8: *(int *)data = 0; return OK;                           // is managed
    default: return INVALID;
  }
}

CUresult cuPointerGetAttributes(unsigned n, int *attrs, void **data, CUdeviceptr p) {
  // As the driver: an unknown address gets zeros and success.
  int t = find(p);
  for (unsigned i = 0; i < n; i++) {
    switch (attrs[i]) {
      case 2: *(unsigned *)data[i] = (unsigned)t; break;         // memory type
      case 11: *(uint64_t *)data[i] = 0; break;                  // range start: unknown
      case 12: *(size_t *)data[i] = 0; break;                    // range size: unknown
      default: if (t && cuPointerGetAttribute(data[i], attrs[i], p) != OK) return INVALID;
    }
  }
  return OK;
}

CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { (void)st; memmove((void *)d, (void *)s, n); return OK; }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, CUstream st) { (void)st; memmove((void *)d, s, n); return OK; }
CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, CUstream st) { (void)st; memmove(d, (void *)s, n); return OK; }
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { (void)st; memmove((void *)d, (void *)s, n); return OK; }
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { memmove((void *)d, s, n); return OK; }
CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { memmove(d, (void *)s, n); return OK; }
CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { memmove((void *)d, (void *)s, n); return OK; }
CUresult cuMemcpy(CUdeviceptr d, CUdeviceptr s, size_t n) { memmove((void *)d, (void *)s, n); return OK; }
CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { memset((void *)d, v, n); return OK; }
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) { (void)s; memset((void *)d, v, n); return OK; }
typedef void (*CUhostFn)(void *);
CUresult cuLaunchHostFunc(CUstream s, CUhostFn f, void *u) { (void)s; f(u); return OK; }
CUresult cuGetErrorString(CUresult e, const char **s) { (void)e; *s = "null driver error"; return OK; }
CUresult cuGetErrorName(CUresult e, const char **s) { (void)e; *s = "CUDA_ERROR_NULL_DRIVER"; return OK; }
CUresult cuStreamWaitValue32_v2(CUstream s, CUdeviceptr a, uint32_t v, unsigned f) { (void)s; (void)a; (void)v; (void)f; return OK; }
CUresult cuStreamWriteValue32_v2(CUstream s, CUdeviceptr a, uint32_t v, unsigned f) { (void)s; (void)f; *(volatile uint32_t *)a = v; return OK; }
CUresult cuStreamWaitValue64_v2(CUstream s, CUdeviceptr a, uint64_t v, unsigned f) { (void)s; (void)a; (void)v; (void)f; return OK; }
CUresult cuStreamWriteValue64_v2(CUstream s, CUdeviceptr a, uint64_t v, unsigned f) { (void)s; (void)f; *(volatile uint64_t *)a = v; return OK; }
