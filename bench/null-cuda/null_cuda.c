// A null CUDA driver: ferry's CUDA engine on a machine without a GPU, for CI and for measuring
// ferry's host-side cost per request.
//
// Built as libcuda.so.1 (scripts/host-cost.sh, scripts/null-cuda-test.sh) and found first
// through LD_LIBRARY_PATH (cudarc loads the driver at run time), it answers the driver calls
// ferry, its tests and its bench make with no device at all: one device, named "null CUDA
// driver" (the name the tests look for), whose memory is page-aligned host memory (15 GiB of
// it can be allocated, counted: beyond that an allocation fails with
// CUDA_ERROR_OUT_OF_MEMORY, and cuMemGetInfo reports what is left); copies and fills are
// memmove and memset; an event's time is the host clock when its stream reached it (when the
// work before it ended, or when it was recorded on an idle stream). Device addresses
// given to copies, fills and stream memory operations must lie in one allocation (device,
// managed, page-locked or registered host memory), else the call fails with
// CUDA_ERROR_INVALID_VALUE, as a bad address does on a GPU, instead of corrupting the process.
//
// Two modes:
// - Synchronous (the default): every call runs at once on the calling thread, every stream
//   and event is complete when asked. A submit + wait through ferry against a raw
//   cuMemcpyAsync + cuStreamSynchronize through this driver then differ by ferry's own host
//   work (scripts/host-cost.sh). Nothing timed through it is a GPU figure.
// - Asynchronous (NULL_CUDA_ASYNC=<microseconds>, or nullcuda_async() at run time): work
//   enqueued on a created stream (1-D, 2-D, 3-D, peer and batched copies, fills, stream
//   memory operations, host functions, event records, waits on events, prefetches,
//   cuMemFreeAsync) runs in order on that stream's own worker thread, each copy, fill, write,
//   host function or free after a delay of 0.5x-1.5x the given time (pseudo-random per
//   stream), so completions come late and, across streams, out of order. cuStreamQuery and
//   cuEventQuery answer CUDA_ERROR_NOT_READY until the work is done; cuStreamSynchronize,
//   cuEventSynchronize and cuCtxSynchronize block until it is; cuStreamWaitEvent makes the
//   stream's worker wait for the event's last record; cuStreamWaitValue32/64 make it poll the
//   word. Work on the legacy default stream (0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD) and
//   the synchronous calls (cuMemcpyHtoD, cuMemsetD8, ...) first wait for the work enqueued
//   before them on every blocking stream (one made without CU_STREAM_NON_BLOCKING), as the
//   legacy stream does, then run at once; cuCtxSynchronize, cuMemFree, cuMemFreeHost and
//   cuMemHostUnregister wait for the work of every stream. A copy from or to pageable
//   host memory waits for its stream and runs at once, as the driver's pageable copies return
//   only once the host buffer may be reused. cuStreamDestroy waits for its stream's work; a
//   destroyed event still waited on is freed when the wait is done.
//
// Control API for tests, found with dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD) + dlsym
// (crates/ferry/tests/cuda_common/null.rs wraps it):
//   void nullcuda_fail(const char *entry_point, int nth, int code): the nth next call of that
//       exported entry point (its exact name, e.g. "cuMemcpyHtoDAsync_v2", "cuEventRecord";
//       nth 1 is the next call) returns `code` and does nothing else; `code` must be one of
//       the driver's CUresult values (cudarc reads the result as its enum). Several may be armed.
//       The environment's NULL_CUDA_FAIL=name:nth:code[,name:nth:code...] arms them at load.
//   void nullcuda_clear(void): forgets every armed failure.
//   int nullcuda_pending(void): operations enqueued on any stream and not yet done.
//   void nullcuda_async(int usec): sets the delay at run time (0: synchronous again; work
//       already queued still finishes in its stream's order first).
//   void nullcuda_count(int on): on (nonzero): forgets the counts and counts every call of
//       every entry point from now on; 0: stops counting (the counts stay readable).
//   long nullcuda_calls(const char *entry_point): calls of that entry point (its exact name)
//       counted since counting was last switched on.
//   int nullcuda_batch_attrs(long *out, int max): the attributes of the last batched copy
//       the driver took (either symbol): returns how many it had and writes the first `max`
//       of them, 8 longs each: the index its attribute applies from, srcAccessOrder,
//       srcLocHint's type and id, dstLocHint's type and id, flags, and the batch's count.
//   void nullcuda_batch_fail_at(int idx): the next batched copy (either symbol) with more
//       than `idx` copies fails with CUDA_ERROR_INVALID_VALUE after enqueueing its copies
//       before `idx` (12.8's cuMemcpyBatchAsync names `idx` in failIdx; `_v2` has none, so
//       there it enqueues nothing); -1 disarms it.
//
// The batched copy: cuMemcpyBatchAsync (CUDA 12.8's ABI, with failIdx) and, unless built with
// -DNULL_CUDA_NO_BATCH_V2 (a driver older than CUDA 13: scripts/null-cuda-test.sh builds
// that one too, as target/null-cuda/v1/libcuda.so.1), cuMemcpyBatchAsync_v2.
//
// Not modelled: kernels (cuModuleLoad* answer CUDA_ERROR_NO_BINARY_FOR_GPU; ferry builds its
// kernels with NVRTC, absent on CI anyway), more than one device, peer access, memory
// arrays, errors raised by work after it was enqueued (an injected failure is the call's own
// return value), cuStreamWaitValue* in the synchronous mode (they return at once). Calls it
// lacks make cudarc report the missing symbol.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef uint64_t CUdeviceptr;
typedef void *CUcontext;
typedef struct stream *CUstream;
typedef struct event *CUevent;
typedef void (*CUhostFn)(void *);

enum {
  OK = 0,
  INVALID_VALUE = 1,
  OUT_OF_MEMORY = 2,
  INVALID_DEVICE = 101,
  NO_BINARY_FOR_GPU = 209,
  INVALID_HANDLE = 400,
  NOT_READY = 600,
  ALREADY_REGISTERED = 712,
  NOT_REGISTERED = 713,
};

// CUmemorytype
enum { MT_HOST = 1, MT_DEVICE = 2, MT_ARRAY = 3, MT_UNIFIED = 4 };

typedef struct {
  size_t srcXInBytes, srcY;
  int srcMemoryType;
  const void *srcHost;
  CUdeviceptr srcDevice;
  void *srcArray;
  size_t srcPitch;
  size_t dstXInBytes, dstY;
  int dstMemoryType;
  void *dstHost;
  CUdeviceptr dstDevice;
  void *dstArray;
  size_t dstPitch;
  size_t WidthInBytes, Height;
} CUDA_MEMCPY2D;

typedef struct {
  size_t srcXInBytes, srcY, srcZ, srcLOD;
  int srcMemoryType;
  const void *srcHost;
  CUdeviceptr srcDevice;
  void *srcArray;
  void *reserved0;
  size_t srcPitch, srcHeight;
  size_t dstXInBytes, dstY, dstZ, dstLOD;
  int dstMemoryType;
  void *dstHost;
  CUdeviceptr dstDevice;
  void *dstArray;
  void *reserved1;
  size_t dstPitch, dstHeight;
  size_t WidthInBytes, Height, Depth;
} CUDA_MEMCPY3D;

typedef struct { int type; int id; } CUmemLocation;

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

// ---------------------------------------------------------------------------------------------
// Injected failures: the nth next call of an entry point returns a code.

struct fault { char name[64]; int left, code; };
static struct fault faults[64];
static int nfaults;
static atomic_int armed;  // nfaults, read without the lock on every call
static pthread_mutex_t fault_lock = PTHREAD_MUTEX_INITIALIZER;

void nullcuda_fail(const char *entry_point, int nth, int code) {
  if (!entry_point || code == OK) return;
  pthread_mutex_lock(&fault_lock);
  if (nfaults < (int)(sizeof faults / sizeof faults[0])) {
    struct fault *f = &faults[nfaults++];
    snprintf(f->name, sizeof f->name, "%s", entry_point);
    f->left = nth < 1 ? 1 : nth;
    f->code = code;
  } else {
    fprintf(stderr, "null CUDA driver: more than 64 failures armed, %s ignored\n", entry_point);
  }
  atomic_store(&armed, nfaults);
  pthread_mutex_unlock(&fault_lock);
}

void nullcuda_clear(void) {
  pthread_mutex_lock(&fault_lock);
  nfaults = 0;
  atomic_store(&armed, 0);
  pthread_mutex_unlock(&fault_lock);
}

// Counts a call of `fn` against every failure armed for it; the code of one that falls due.
static int injected(const char *fn) {
  int code = OK;
  pthread_mutex_lock(&fault_lock);
  for (int i = 0; i < nfaults;) {
    if (strcmp(faults[i].name, fn) == 0 && --faults[i].left == 0) {
      if (code == OK) code = faults[i].code;
      faults[i] = faults[--nfaults];
      continue;
    }
    i++;
  }
  atomic_store(&armed, nfaults);
  pthread_mutex_unlock(&fault_lock);
  return code;
}

// ---------------------------------------------------------------------------------------------
// Counted calls: per entry point, while counting is on.

struct counted { char name[48]; long n; };
static struct counted counts[256];
static int ncounts;
static atomic_int counting;
static pthread_mutex_t count_lock = PTHREAD_MUTEX_INITIALIZER;

void nullcuda_count(int on) {
  pthread_mutex_lock(&count_lock);
  if (on) ncounts = 0;
  atomic_store(&counting, on != 0);
  pthread_mutex_unlock(&count_lock);
}

long nullcuda_calls(const char *entry_point) {
  long n = 0;
  pthread_mutex_lock(&count_lock);
  for (int i = 0; i < ncounts; i++)
    if (entry_point && strcmp(counts[i].name, entry_point) == 0) n = counts[i].n;
  pthread_mutex_unlock(&count_lock);
  return n;
}

static void count_call(const char *fn) {
  pthread_mutex_lock(&count_lock);
  int i = 0;
  while (i < ncounts && strcmp(counts[i].name, fn) != 0) i++;
  if (i == ncounts && ncounts < (int)(sizeof counts / sizeof counts[0])) {
    snprintf(counts[i].name, sizeof counts[i].name, "%s", fn);
    counts[i].n = 0;
    ncounts++;
  }
  if (i < ncounts) counts[i].n++;
  pthread_mutex_unlock(&count_lock);
}

// The first statement of every entry point: counts the call while counting is on, and returns
// an injected failure if one falls due.
#define ENTRY()                                                            \
  do {                                                                     \
    if (atomic_load_explicit(&counting, memory_order_relaxed))             \
      count_call(__func__);                                                \
    if (atomic_load_explicit(&armed, memory_order_relaxed)) {              \
      int injected_code = injected(__func__);                              \
      if (injected_code != OK) return injected_code;                       \
    }                                                                      \
  } while (0)

// ---------------------------------------------------------------------------------------------
// Allocations: what the driver knows of an address.

enum { A_PINNED = 1, A_DEVICE = 2, A_MANAGED = 3, A_REGISTERED = 4 };
struct alloc { uint64_t base, len; int type; };
#define MAX_ALLOCS 65536
static struct alloc allocs[MAX_ALLOCS];
static int nallocs;
static const uint64_t total_mem = 16ull << 30;
static const uint64_t device_capacity = 15ull << 30;  // what cuMemAlloc may hand out
static uint64_t device_used;
static pthread_mutex_t alloc_lock = PTHREAD_MUTEX_INITIALIZER;
// Bumped (under the lock) by every removal: a thread's cached lookups of an older generation
// are stale. An addition leaves every cached lookup true.
static _Atomic uint64_t alloc_gen;
// The allocations this thread found last, valid while `alloc_gen` is `gen`: the lookups of a
// copy's two ends then take no lock, and the synchronous mode's cost per call stays near the
// memmove's (scripts/host-cost.sh subtracts it).
static __thread struct { uint64_t gen, base, len; int type; } seen[4];
static __thread unsigned seen_next;

static int is_device(int type) { return type == A_DEVICE || type == A_MANAGED; }

// Records an allocation; device memory only within the capacity. Lock held.
static CUresult add_locked(uint64_t b, uint64_t l, int t) {
  if (nallocs == MAX_ALLOCS) return OUT_OF_MEMORY;
  if (is_device(t)) device_used += l;
  allocs[nallocs++] = (struct alloc){b, l, t};
  return OK;
}

// Forgets the allocation starting at `b`; its type, or 0 if there was none.
static int del(uint64_t b) {
  int t = 0;
  pthread_mutex_lock(&alloc_lock);
  for (int i = 0; i < nallocs; i++) {
    if (allocs[i].base == b) {
      t = allocs[i].type;
      if (is_device(t)) device_used -= allocs[i].len;
      allocs[i] = allocs[--nallocs];
      atomic_fetch_add(&alloc_gen, 1);
      break;
    }
  }
  pthread_mutex_unlock(&alloc_lock);
  return t;
}

// The allocation holding address `p`: its type (0: none, pageable host memory) and range.
static int find(uint64_t p, uint64_t *base, uint64_t *len) {
  uint64_t gen = atomic_load(&alloc_gen);
  for (unsigned i = 0; i < 4; i++) {
    if (seen[i].type && seen[i].gen == gen && p - seen[i].base < seen[i].len) {
      if (base) *base = seen[i].base;
      if (len) *len = seen[i].len;
      return seen[i].type;
    }
  }
  int t = 0;
  pthread_mutex_lock(&alloc_lock);
  gen = atomic_load(&alloc_gen);
  for (int i = 0; i < nallocs; i++) {
    if (p >= allocs[i].base && p - allocs[i].base < allocs[i].len) {
      t = allocs[i].type;
      if (base) *base = allocs[i].base;
      if (len) *len = allocs[i].len;
      seen[seen_next++ % 4] = (typeof(seen[0])){gen, allocs[i].base, allocs[i].len, t};
      break;
    }
  }
  pthread_mutex_unlock(&alloc_lock);
  return t;
}

// Whether the `n` bytes at `p` lie in one allocation the driver knows (n = 0: always).
static int known(uint64_t p, size_t n) {
  uint64_t b = 0, l = 0;
  if (n == 0) return 1;
  return find(p, &b, &l) != 0 && p - b <= l && n <= l - (p - b);
}

static CUresult alloc_device(CUdeviceptr *p, size_t n, int type) {
  void *m = NULL;
  size_t len = n ? n : 1;
  pthread_mutex_lock(&alloc_lock);
  CUresult r = OUT_OF_MEMORY;
  if (device_used + len <= device_capacity && !posix_memalign(&m, 4096, (len + 4095) & ~4095ull)) {
    r = add_locked((uint64_t)m, len, type);
    if (r != OK) free(m);
  }
  pthread_mutex_unlock(&alloc_lock);
  if (r == OK) *p = (uint64_t)m;
  return r;
}

static CUresult alloc_host(void **p, size_t n) {
  void *m = NULL;
  size_t len = n ? n : 1;
  if (posix_memalign(&m, 4096, len)) return OUT_OF_MEMORY;
  pthread_mutex_lock(&alloc_lock);
  CUresult r = add_locked((uint64_t)m, len, A_PINNED);
  pthread_mutex_unlock(&alloc_lock);
  if (r != OK) {
    free(m);
    return r;
  }
  *p = m;
  return OK;
}

// ---------------------------------------------------------------------------------------------
// Streams, events and the work on them.

struct event {
  double t;              // host time at which its stream reached the last completed record
  uint64_t rec, done;    // records made; the last record completed
  unsigned flags;
  int refs, dead;        // queued operations naming it; destroyed by the caller
};

enum op_kind { OP_COPY, OP_SET, OP_COPY2D, OP_COPY3D, OP_BATCH, OP_HOST_FN, OP_WRITE,
               OP_WAIT_VALUE, OP_RECORD, OP_WAIT_EVENT, OP_FREE, OP_NOP };

struct op {
  struct op *next;
  uint64_t seq;  // submission order over all streams
  double queued;  // host time of the submission, ms
  enum op_kind kind;
  union {
    struct { void *dst; const void *src; size_t n; } copy;
    struct { unsigned char *dst; size_t pitch, width, height; uint32_t value; int size; } set;
    CUDA_MEMCPY2D c2;
    CUDA_MEMCPY3D c3;
    struct { CUdeviceptr *dsts, *srcs; size_t *sizes; size_t count; } batch;
    struct { CUhostFn fn; void *arg; } host;
    struct { uint64_t addr, value; unsigned flags; int wide; } mem;
    struct { struct event *e; uint64_t gen; } ev;
    struct { CUdeviceptr p; } free;
  } u;
};

struct stream {
  unsigned flags;
  struct op *head, *tail;  // the head stays queued while it runs
  pthread_t thread;
  int started, stop;
  pthread_cond_t wake;     // work arrived, or stop
  uint64_t rng;
  double reached;          // host time its last operation ended, ms (a record takes none)
  struct stream *prev, *next;
};

static atomic_int delay_us;     // 0: synchronous
static atomic_int pending;      // operations queued and not done
static pthread_mutex_t q_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cond = PTHREAD_COND_INITIALIZER;  // an operation or record completed
static struct stream *streams;  // every live stream
static uint64_t next_seq = 1, stream_count;
static __thread int in_worker;  // this thread is a stream's worker: it never waits for streams

static int legacy(CUstream s) { return (uintptr_t)s <= 2; }  // 0, CU_STREAM_LEGACY, _PER_THREAD

int nullcuda_pending(void) { return atomic_load(&pending); }

void nullcuda_async(int usec) { atomic_store(&delay_us, usec > 0 ? usec : 0); }

// Whether an operation enqueued before `target` is still queued on a stream (on a blocking
// one only: one not made with CU_STREAM_NON_BLOCKING, which the legacy stream waits for). Lock
// held.
static int busy_locked(uint64_t target, int blocking_only) {
  for (struct stream *s = streams; s; s = s->next)
    if (s->head && s->head->seq < target && !(blocking_only && (s->flags & 1))) return 1;
  return 0;
}

// Waits until every operation enqueued before now on any stream (on every blocking one) is
// done. Lock held.
static void drain_all_locked(int blocking_only) {
  uint64_t target = next_seq;
  while (!in_worker && busy_locked(target, blocking_only)) pthread_cond_wait(&done_cond, &q_lock);
}

static void drain_all(int blocking_only) {
  if (atomic_load(&pending) == 0) return;
  pthread_mutex_lock(&q_lock);
  drain_all_locked(blocking_only);
  pthread_mutex_unlock(&q_lock);
}

// Waits until every operation enqueued on `s` before now is done. Lock held.
static void drain_stream_locked(struct stream *s) {
  if (in_worker || !s->tail) return;
  uint64_t last = s->tail->seq;
  while (s->head && s->head->seq <= last) pthread_cond_wait(&done_cond, &q_lock);
}

// Marks record `gen` of `e` complete (a later record completing first wins). Lock held.
static void complete_locked(struct event *e, uint64_t gen, double t) {
  if (gen > e->done) {
    e->done = gen;
    e->t = t;
  }
}

static void unref_locked(struct event *e) {
  if (--e->refs == 0 && e->dead) free(e);
}

// The first byte of a pitched copy's source or destination.
static uint64_t at(int type, const void *host, CUdeviceptr dev, size_t x, size_t row, size_t pitch) {
  return (type == MT_HOST ? (uint64_t)host : dev) + row * pitch + x;
}
static uint64_t src2d(const CUDA_MEMCPY2D *m) {
  return at(m->srcMemoryType, m->srcHost, m->srcDevice, m->srcXInBytes, m->srcY, m->srcPitch);
}
static uint64_t dst2d(const CUDA_MEMCPY2D *m) {
  return at(m->dstMemoryType, m->dstHost, m->dstDevice, m->dstXInBytes, m->dstY, m->dstPitch);
}
static uint64_t src3d(const CUDA_MEMCPY3D *m) {
  return at(m->srcMemoryType, m->srcHost, m->srcDevice, m->srcXInBytes,
            m->srcZ * m->srcHeight + m->srcY, m->srcPitch);
}
static uint64_t dst3d(const CUDA_MEMCPY3D *m) {
  return at(m->dstMemoryType, m->dstHost, m->dstDevice, m->dstXInBytes,
            m->dstZ * m->dstHeight + m->dstY, m->dstPitch);
}

static int value_holds(const struct op *o) {
  uint64_t v = o->u.mem.wide ? __atomic_load_n((uint64_t *)o->u.mem.addr, __ATOMIC_ACQUIRE)
                             : __atomic_load_n((uint32_t *)o->u.mem.addr, __ATOMIC_ACQUIRE);
  uint64_t want = o->u.mem.value;
  switch (o->u.mem.flags & 0xf) {
    case 0:  // GEQ, cyclic
      return o->u.mem.wide ? (int64_t)(v - want) >= 0 : (int32_t)(uint32_t)(v - want) >= 0;
    case 1: return v == want;             // EQ
    case 2: return (v & want) != 0;       // AND
    default: return (~(v | want) & (o->u.mem.wide ? ~0ull : 0xffffffffull)) != 0;  // NOR
  }
}

// The operation's effect on memory (records and waits on events are handled by the callers).
static void run(struct op *o) {
  switch (o->kind) {
    case OP_COPY:
      memmove(o->u.copy.dst, o->u.copy.src, o->u.copy.n);
      break;
    case OP_SET:
      for (size_t r = 0; r < o->u.set.height; r++) {
        unsigned char *row = o->u.set.dst + r * o->u.set.pitch;
        if (o->u.set.size == 1) {
          memset(row, (int)o->u.set.value, o->u.set.width);
        } else if (o->u.set.size == 2) {
          uint16_t v = (uint16_t)o->u.set.value;
          for (size_t i = 0; i < o->u.set.width; i++) memcpy(row + 2 * i, &v, 2);
        } else {
          uint32_t v = o->u.set.value;
          for (size_t i = 0; i < o->u.set.width; i++) memcpy(row + 4 * i, &v, 4);
        }
      }
      break;
    case OP_COPY2D: {
      const CUDA_MEMCPY2D *m = &o->u.c2;
      const unsigned char *s = (const unsigned char *)src2d(m);
      unsigned char *d = (unsigned char *)dst2d(m);
      for (size_t y = 0; y < m->Height; y++)
        memmove(d + y * m->dstPitch, s + y * m->srcPitch, m->WidthInBytes);
      break;
    }
    case OP_COPY3D: {
      const CUDA_MEMCPY3D *m = &o->u.c3;
      const unsigned char *s = (const unsigned char *)src3d(m);
      unsigned char *d = (unsigned char *)dst3d(m);
      for (size_t z = 0; z < m->Depth; z++)
        for (size_t y = 0; y < m->Height; y++)
          memmove(d + (z * m->dstHeight + y) * m->dstPitch, s + (z * m->srcHeight + y) * m->srcPitch,
                  m->WidthInBytes);
      break;
    }
    case OP_BATCH:
      for (size_t i = 0; i < o->u.batch.count; i++)
        memmove((void *)o->u.batch.dsts[i], (const void *)o->u.batch.srcs[i], o->u.batch.sizes[i]);
      break;
    case OP_HOST_FN:
      o->u.host.fn(o->u.host.arg);
      break;
    case OP_WRITE:
      if (o->u.mem.wide)
        __atomic_store_n((uint64_t *)o->u.mem.addr, o->u.mem.value, __ATOMIC_RELEASE);
      else
        __atomic_store_n((uint32_t *)o->u.mem.addr, (uint32_t)o->u.mem.value, __ATOMIC_RELEASE);
      break;
    case OP_WAIT_VALUE: {
      // Only a worker polls: the synchronous mode cannot wait for a later host write.
      struct timespec nap = {0, 2000};
      while (in_worker && !value_holds(o)) nanosleep(&nap, NULL);
      break;
    }
    case OP_FREE:
      del(o->u.free.p);
      free((void *)o->u.free.p);
      break;
    case OP_RECORD:
    case OP_WAIT_EVENT:
    case OP_NOP:
      break;
  }
}

static void free_op(struct op *o) {
  if (o->kind == OP_BATCH) {
    free(o->u.batch.dsts);
    free(o->u.batch.srcs);
    free(o->u.batch.sizes);
  }
  free(o);
}

// Sleeps 0.5x-1.5x the delay before a piece of work (records and waits take none).
static void work_delay(struct stream *s, const struct op *o) {
  int d = atomic_load(&delay_us);
  if (d <= 0 || o->kind == OP_RECORD || o->kind == OP_WAIT_EVENT || o->kind == OP_WAIT_VALUE)
    return;
  s->rng ^= s->rng << 13;
  s->rng ^= s->rng >> 7;
  s->rng ^= s->rng << 17;
  long ns = (long)d * (500 + (long)(s->rng % 1001));  // d us * [0.5, 1.5]
  struct timespec t = {ns / 1000000000L, ns % 1000000000L};
  nanosleep(&t, NULL);
}

static void *worker(void *arg) {
  struct stream *s = arg;
  in_worker = 1;
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);  // sleeps of a few microseconds stay short
  pthread_setname_np(pthread_self(), "null-cuda");
  pthread_mutex_lock(&q_lock);
  for (;;) {
    while (!s->head && !s->stop) pthread_cond_wait(&s->wake, &q_lock);
    if (!s->head) break;
    struct op *o = s->head;
    if (o->kind == OP_WAIT_EVENT) {
      while (o->u.ev.e->done < o->u.ev.gen) pthread_cond_wait(&done_cond, &q_lock);
    }
    pthread_mutex_unlock(&q_lock);
    work_delay(s, o);
    // The work's end: after it, but before a word it writes can be seen (a host that sees
    // the word acts later than this).
    double end = o->kind == OP_WRITE ? now_ms() : 0;
    run(o);
    if (o->kind != OP_WRITE) end = now_ms();
    pthread_mutex_lock(&q_lock);
    // A record's time is when the stream reached it, as on a GPU: when the work before it
    // ended (or it was submitted, to an idle stream), however late this thread runs.
    if (o->kind == OP_RECORD)
      complete_locked(o->u.ev.e, o->u.ev.gen, s->reached > o->queued ? s->reached : o->queued);
    else if (o->kind == OP_WAIT_EVENT)
      s->reached = s->reached > o->u.ev.e->t ? s->reached : o->u.ev.e->t;
    else
      s->reached = end;
    if (o->kind == OP_RECORD || o->kind == OP_WAIT_EVENT) unref_locked(o->u.ev.e);
    s->head = o->next;
    if (!s->head) s->tail = NULL;
    atomic_fetch_sub(&pending, 1);
    pthread_cond_broadcast(&done_cond);
    free_op(o);
  }
  pthread_mutex_unlock(&q_lock);
  return NULL;
}

// Runs `o` now on the calling thread (records complete at once, waits on events block).
static void run_now(struct op *o) {
  if (o->kind == OP_RECORD || o->kind == OP_WAIT_EVENT) {
    struct event *e = o->u.ev.e;
    pthread_mutex_lock(&q_lock);
    if (o->kind == OP_RECORD) {
      complete_locked(e, ++e->rec, now_ms());
    } else {
      uint64_t gen = e->rec;
      while (!in_worker && e->done < gen) pthread_cond_wait(&done_cond, &q_lock);
    }
    pthread_mutex_unlock(&q_lock);
  } else {
    run(o);
  }
  if (o->kind == OP_BATCH) {
    free(o->u.batch.dsts);
    free(o->u.batch.srcs);
    free(o->u.batch.sizes);
  }
}

// Enqueues `o` (a template, copied) on stream `s`, or runs it now: in the synchronous mode
// when `s` has nothing queued, and on the legacy stream after all earlier work of the blocking
// streams.
static CUresult submit(CUstream s, struct op *o) {
  if (legacy(s)) {
    drain_all(1);
    run_now(o);
    return OK;
  }
  if (atomic_load(&delay_us) || atomic_load(&pending)) {
    struct op *q = malloc(sizeof *q);
    if (!q) return OUT_OF_MEMORY;
    *q = *o;
    pthread_mutex_lock(&q_lock);
    if (atomic_load(&delay_us) || s->head) {
      if (!s->started) {
        if (pthread_create(&s->thread, NULL, worker, s)) {
          pthread_mutex_unlock(&q_lock);
          free(q);
          return OUT_OF_MEMORY;
        }
        s->started = 1;
      }
      if (q->kind == OP_RECORD || q->kind == OP_WAIT_EVENT) {
        struct event *e = q->u.ev.e;
        q->u.ev.gen = q->kind == OP_RECORD ? ++e->rec : e->rec;
        e->refs++;
      }
      q->next = NULL;
      q->seq = next_seq++;
      q->queued = now_ms();
      if (s->tail) s->tail->next = q;
      else s->head = q;
      s->tail = q;
      atomic_fetch_add(&pending, 1);
      pthread_cond_signal(&s->wake);
      pthread_mutex_unlock(&q_lock);
      return OK;
    }
    pthread_mutex_unlock(&q_lock);
    free(q);
  }
  run_now(o);
  return OK;
}

// Runs `o` now, after the earlier work of `s`: a copy that involves pageable host memory.
static CUresult submit_blocking(CUstream s, struct op *o) {
  if (legacy(s)) return submit(s, o);
  if (atomic_load(&pending)) {
    pthread_mutex_lock(&q_lock);
    drain_stream_locked(s);
    pthread_mutex_unlock(&q_lock);
  }
  run_now(o);
  return OK;
}

// ---------------------------------------------------------------------------------------------
// Device, context.

CUresult cuInit(unsigned f) { ENTRY(); (void)f; return OK; }
CUresult cuDriverGetVersion(int *v) { ENTRY(); *v = 13000; return OK; }
CUresult cuDeviceGetCount(int *n) { ENTRY(); *n = 1; return OK; }
CUresult cuDeviceGet(CUdevice *d, int o) {
  ENTRY();
  if (o != 0) return INVALID_DEVICE;
  *d = 0;
  return OK;
}
CUresult cuDeviceGetName(char *n, int len, CUdevice d) {
  ENTRY();
  (void)d;
  snprintf(n, len, "null CUDA driver");
  return OK;
}
CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d) { ENTRY(); (void)d; *b = total_mem; return OK; }
CUresult cuMemGetInfo_v2(size_t *f, size_t *t) {
  ENTRY();
  pthread_mutex_lock(&alloc_lock);
  *f = device_capacity - device_used;
  pthread_mutex_unlock(&alloc_lock);
  *t = total_mem;
  return OK;
}
CUresult cuDeviceGetPCIBusId(char *s, int len, CUdevice d) {
  ENTRY();
  (void)d;
  snprintf(s, len, "0000:00:00.0");
  return OK;
}
CUresult cuDeviceGetAttribute(int *v, int a, CUdevice d) {
  ENTRY();
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
CUresult cuDeviceCanAccessPeer(int *c, CUdevice a, CUdevice b) {
  ENTRY();
  (void)a;
  (void)b;
  *c = 0;
  return OK;
}

static int ctx_token;
static __thread CUcontext current;
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
  ENTRY();
  (void)d;
  *c = &ctx_token;
  return OK;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { ENTRY(); (void)d; return OK; }
CUresult cuCtxSetCurrent(CUcontext c) { ENTRY(); current = c; return OK; }
CUresult cuCtxGetCurrent(CUcontext *c) { ENTRY(); *c = current; return OK; }
CUresult cuCtxPushCurrent_v2(CUcontext c) { ENTRY(); current = c; return OK; }
CUresult cuCtxPopCurrent_v2(CUcontext *c) { ENTRY(); if (c) *c = current; return OK; }
CUresult cuCtxSynchronize(void) {
  ENTRY();
  drain_all(0);
  return OK;
}
CUresult cuCtxGetDevice(CUdevice *d) { ENTRY(); *d = 0; return OK; }

// ---------------------------------------------------------------------------------------------
// Streams and events.

static CUresult stream_create(CUstream *out, unsigned flags) {
  struct stream *s = calloc(1, sizeof *s);
  if (!s) return OUT_OF_MEMORY;
  s->flags = flags;
  pthread_cond_init(&s->wake, NULL);
  pthread_mutex_lock(&q_lock);
  s->rng = 0x9E3779B97F4A7C15ull * ++stream_count;
  s->next = streams;
  if (streams) streams->prev = s;
  streams = s;
  pthread_mutex_unlock(&q_lock);
  *out = s;
  return OK;
}
CUresult cuStreamCreate(CUstream *s, unsigned f) { ENTRY(); return stream_create(s, f); }
CUresult cuStreamCreateWithPriority(CUstream *s, unsigned f, int p) {
  ENTRY();
  (void)p;
  return stream_create(s, f);
}
CUresult cuStreamDestroy_v2(CUstream s) {
  ENTRY();
  if (legacy(s)) return INVALID_HANDLE;
  pthread_mutex_lock(&q_lock);
  while (s->head && !in_worker) pthread_cond_wait(&done_cond, &q_lock);
  s->stop = 1;
  pthread_cond_signal(&s->wake);
  if (s->prev) s->prev->next = s->next;
  else streams = s->next;
  if (s->next) s->next->prev = s->prev;
  pthread_mutex_unlock(&q_lock);
  if (s->started) pthread_join(s->thread, NULL);
  pthread_cond_destroy(&s->wake);
  free(s);
  return OK;
}
CUresult cuStreamSynchronize(CUstream s) {
  ENTRY();
  if (atomic_load(&pending) == 0) return OK;
  pthread_mutex_lock(&q_lock);
  if (legacy(s)) drain_all_locked(1);
  else drain_stream_locked(s);
  pthread_mutex_unlock(&q_lock);
  return OK;
}
CUresult cuStreamQuery(CUstream s) {
  ENTRY();
  if (atomic_load(&pending) == 0) return OK;
  pthread_mutex_lock(&q_lock);
  // The legacy stream orders itself after the work of every blocking stream.
  CUresult r = (legacy(s) ? busy_locked(next_seq, 1) : s->head != NULL) ? NOT_READY : OK;
  pthread_mutex_unlock(&q_lock);
  return r;
}
CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned f) {
  ENTRY();
  (void)f;
  struct op o = {.kind = OP_WAIT_EVENT, .u.ev = {e, 0}};
  return submit(s, &o);
}
CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void *u) {
  ENTRY();
  struct op o = {.kind = OP_HOST_FN, .u.host = {fn, u}};
  return submit(s, &o);
}

static CUresult event_create(CUevent *out, unsigned flags) {
  struct event *e = calloc(1, sizeof *e);
  if (!e) return OUT_OF_MEMORY;
  e->t = now_ms();
  e->flags = flags;
  *out = e;
  return OK;
}
CUresult cuEventCreate(CUevent *e, unsigned f) { ENTRY(); return event_create(e, f); }
CUresult cuEventDestroy_v2(CUevent e) {
  ENTRY();
  pthread_mutex_lock(&q_lock);
  if (e->refs) e->dead = 1;
  else free(e);
  pthread_mutex_unlock(&q_lock);
  return OK;
}
static CUresult event_record(CUevent e, CUstream s) {
  struct op o = {.kind = OP_RECORD, .u.ev = {e, 0}};
  return submit(s, &o);
}
CUresult cuEventRecord(CUevent e, CUstream s) { ENTRY(); return event_record(e, s); }
CUresult cuEventRecordWithFlags(CUevent e, CUstream s, unsigned f) {
  ENTRY();
  (void)f;
  return event_record(e, s);
}
CUresult cuEventQuery(CUevent e) {
  ENTRY();
  if (atomic_load(&pending) == 0) return OK;
  pthread_mutex_lock(&q_lock);
  CUresult r = e->done >= e->rec ? OK : NOT_READY;
  pthread_mutex_unlock(&q_lock);
  return r;
}
CUresult cuEventSynchronize(CUevent e) {
  ENTRY();
  if (atomic_load(&pending) == 0) return OK;
  pthread_mutex_lock(&q_lock);
  uint64_t gen = e->rec;
  while (!in_worker && e->done < gen) pthread_cond_wait(&done_cond, &q_lock);
  pthread_mutex_unlock(&q_lock);
  return OK;
}
static CUresult elapsed(float *ms, CUevent a, CUevent b) {
  pthread_mutex_lock(&q_lock);
  CUresult r = OK;
  if ((a->flags | b->flags) & 2) r = INVALID_HANDLE;  // CU_EVENT_DISABLE_TIMING
  else if (a->done < a->rec || b->done < b->rec) r = NOT_READY;
  else *ms = (float)(b->t - a->t);
  pthread_mutex_unlock(&q_lock);
  return r;
}
CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) { ENTRY(); return elapsed(ms, a, b); }
CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b) {
  ENTRY();
  return elapsed(ms, a, b);
}

// ---------------------------------------------------------------------------------------------
// Memory.

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { ENTRY(); return alloc_device(p, n, A_DEVICE); }
CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned f) {
  ENTRY();
  (void)f;
  return alloc_device(p, n, A_MANAGED);
}
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) {
  ENTRY();
  (void)s;
  return alloc_device(p, n, A_DEVICE);
}
static void ipc_unshare(uint64_t base, uint64_t len);  // interprocess memory, below
static CUresult free_device(CUdeviceptr p) {
  if (!p) return OK;
  drain_all(0);
  uint64_t len = 0;
  find(p, NULL, &len);
  if (!is_device(del(p))) return INVALID_VALUE;
  ipc_unshare(p, len);
  free((void *)p);
  return OK;
}
CUresult cuMemFree_v2(CUdeviceptr p) { ENTRY(); return free_device(p); }
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) {
  ENTRY();
  uint64_t b = 0;
  if (!p || !is_device(find(p, &b, NULL)) || b != p) return INVALID_VALUE;
  struct op o = {.kind = OP_FREE, .u.free = {p}};
  return submit(s, &o);
}
CUresult cuMemHostAlloc(void **p, size_t n, unsigned f) {
  ENTRY();
  (void)f;
  return alloc_host(p, n);
}
CUresult cuMemAllocHost_v2(void **p, size_t n) { ENTRY(); return alloc_host(p, n); }
CUresult cuMemFreeHost(void *p) {
  ENTRY();
  drain_all(0);
  if (del((uint64_t)p) != A_PINNED) return INVALID_VALUE;
  free(p);
  return OK;
}
CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned f) {
  ENTRY();
  (void)f;
  if (!p || !n) return INVALID_VALUE;
  // The driver pins whole pages and refuses a page pinned already.
  const uint64_t page = 4096, lo = (uint64_t)p & ~(page - 1);
  const uint64_t hi = ((uint64_t)p + n + page - 1) & ~(page - 1);
  CUresult r = OK;
  pthread_mutex_lock(&alloc_lock);
  for (int i = 0; i < nallocs && r == OK; i++) {
    const struct alloc *a = &allocs[i];
    if (a->type != A_PINNED && a->type != A_REGISTERED) continue;
    uint64_t alo = a->base & ~(page - 1), ahi = (a->base + a->len + page - 1) & ~(page - 1);
    if (lo < ahi && alo < hi) r = ALREADY_REGISTERED;
  }
  if (r == OK) r = add_locked((uint64_t)p, n, A_REGISTERED);
  pthread_mutex_unlock(&alloc_lock);
  return r;
}
CUresult cuMemHostUnregister(void *p) {
  ENTRY();
  uint64_t b = 0;
  if (find((uint64_t)p, &b, NULL) != A_REGISTERED || b != (uint64_t)p) return NOT_REGISTERED;
  drain_all(0);
  del((uint64_t)p);
  return OK;
}
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned f) {
  ENTRY();
  (void)f;
  int t = find((uint64_t)p, NULL, NULL);
  if (t != A_PINNED && t != A_REGISTERED) return INVALID_VALUE;
  *d = (uint64_t)p;
  return OK;
}
CUresult cuMemPrefetchAsync_v2(CUdeviceptr p, size_t n, CUmemLocation loc, unsigned f, CUstream s) {
  ENTRY();
  (void)loc;
  (void)f;
  uint64_t b = 0, l = 0;
  if (find(p, &b, &l) != A_MANAGED || !known(p, n)) return INVALID_VALUE;
  struct op o = {.kind = OP_NOP};
  return submit(s, &o);
}

static CUresult pointer_attribute(void *data, int attr, CUdeviceptr p) {
  uint64_t base = 0, len = 0;
  int t = find(p, &base, &len);
  if (!t) return INVALID_VALUE;
  switch (attr) {
    case 1: *(CUcontext *)data = &ctx_token; return OK;                         // context
    case 2: *(unsigned *)data = is_device(t) ? MT_DEVICE : MT_HOST; return OK;  // memory type
    case 3: case 4: *(uint64_t *)data = p; return OK;                           // device / host ptr
    case 8: *(int *)data = t == A_MANAGED; return OK;                           // is managed
    case 9: *(int *)data = 0; return OK;                                        // device ordinal
    case 11: *(uint64_t *)data = base; return OK;                               // range start
    case 12: *(size_t *)data = len; return OK;                                  // range size
    default: return INVALID_VALUE;
  }
}
CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p) {
  ENTRY();
  return pointer_attribute(data, attr, p);
}
CUresult cuPointerGetAttributes(unsigned n, int *attrs, void **data, CUdeviceptr p) {
  ENTRY();
  // As the driver: an unknown address gets zeros and success.
  int t = find(p, NULL, NULL);
  for (unsigned i = 0; i < n; i++) {
    switch (attrs[i]) {
      case 2: *(unsigned *)data[i] = 0; break;
      case 11: *(uint64_t *)data[i] = 0; break;
      case 12: *(size_t *)data[i] = 0; break;
      default: break;
    }
    if (t && pointer_attribute(data[i], attrs[i], p) != OK) return INVALID_VALUE;
  }
  return OK;
}

// ---------------------------------------------------------------------------------------------
// Copies and fills.

// A 1-D copy on stream `s`: checks the device ends, runs pageable ones at once.
static CUresult copy1d(CUstream s, void *d, int d_device, const void *src, int s_device, size_t n) {
  if ((d_device && !known((uint64_t)d, n)) || (s_device && !known((uint64_t)src, n)))
    return INVALID_VALUE;
  struct op o = {.kind = OP_COPY, .u.copy = {d, src, n}};
  // Pageable ends matter only to work that would be queued.
  int queuing = atomic_load(&delay_us) || atomic_load(&pending);
  if (queuing && n && (!known((uint64_t)d, n) || !known((uint64_t)src, n)))
    return submit_blocking(s, &o);
  return submit(s, &o);
}
CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) {
  ENTRY();
  return copy1d(st, (void *)d, 0, (const void *)s, 0, n);
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, CUstream st) {
  ENTRY();
  return copy1d(st, (void *)d, 1, s, 0, n);
}
CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, CUstream st) {
  ENTRY();
  return copy1d(st, d, 0, (const void *)s, 1, n);
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) {
  ENTRY();
  return copy1d(st, (void *)d, 1, (const void *)s, 1, n);
}
CUresult cuMemcpyPeerAsync(CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n,
                           CUstream st) {
  ENTRY();
  (void)dc;
  (void)sc;
  return copy1d(st, (void *)d, 1, (const void *)s, 1, n);
}
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) {
  ENTRY();
  return copy1d(NULL, (void *)d, 1, s, 0, n);
}
CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) {
  ENTRY();
  return copy1d(NULL, d, 0, (const void *)s, 1, n);
}
CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) {
  ENTRY();
  return copy1d(NULL, (void *)d, 1, (const void *)s, 1, n);
}
CUresult cuMemcpy(CUdeviceptr d, CUdeviceptr s, size_t n) {
  ENTRY();
  return copy1d(NULL, (void *)d, 0, (const void *)s, 0, n);
}
CUresult cuMemcpyPeer(CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n) {
  ENTRY();
  (void)dc;
  (void)sc;
  return copy1d(NULL, (void *)d, 1, (const void *)s, 1, n);
}

// Checks one end of a pitched copy: its memory type and, for device memory, that the rows
// lie in one allocation; `*pageable` is set for host memory the driver does not know.
static CUresult check_end(int type, uint64_t base, size_t pitch, size_t rows, size_t width,
                          int *pageable) {
  if (type != MT_HOST && type != MT_DEVICE && type != MT_UNIFIED) return INVALID_VALUE;
  if (!rows || !width) return OK;
  size_t span = (rows - 1) * pitch + width;
  if (type == MT_HOST) {
    if (!known(base, span)) *pageable = 1;
    return OK;
  }
  return known(base, span) ? OK : INVALID_VALUE;
}

static CUresult copy2d(CUstream s, const CUDA_MEMCPY2D *m) {
  if ((m->Height > 1 && (m->srcPitch < m->WidthInBytes || m->dstPitch < m->WidthInBytes)) ||
      m->srcPitch > 2147483647u || m->dstPitch > 2147483647u)
    return INVALID_VALUE;
  int pageable = 0;
  CUresult r = check_end(m->srcMemoryType, src2d(m), m->srcPitch, m->Height, m->WidthInBytes, &pageable);
  if (r == OK)
    r = check_end(m->dstMemoryType, dst2d(m), m->dstPitch, m->Height, m->WidthInBytes, &pageable);
  if (r != OK) return r;
  struct op o = {.kind = OP_COPY2D, .u.c2 = *m};
  return pageable ? submit_blocking(s, &o) : submit(s, &o);
}
CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *m, CUstream s) { ENTRY(); return copy2d(s, m); }
CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D *m) { ENTRY(); return copy2d(NULL, m); }
CUresult cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D *m) { ENTRY(); return copy2d(NULL, m); }

static CUresult copy3d(CUstream s, const CUDA_MEMCPY3D *m) {
  if ((m->Height > 1 || m->Depth > 1) &&
      (m->srcPitch < m->WidthInBytes || m->dstPitch < m->WidthInBytes))
    return INVALID_VALUE;
  if (m->Depth > 1 && (m->srcHeight < m->Height || m->dstHeight < m->Height)) return INVALID_VALUE;
  if (m->srcLOD || m->dstLOD || m->srcPitch > 2147483647u || m->dstPitch > 2147483647u)
    return INVALID_VALUE;
  int pageable = 0;
  size_t rows = m->Depth ? (m->Depth - 1) * m->srcHeight + m->Height : 0;
  CUresult r = check_end(m->srcMemoryType, src3d(m), m->srcPitch, rows, m->WidthInBytes, &pageable);
  rows = m->Depth ? (m->Depth - 1) * m->dstHeight + m->Height : 0;
  if (r == OK)
    r = check_end(m->dstMemoryType, dst3d(m), m->dstPitch, rows, m->WidthInBytes, &pageable);
  if (r != OK) return r;
  struct op o = {.kind = OP_COPY3D, .u.c3 = *m};
  return pageable ? submit_blocking(s, &o) : submit(s, &o);
}
CUresult cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D *m, CUstream s) { ENTRY(); return copy3d(s, m); }
CUresult cuMemcpy3D_v2(const CUDA_MEMCPY3D *m) { ENTRY(); return copy3d(NULL, m); }

// The batched copies: attributes are hints here (recorded for nullcuda_batch_attrs); refused on
// the legacy stream and for attributes out of order, as the driver does.
typedef struct {
  int src_access_order;
  CUmemLocation src_hint, dst_hint;
  unsigned flags;
} CUmemcpyAttributes;

#define MAX_ATTRS 64
static long last_attrs[MAX_ATTRS][8];
static int last_nattrs;
static atomic_int batch_fail_at = -1;
static pthread_mutex_t attrs_lock = PTHREAD_MUTEX_INITIALIZER;

int nullcuda_batch_attrs(long *out, int max) {
  pthread_mutex_lock(&attrs_lock);
  int n = last_nattrs;
  for (int i = 0; i < n && i < max && i < MAX_ATTRS; i++) memcpy(out + 8 * i, last_attrs[i], sizeof last_attrs[i]);
  pthread_mutex_unlock(&attrs_lock);
  return n;
}

void nullcuda_batch_fail_at(int idx) { atomic_store(&batch_fail_at, idx); }

// Both symbols' work: `*fail_idx` (when given) says which copy failed.
static CUresult batch(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                      CUmemcpyAttributes *attrs, size_t *attrs_idxs, size_t num_attrs,
                      size_t *fail_idx, CUstream s) {
  if (fail_idx) *fail_idx = (size_t)-1;
  if (legacy(s) || !count || !dsts || !srcs || !sizes || !attrs || !num_attrs ||
      num_attrs > count || !attrs_idxs || attrs_idxs[0] != 0)
    return INVALID_VALUE;
  for (size_t i = 1; i < num_attrs; i++)
    if (attrs_idxs[i] <= attrs_idxs[i - 1] || attrs_idxs[i] >= count) return INVALID_VALUE;
  pthread_mutex_lock(&attrs_lock);
  last_nattrs = (int)num_attrs;
  for (size_t i = 0; i < num_attrs && i < MAX_ATTRS; i++) {
    long *a = last_attrs[i];
    a[0] = (long)attrs_idxs[i];
    a[1] = attrs[i].src_access_order;
    a[2] = attrs[i].src_hint.type;
    a[3] = attrs[i].src_hint.id;
    a[4] = attrs[i].dst_hint.type;
    a[5] = attrs[i].dst_hint.id;
    a[6] = (long)attrs[i].flags;
    a[7] = (long)count;
  }
  pthread_mutex_unlock(&attrs_lock);
  int fail = atomic_load(&batch_fail_at);
  size_t take = count;
  if (fail >= 0 && (size_t)fail < count) {
    atomic_store(&batch_fail_at, -1);
    if (!fail_idx) return INVALID_VALUE;
    *fail_idx = (size_t)fail;
    take = (size_t)fail;
    if (!take) return INVALID_VALUE;
  }
  int pageable = 0;
  for (size_t i = 0; i < take; i++)
    pageable |= !known(dsts[i], sizes[i]) || !known(srcs[i], sizes[i]);
  struct op o = {.kind = OP_BATCH};
  o.u.batch.count = take;
  o.u.batch.dsts = malloc(take * sizeof *dsts);
  o.u.batch.srcs = malloc(take * sizeof *srcs);
  o.u.batch.sizes = malloc(take * sizeof *sizes);
  if (!o.u.batch.dsts || !o.u.batch.srcs || !o.u.batch.sizes) {
    free(o.u.batch.dsts);
    free(o.u.batch.srcs);
    free(o.u.batch.sizes);
    return OUT_OF_MEMORY;
  }
  memcpy(o.u.batch.dsts, dsts, take * sizeof *dsts);
  memcpy(o.u.batch.srcs, srcs, take * sizeof *srcs);
  memcpy(o.u.batch.sizes, sizes, take * sizeof *sizes);
  CUresult r = pageable ? submit_blocking(s, &o) : submit(s, &o);
  return r == OK && take < count ? INVALID_VALUE : r;
}

// CUDA 12.8's batched copy (still exported by CUDA 13 drivers): failIdx before the stream.
CUresult cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                            CUmemcpyAttributes *attrs, size_t *attrs_idxs, size_t num_attrs,
                            size_t *fail_idx, CUstream s) {
  ENTRY();
  return batch(dsts, srcs, sizes, count, attrs, attrs_idxs, num_attrs, fail_idx, s);
}

#ifndef NULL_CUDA_NO_BATCH_V2
// CUDA 13's batched copy: no failIdx.
CUresult cuMemcpyBatchAsync_v2(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                               CUmemcpyAttributes *attrs, size_t *attrs_idxs, size_t num_attrs,
                               CUstream s) {
  ENTRY();
  return batch(dsts, srcs, sizes, count, attrs, attrs_idxs, num_attrs, NULL, s);
}
#endif

// `height` rows of `width` elements of `size` bytes at `pitch`, on stream `s`.
static CUresult memset2d(CUstream s, CUdeviceptr d, size_t pitch, uint32_t v, int size, size_t width,
                         size_t height) {
  if (height > 1 && pitch < width * size) return INVALID_VALUE;
  if (width && height && !known(d, (height - 1) * pitch + width * size)) return INVALID_VALUE;
  struct op o = {.kind = OP_SET, .u.set = {(unsigned char *)d, pitch, width, height, v, size}};
  return submit(s, &o);
}
CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) {
  ENTRY();
  return memset2d(NULL, d, n, v, 1, n, 1);
}
CUresult cuMemsetD16_v2(CUdeviceptr d, unsigned short v, size_t n) {
  ENTRY();
  return memset2d(NULL, d, 2 * n, v, 2, n, 1);
}
CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned v, size_t n) {
  ENTRY();
  return memset2d(NULL, d, 4 * n, v, 4, n, 1);
}
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) {
  ENTRY();
  return memset2d(s, d, n, v, 1, n, 1);
}
CUresult cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream s) {
  ENTRY();
  return memset2d(s, d, 2 * n, v, 2, n, 1);
}
CUresult cuMemsetD32Async(CUdeviceptr d, unsigned v, size_t n, CUstream s) {
  ENTRY();
  return memset2d(s, d, 4 * n, v, 4, n, 1);
}
CUresult cuMemsetD2D8_v2(CUdeviceptr d, size_t p, unsigned char v, size_t w, size_t h) {
  ENTRY();
  return memset2d(NULL, d, p, v, 1, w, h);
}
CUresult cuMemsetD2D16_v2(CUdeviceptr d, size_t p, unsigned short v, size_t w, size_t h) {
  ENTRY();
  return memset2d(NULL, d, p, v, 2, w, h);
}
CUresult cuMemsetD2D32_v2(CUdeviceptr d, size_t p, unsigned v, size_t w, size_t h) {
  ENTRY();
  return memset2d(NULL, d, p, v, 4, w, h);
}
CUresult cuMemsetD2D8Async(CUdeviceptr d, size_t p, unsigned char v, size_t w, size_t h,
                           CUstream s) {
  ENTRY();
  return memset2d(s, d, p, v, 1, w, h);
}
CUresult cuMemsetD2D16Async(CUdeviceptr d, size_t p, unsigned short v, size_t w, size_t h,
                            CUstream s) {
  ENTRY();
  return memset2d(s, d, p, v, 2, w, h);
}
CUresult cuMemsetD2D32Async(CUdeviceptr d, size_t p, unsigned v, size_t w, size_t h, CUstream s) {
  ENTRY();
  return memset2d(s, d, p, v, 4, w, h);
}

// Stream memory operations on a word of device-accessible memory.
static CUresult mem_op(CUstream s, enum op_kind k, CUdeviceptr a, uint64_t v, unsigned f,
                       int wide) {
  if (a % (wide ? 8 : 4) || !known(a, wide ? 8 : 4)) return INVALID_VALUE;
  struct op o = {.kind = k, .u.mem = {a, v, f, wide}};
  return submit(s, &o);
}
CUresult cuStreamWaitValue32_v2(CUstream s, CUdeviceptr a, uint32_t v, unsigned f) {
  ENTRY();
  return mem_op(s, OP_WAIT_VALUE, a, v, f, 0);
}
CUresult cuStreamWriteValue32_v2(CUstream s, CUdeviceptr a, uint32_t v, unsigned f) {
  ENTRY();
  return mem_op(s, OP_WRITE, a, v, f, 0);
}
CUresult cuStreamWaitValue64_v2(CUstream s, CUdeviceptr a, uint64_t v, unsigned f) {
  ENTRY();
  return mem_op(s, OP_WAIT_VALUE, a, v, f, 1);
}
CUresult cuStreamWriteValue64_v2(CUstream s, CUdeviceptr a, uint64_t v, unsigned f) {
  ENTRY();
  return mem_op(s, OP_WRITE, a, v, f, 1);
}

// ---------------------------------------------------------------------------------------------
// Interprocess memory (cuIpcGetMemHandle / cuIpcOpenMemHandle_v2 / cuIpcCloseMemHandle, and the
// virtual memory calls with POSIX file descriptors further down), so that
// ferry's agent (crates/ferry/src/agent/) runs its cross-process logic for real without a GPU.
// Device allocations are whole pages (alloc_device rounds them); exporting one moves its pages
// into a memfd mapped shared over the same addresses (its bytes kept), and the handle names
// (pid, fd, length): another process opens /proc/<pid>/fd/<fd> (same user) and maps the same
// bytes, recorded there as device memory. Freeing an exported allocation maps private pages
// back before free(). Opening a handle in the process that made it fails as on a GPU
// (CUDA_ERROR_INVALID_CONTEXT).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct { char reserved[64]; } CUipcMemHandle;
struct ipc_handle { uint32_t magic; int32_t pid, fd; uint32_t pad; uint64_t len; };
enum { IPC_MAGIC = 0x6e756c6c, MAX_EXPORTS = 1024 };
static struct { uint64_t base, len; int fd; } exports[MAX_EXPORTS];
static int nexports;
static pthread_mutex_t ipc_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t pages(uint64_t n) { return (n + 4095) & ~4095ull; }

// The memfd of the exported allocation at `base` (made on the first export), or -1.
static int ipc_export_locked(uint64_t base, uint64_t len) {
  for (int i = 0; i < nexports; i++)
    if (exports[i].base == base) return exports[i].fd;
  if (nexports == MAX_EXPORTS) return -1;
  int fd = memfd_create("null-cuda-ipc", MFD_CLOEXEC);
  if (fd < 0) return -1;
  uint64_t n = pages(len);
  void *m = MAP_FAILED;
  if (ftruncate(fd, (off_t)n) == 0)
    m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    close(fd);
    return -1;
  }
  memcpy(m, (void *)base, n);
  munmap(m, n);
  if (mmap((void *)base, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
    close(fd);
    return -1;
  }
  exports[nexports++] = (typeof(exports[0])){base, len, fd};
  return fd;
}

// Gives an exported allocation's addresses private pages again (before free()).
static void ipc_unshare(uint64_t base, uint64_t len) {
  pthread_mutex_lock(&ipc_lock);
  for (int i = 0; i < nexports; i++) {
    if (exports[i].base == base) {
      mmap((void *)base, pages(len), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
           -1, 0);
      close(exports[i].fd);
      exports[i] = exports[--nexports];
      break;
    }
  }
  pthread_mutex_unlock(&ipc_lock);
}

CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
  ENTRY();
  uint64_t base = 0, len = 0;
  if (!h || find(p, &base, &len) != A_DEVICE || base != p) return INVALID_VALUE;
  drain_all(0);
  pthread_mutex_lock(&ipc_lock);
  int fd = ipc_export_locked(base, len);
  pthread_mutex_unlock(&ipc_lock);
  if (fd < 0) return OUT_OF_MEMORY;
  struct ipc_handle ih = {IPC_MAGIC, (int32_t)getpid(), fd, 0, len};
  memset(h, 0, sizeof *h);
  memcpy(h->reserved, &ih, sizeof ih);
  return OK;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned flags) {
  ENTRY();
  (void)flags;
  struct ipc_handle ih;
  memcpy(&ih, h.reserved, sizeof ih);
  if (ih.magic != IPC_MAGIC || ih.len == 0) return INVALID_VALUE;
  if (ih.pid == getpid()) return 201;  // CUDA_ERROR_INVALID_CONTEXT
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", ih.pid, ih.fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return INVALID_VALUE;
  void *m = mmap(NULL, pages(ih.len), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return INVALID_VALUE;
  pthread_mutex_lock(&alloc_lock);
  CUresult r = add_locked((uint64_t)m, ih.len, A_DEVICE);
  pthread_mutex_unlock(&alloc_lock);
  if (r != OK) {
    munmap(m, pages(ih.len));
    return r;
  }
  *p = (uint64_t)m;
  return OK;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
  ENTRY();
  uint64_t base = 0, len = 0;
  if (find(p, &base, &len) != A_DEVICE || base != p) return INVALID_VALUE;
  drain_all(0);
  del(p);
  munmap((void *)p, pages(len));
  return OK;
}

// The driver's virtual memory calls as far as the agent uses them (cuMemCreate and the POSIX
// file descriptor it exports): an allocation is a memfd, its handle a pointer to {fd, size};
// cuMemAddressReserve reserves addresses (PROT_NONE), cuMemMap maps the memfd there shared,
// cuMemSetAccess records the range as device memory. Another process imports the descriptor
// (passed over a Unix socket) and maps the same bytes. Granularity: 2 MiB, as on a GPU.
struct vmm { int fd; uint64_t size; };

CUresult cuMemGetAllocationGranularity(size_t *g, const void *prop, int option) {
  ENTRY();
  (void)prop;
  (void)option;
  if (!g) return INVALID_VALUE;
  *g = 2u << 20;
  return OK;
}

static CUresult vmm_new(uint64_t *h, int fd, uint64_t size) {
  struct vmm *v = malloc(sizeof *v);
  if (!v) {
    close(fd);
    return OUT_OF_MEMORY;
  }
  *v = (struct vmm){fd, size};
  *h = (uint64_t)(uintptr_t)v;
  return OK;
}

CUresult cuMemCreate(uint64_t *h, size_t size, const void *prop, unsigned long long flags) {
  ENTRY();
  (void)prop;
  (void)flags;
  if (!h || size == 0 || size % (2u << 20)) return INVALID_VALUE;
  int fd = memfd_create("null-cuda-vmm", MFD_CLOEXEC);
  if (fd < 0) return OUT_OF_MEMORY;
  if (ftruncate(fd, (off_t)size) != 0) {
    close(fd);
    return OUT_OF_MEMORY;
  }
  return vmm_new(h, fd, size);
}

CUresult cuMemRelease(uint64_t h) {
  ENTRY();
  struct vmm *v = (struct vmm *)(uintptr_t)h;
  if (!v) return INVALID_VALUE;
  close(v->fd);
  free(v);
  return OK;
}

CUresult cuMemExportToShareableHandle(void *out, uint64_t h, int type, unsigned long long flags) {
  ENTRY();
  (void)flags;
  struct vmm *v = (struct vmm *)(uintptr_t)h;
  if (!v || !out || type != 1) return INVALID_VALUE;  // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
  int fd = fcntl(v->fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return OUT_OF_MEMORY;
  *(int *)out = fd;
  return OK;
}

CUresult cuMemImportFromShareableHandle(uint64_t *h, void *os, int type) {
  ENTRY();
  struct stat st;
  int fd = (int)(intptr_t)os;
  if (!h || type != 1 || fstat(fd, &st) != 0) return INVALID_VALUE;
  int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) return OUT_OF_MEMORY;
  return vmm_new(h, own, (uint64_t)st.st_size);
}

CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr,
                             unsigned long long flags) {
  ENTRY();
  (void)align;
  (void)addr;
  (void)flags;
  if (!p || size == 0) return INVALID_VALUE;
  void *m = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return OUT_OF_MEMORY;
  *p = (uint64_t)m;
  return OK;
}

CUresult cuMemAddressFree(CUdeviceptr p, size_t size) {
  ENTRY();
  return munmap((void *)p, size) == 0 ? OK : INVALID_VALUE;
}

CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset, uint64_t h, unsigned long long flags) {
  ENTRY();
  (void)flags;
  struct vmm *v = (struct vmm *)(uintptr_t)h;
  if (!v || offset + size > v->size) return INVALID_VALUE;
  void *m = mmap((void *)p, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, v->fd,
                 (off_t)offset);
  return m == MAP_FAILED ? INVALID_VALUE : OK;
}

CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const void *desc, size_t count) {
  ENTRY();
  (void)desc;
  (void)count;
  if (known(p, 1)) return OK;
  pthread_mutex_lock(&alloc_lock);
  CUresult r = add_locked(p, size, A_DEVICE);
  pthread_mutex_unlock(&alloc_lock);
  return r;
}

CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
  ENTRY();
  drain_all(0);
  del(p);
  void *m = mmap((void *)p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
                 -1, 0);
  return m == MAP_FAILED ? INVALID_VALUE : OK;
}

// ---------------------------------------------------------------------------------------------
// Modules: the null device runs no kernels, so it takes no module (as a GPU without code for
// its architecture answers); ferry then keeps to the copy engines, a test to its skip.

CUresult cuModuleLoad(void **m, const char *path) {
  ENTRY();
  (void)m;
  (void)path;
  return NO_BINARY_FOR_GPU;
}
CUresult cuModuleLoadData(void **m, const void *image) {
  ENTRY();
  (void)m;
  (void)image;
  return NO_BINARY_FOR_GPU;
}
CUresult cuModuleLoadDataEx(void **m, const void *image, unsigned n, int *options, void **values) {
  ENTRY();
  (void)m;
  (void)image;
  (void)n;
  (void)options;
  (void)values;
  return NO_BINARY_FOR_GPU;
}

// ---------------------------------------------------------------------------------------------
// Errors.

static const struct { int code; const char *name, *text; } errors[] = {
  {0, "CUDA_SUCCESS", "no error"},
  {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
  {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
  {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
  {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
  {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
  {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
  {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
  {209, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for execution on the device"},
  {217, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
   "peer access is not supported between these two devices"},
  {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
  {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
  {600, "CUDA_ERROR_NOT_READY", "device not ready"},
  {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
  {712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
   "part or all of the requested memory range is already mapped"},
  {713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
   "pointer does not correspond to a registered memory region"},
  {719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
  {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
  {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};
static int error_index(CUresult e) {
  for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
    if (errors[i].code == e) return (int)i;
  return -1;
}
// As the driver: an unknown code gets NULL and CUDA_ERROR_INVALID_VALUE.
CUresult cuGetErrorString(CUresult e, const char **s) {
  int i = error_index(e);
  *s = i < 0 ? NULL : errors[i].text;
  return i < 0 ? INVALID_VALUE : OK;
}
CUresult cuGetErrorName(CUresult e, const char **s) {
  int i = error_index(e);
  *s = i < 0 ? NULL : errors[i].name;
  return i < 0 ? INVALID_VALUE : OK;
}

// ---------------------------------------------------------------------------------------------
// The environment: NULL_CUDA_ASYNC=<microseconds>, NULL_CUDA_FAIL=name:nth:code[,...].

__attribute__((constructor)) static void from_env(void) {
  const char *a = getenv("NULL_CUDA_ASYNC");
  if (a && *a) nullcuda_async(atoi(a));
  const char *f = getenv("NULL_CUDA_FAIL");
  while (f && *f) {
    char name[64];
    int nth = 0, code = 0, used = 0;
    if (sscanf(f, "%63[^:,]:%d:%d%n", name, &nth, &code, &used) == 3) {
      nullcuda_fail(name, nth, code);
    } else {
      fprintf(stderr, "null CUDA driver: NULL_CUDA_FAIL: cannot read \"%s\" (name:nth:code)\n", f);
      break;
    }
    f += used;
    if (*f == ',') f++;
  }
}
