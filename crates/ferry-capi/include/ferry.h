/*
 * ferry.h - C interface of ferry, shaped like AML's DMA API (aml_dma_*).
 *
 * Hand-written; crates/ferry-capi/tests/header.rs checks that it declares exactly the
 * functions and objects the library exports. Link: -lferry_capi (static: also
 * -lpthread -ldl -lm -lrt -lgcc_s -lc).
 *
 * Model (as AML): a dma (engine) creates requests from a destination buffer, a source buffer,
 * two layouts and an operator; requests are waited, polled or destroyed one by one, and a
 * barrier waits for everything submitted to a dma.
 *
 * Conventions
 * - Every function returns FERRY_SUCCESS (0) or a negative error code -FERRY_E*, except
 *   ferry_dma_barrier / ferry_dma_destroy (count of failed requests, >= 0, or a negative
 *   code) and the two string functions. Every argument is checked in every build: NULL
 *   pointers and bad values give -FERRY_EINVAL, never a crash. On failure nothing is created
 *   and out-parameters are left unchanged.
 * - ferry_last_error_message() gives the reason of the last failure on the calling thread.
 * - No Rust panic crosses this boundary: it becomes -FERRY_EPANIC.
 * - Handles carry a type tag: a destroyed handle or a handle of the wrong type is usually
 *   caught as -FERRY_EINVAL, but using a freed handle is still undefined behaviour.
 *
 * BUFFER LIFETIME CONTRACT: buffers passed to a request are raw pointers. They must stay
 * valid (dst writable, src readable, for their whole length) and must not be written
 * (dst: nor read) by anyone else until the request is released: by ferry_request_wait,
 * ferry_request_destroy, or a ferry_dma_barrier / ferry_dma_destroy on its dma. After any of
 * these returns, the request's engine no longer touches them.
 *
 * Thread safety: a dma may be used from several threads at once (create, wait, barrier). A
 * request handle must be used by one thread at a time. User operator callbacks run on engine
 * worker threads.
 */
#ifndef FERRY_H
#define FERRY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- error codes */

#define FERRY_SUCCESS 0      /* success */
#define FERRY_EINVAL 1       /* invalid argument: NULL pointer, bad value, wrong handle */
#define FERRY_ELAYOUT 2      /* invalid layout, or layout outside its buffer */
#define FERRY_ESHAPE 3       /* layouts cannot be copied into each other (shape, elem size) */
#define FERRY_EOVERLAP 4     /* source and destination overlap (ferry does not copy in place) */
#define FERRY_EUNSUPPORTED 5 /* the engine cannot reach memory of these kinds */
#define FERRY_ENOTAVAIL 6    /* backend not available on this machine (e.g. no CUDA driver) */
#define FERRY_ESHUTDOWN 7    /* the engine is shut down */
#define FERRY_EDRIVER 8      /* a driver/system call failed (message keeps its own text) */
#define FERRY_EREQUEST 9     /* the request ran and failed (message says why) */
#define FERRY_EOP 10         /* a user operator reported an error while building its steps */
#define FERRY_EPANIC 11      /* internal error: a Rust panic was caught at the boundary */

/* Message of the last failure on this thread (the Rust error's Display text), "" if none.
 * Valid until the next ferry call on this thread; do not free. Successful calls leave it. */
const char *ferry_last_error_message(void);

/* Static description of a code; accepts code or -code. Never NULL. */
const char *ferry_strerror(int code);

/* ---------------------------------------------------------------- layouts */

#define FERRY_MAX_DIMS 16
/* ferry's own values: NOT AML's (AML_LAYOUT_ORDER_C / ROW_MAJOR is 1, COLUMN_MAJOR /
 * FORTRAN is 0). AML programs use libaml (crates/ferry-aml: aml/layout/dense.h). */
#define FERRY_ORDER_ROW_MAJOR 0    /* C order: last dim contiguous */
#define FERRY_ORDER_COLUMN_MAJOR 1 /* Fortran order: first dim contiguous */

/* An N-D strided view of elements inside a buffer: dims (outermost first), byte strides,
 * element size, byte offset. Immutable; requests keep their own copy, so a layout may be
 * destroyed right after the request is created. */
typedef struct ferry_layout ferry_layout;

/* Dense layout. -FERRY_EINVAL: NULL pointer or unknown order. -FERRY_ELAYOUT: ndims 0 or
 * > FERRY_MAX_DIMS, a zero dim or elem_size, size overflow. */
int ferry_layout_create_dense(ferry_layout **out, size_t ndims, const size_t *dims,
                              size_t elem_size, int order);

/* General layout: ndims dims (outermost first), the byte stride of each, the element size,
 * and the byte offset of the first element. Errors as ferry_layout_create_dense. */
int ferry_layout_create_strided(ferry_layout **out, size_t ndims, const size_t *dims,
                                const size_t *byte_strides, size_t elem_size, size_t offset);

/* New layout: axis `axis` of `in` cut to start, start+step, ... below end (numpy a[s:e:k]).
 * -FERRY_ELAYOUT: axis out of range, step 0, empty range, range past the dim. */
int ferry_layout_slice(const ferry_layout *in, ferry_layout **out, size_t axis, size_t start,
                       size_t end, size_t step);

/* New layout: same elements in the same row-major order with new dims, without a copy
 * (numpy reshape). -FERRY_ELAYOUT if counts differ or the shape needs a copy. */
int ferry_layout_reshape(const ferry_layout *in, ferry_layout **out, size_t ndims,
                         const size_t *dims);

/* New layout whose dim i is dim order[i] of `in` (transpose for 2 dims). -FERRY_ELAYOUT
 * unless order is a permutation of 0..ndims-1 and ndims is the layout's dim count. */
int ferry_layout_permute(const ferry_layout *in, ferry_layout **out, size_t ndims,
                         const size_t *order);

/* Describes a layout. Any output may be NULL. dims/byte_strides need `capacity` entries
 * (FERRY_MAX_DIMS always suffices); -FERRY_EINVAL if the layout has more dims. */
int ferry_layout_describe(const ferry_layout *layout, size_t capacity, size_t *ndims,
                          size_t *dims, size_t *byte_strides, size_t *elem_size,
                          size_t *offset);

/* Smallest buffer length in bytes that holds the layout (offset included). */
int ferry_layout_span(const ferry_layout *layout, size_t *bytes);

/* Frees *layout and sets it NULL. NULL *layout: no-op. NULL layout: -FERRY_EINVAL. */
int ferry_layout_destroy(ferry_layout **layout);

/* ---------------------------------------------------------------- dma engines */

/* A DMA engine. Any ferry engine (CPU thread pool, multiplex, CUDA) behind one type. */
typedef struct ferry_dma ferry_dma;

/* CPU engine: a pool of `threads` workers (0: one per core, as Rust's CpuEngine::new(0)) that
 * splits large copies across workers. Reaches host memory of every kind. -FERRY_EINVAL: NULL
 * out, threads < 0. -FERRY_EDRIVER: a worker thread could not be started. */
int ferry_dma_cpu_create(ferry_dma **out, int threads);

/* Multiplex engine over `count` engines: each request goes to the engine with the least bytes
 * per unit of weight so far; copies of >= split_bytes bytes (0: 64 MiB) are split across
 * engines. TAKES OWNERSHIP: on success every engines[i] is set to NULL (do not destroy them);
 * on failure nothing is taken. weights may be NULL (all 1); each must be finite and > 0.
 * -FERRY_EINVAL: NULL pointers, count 0, invalid or repeated engine, bad weight. */
int ferry_dma_multiplex_create(ferry_dma **out, ferry_dma **engines, const double *weights,
                               size_t count, size_t split_bytes);

/* CUDA engine on GPU `device` (AML: aml_dma_cuda_create): a pool of streams per direction
 * (each submitting thread keeps one: its requests in one direction run in order), one event
 * per request, direction inferred from the buffers' kinds.
 * -FERRY_ENOTAVAIL: no CUDA driver on this machine (*out unchanged); -FERRY_EINVAL: negative
 * or absent device; -FERRY_EDRIVER: a driver call failed (see ferry_last_error_message). */
int ferry_dma_cuda_create(ferry_dma **out, int device);

/* Waits for every request submitted to dma so far (may block) and reports each failed
 * request whose failure was not already returned by ferry_request_wait/ferry_request_test.
 * Returns the number of failed requests (0: all fine) or -FERRY_EINVAL. When positive,
 * ferry_last_error_message() summarises them and ferry_dma_barrier_failure() gives each. */
int ferry_dma_barrier(ferry_dma *dma);

/* The index-th failure of the last barrier on dma: the request's id (see ferry_request_id)
 * and its message (valid until the next barrier on dma or its destruction; do not free).
 * Either output may be NULL. -FERRY_EINVAL: bad dma, index >= the last barrier's count. */
int ferry_dma_barrier_failure(ferry_dma *dma, size_t index, uint64_t *request_id,
                              const char **message);

/* Waits for all of *dma's requests (as a barrier; safe with work in flight), shuts the engine
 * down, frees it, sets *dma = NULL. NULL *dma: no-op. Returns the count of failed requests
 * nobody had seen (normally 0; message in ferry_last_error_message) or -FERRY_EINVAL.
 * Request handles of this dma still unreleased: release with ferry_request_destroy(NULL, &r). */
int ferry_dma_destroy(ferry_dma **dma);

/* ---------------------------------------------------------------- operators */

/* An operator: what a request does. Typed, and the same on every engine. */
typedef struct ferry_op ferry_op;

/* Built-ins (static objects; never destroy them). */
extern const ferry_op ferry_op_copy;
extern const ferry_op ferry_op_memcpy;
extern const ferry_op ferry_op_fill;
/* Copy every element of src_layout (in src) to dst_layout (in dst); op_arg unused. Plans the
 * fewest, largest contiguous runs (AML: one memcpy per element). */
#define FERRY_OP_COPY (&ferry_op_copy)
/* Flat copy from the start of src to the start of dst: src_len bytes, or *(size_t *)op_arg
 * bytes if op_arg is not NULL. Layouts unused (may be NULL). */
#define FERRY_OP_MEMCPY (&ferry_op_memcpy)
/* Write one element, *op_arg (elem_size bytes of dst_layout, copied at creation), into every
 * element of dst_layout. src unused (may be NULL with src_len 0). */
#define FERRY_OP_FILL (&ferry_op_fill)

/* The program a user operator fills; valid only inside its lower callback. */
typedef struct ferry_program ferry_program;

/* A user operator's lower callback: add the request's steps with ferry_program_copy /
 * ferry_program_fill (checked against the buffers as they are added) and return
 * FERRY_SUCCESS, or a negative code to fail the request (reported by wait/test/barrier, with
 * the text of the last failed ferry_program_* call). dst/src are the request's layouts
 * (either may be NULL if the request was created without it). Runs on an engine thread,
 * possibly concurrently for different requests; must not longjmp or throw. May run more than
 * once for one request (the multiplex engine lowers once at submit, on the caller's thread,
 * to size the request): it must build the same steps each time. */
typedef int (*ferry_lower_fn)(ferry_program *prog, const ferry_layout *dst,
                              const ferry_layout *src, void *op_arg, void *user_data);

/* Callback table of a user operator. Copied by ferry_operator_create. */
typedef struct ferry_operator {
    const char *name;                /* for error messages (copied); NULL: "custom" */
    ferry_lower_fn lower;            /* required */
    void (*destroy)(void *user_data); /* optional; called once, after the operator is
                                        destroyed and the engines dropped every request's
                                        reference to it: shortly after the last request
                                        completes, possibly on an engine thread */
    void *user_data;                 /* passed to lower and destroy; valid until destroy */
} ferry_operator;

/* Creates a user operator. -FERRY_EINVAL: NULL out/table/table->lower, name not UTF-8. */
int ferry_operator_create(ferry_op **out, const ferry_operator *table);

/* Destroys a user operator, sets *op = NULL. Requests already created keep it alive (its
 * destroy callback runs after the last of them, see ferry_operator.destroy).
 * NULL *op: no-op. A built-in: -FERRY_EINVAL. */
int ferry_operator_destroy(ferry_op **op);

/* In lower: add a copy from src (in the request's source buffer) to dst (in its destination
 * buffer). -FERRY_ELAYOUT (outside a buffer), -FERRY_ESHAPE, -FERRY_EOVERLAP, -FERRY_EINVAL
 * (no source buffer, NULL pointer, prog not live). */
int ferry_program_copy(ferry_program *prog, const ferry_layout *dst, const ferry_layout *src);

/* In lower: add a fill of every element of dst with pattern (pattern_len = elem_size). */
int ferry_program_fill(ferry_program *prog, const ferry_layout *dst, const void *pattern,
                       size_t pattern_len);

/* In lower: the request's buffer lengths in bytes (*src_len = 0 without a source). Either
 * output may be NULL. */
int ferry_program_buffers(ferry_program *prog, size_t *dst_len, size_t *src_len);

/* ---------------------------------------------------------------- requests */

/* Memory kinds. The plain ferry_dma_request_create assumes FERRY_MEM_PAGEABLE. */
#define FERRY_MEM_PAGEABLE 0 /* ordinary host memory */
#define FERRY_MEM_PINNED 1   /* page-locked host memory (allocated pinned, or registered) */
#define FERRY_MEM_MAPPED 2   /* page-locked host memory mapped into the GPUs (zero-copy) */
#define FERRY_MEM_DEVICE 3   /* memory on GPU `device`; ptr holds the device address */
#define FERRY_MEM_MANAGED 4  /* CUDA managed memory */

/* A buffer and where it lives. */
typedef struct ferry_buffer {
    void *ptr;      /* first byte */
    size_t len;     /* length in bytes, > 0 */
    int32_t kind;   /* FERRY_MEM_* */
    int32_t device; /* GPU ordinal for FERRY_MEM_DEVICE; ignored otherwise */
} ferry_buffer;

/* A submitted request. */
typedef struct ferry_request ferry_request;

/* Creates and submits a request on host (pageable) memory; never waits for the copy
 * (AML: aml_dma_cuda_request_create / aml_dma_async_copy_custom). See the operators above for
 * what each uses. BUFFER LIFETIME CONTRACT at the top of this file applies.
 * Returns FERRY_SUCCESS and *req, or (nothing submitted) -FERRY_EINVAL (NULL/invalid dma,
 * req, op, dst, a needed src or layout, zero length), -FERRY_ELAYOUT (layout outside its
 * buffer), -FERRY_ESHAPE, -FERRY_EOVERLAP, -FERRY_EUNSUPPORTED, -FERRY_ESHUTDOWN,
 * -FERRY_EDRIVER. A user operator's own failure is reported by wait/test/barrier.
 * For a user operator op_arg must stay valid, and usable from any thread, until the request
 * is released. */
int ferry_dma_request_create(ferry_dma *dma, ferry_request **req, void *dst, size_t dst_len,
                             const ferry_layout *dst_layout, const void *src, size_t src_len,
                             const ferry_layout *src_layout, const ferry_op *op, void *op_arg);

/* As ferry_dma_request_create, with buffers that say where they live. src may be NULL for
 * operators that need none. */
int ferry_dma_request_create_mem(ferry_dma *dma, ferry_request **req, const ferry_buffer *dst,
                                 const ferry_layout *dst_layout, const ferry_buffer *src,
                                 const ferry_layout *src_layout, const ferry_op *op,
                                 void *op_arg);

/* Block copies (a KV cache's swap): block src_blocks[i] of each source table into block
 * dst_blocks[i] of the destination table of the same position (dst_tables[t] from
 * src_tables[t]), for every i < nblocks, blocks of block_bytes bytes (block b of a table:
 * bytes b * block_bytes .. of its buffer), every table pair in ONE request; never waits.
 * nblocks 0 (index arrays may be NULL) or ntables 0: a request already done. Every mapping is
 * checked before any byte moves: -FERRY_EINVAL names the entry and the table pair of a block
 * index negative or past its table's end, or of two entries writing one destination block;
 * also NULL/invalid arguments, block_bytes 0. -FERRY_EOVERLAP, -FERRY_EUNSUPPORTED,
 * -FERRY_ESHUTDOWN, -FERRY_EDRIVER as for ferry_dma_request_create_mem. On a CUDA dma the
 * blocks move as one gather: the driver's batched copy, one copy per block, or the SM gather
 * kernel (by block size; never the SMs where FERRY_CUDA_COMPUTE_BUSY=1). BUFFER LIFETIME
 * CONTRACT applies to every table. */
int ferry_dma_copy_blocks(ferry_dma *dma, ferry_request **req, const ferry_buffer *dst_tables,
                          const ferry_buffer *src_tables, size_t ntables, size_t block_bytes,
                          const int64_t *src_blocks, const int64_t *dst_blocks, size_t nblocks);

/* Waits for THIS request only (may block), releases it, sets *req = NULL.
 * FERRY_SUCCESS; -FERRY_EREQUEST if it failed (released all the same; a later barrier does
 * not report it again); -FERRY_EINVAL for NULL/invalid arguments or a request of another dma
 * (nothing released). dma is NULL for a request of no dma (ferry_checkpoint_save_async). */
int ferry_request_wait(ferry_dma *dma, ferry_request **req);

/* Non-blocking poll: *done = 1 once complete, else 0. Does not release the request.
 * -FERRY_EREQUEST once it has completed and failed. dma: as for ferry_request_wait. */
int ferry_request_test(ferry_dma *dma, ferry_request *req, int *done);

/* The request's id, unique in the process (barrier failures name requests by it). */
int ferry_request_id(ferry_request *req, uint64_t *id);

/* Releases a request without taking its result: waits until it is complete (may block; its
 * buffers are free when this returns), frees it, sets *req = NULL. If it failed, the next
 * barrier reports it. NULL *req: no-op. dma may be NULL (e.g. after ferry_dma_destroy). */
int ferry_request_destroy(ferry_dma *dma, ferry_request **req);

/* ---------------------------------------------------------------- checkpoints */

/* safetensors checkpoints (ferry::checkpoint): the caller's tensors, in host or GPU memory,
 * saved to one file or a sharded checkpoint (Hugging Face's model.safetensors.index.json and
 * shards), in the background too, and loaded back into the caller's buffers. No dma: the
 * calls use a file engine of ferry's (FERRY_FILE_* environment, opts), with the CUDA engine of
 * the GPU the tensors are on (FERRY_MEM_DEVICE; all on one GPU per call); one per GPU and
 * settings in the process, made by the first call that needs it and kept (a training loop's
 * saves reuse its threads and pinned memory). */

#define FERRY_DTYPE_ANY -1 /* ferry_checkpoint_load: dtype unchecked */
#define FERRY_DTYPE_BOOL 0
#define FERRY_DTYPE_U8 1
#define FERRY_DTYPE_I8 2
#define FERRY_DTYPE_I16 3
#define FERRY_DTYPE_U16 4
#define FERRY_DTYPE_F16 5
#define FERRY_DTYPE_BF16 6
#define FERRY_DTYPE_I32 7
#define FERRY_DTYPE_U32 8
#define FERRY_DTYPE_F32 9
#define FERRY_DTYPE_F64 10
#define FERRY_DTYPE_I64 11
#define FERRY_DTYPE_U64 12
#define FERRY_DTYPE_F8_E5M2 13
#define FERRY_DTYPE_F8_E4M3 14
#define FERRY_DTYPE_F8_E8M0 15
#define FERRY_DTYPE_C64 16
#define FERRY_DTYPE_F4 17      /* two per byte */
#define FERRY_DTYPE_F6_E2M3 18 /* four per three bytes */
#define FERRY_DTYPE_F6_E3M2 19

/* Saves: how the files are written (ferry_checkpoint_options.writer, and the report's writer:
 * the one that ran). */
#define FERRY_WRITER_AUTO 0     /* the library's choice (the default; see ferry_checkpoint_save) */
#define FERRY_WRITER_BUFFERED 1 /* parallel writes through the page cache */
#define FERRY_WRITER_DIRECT 2   /* O_DIRECT from aligned windows (buffered where refused) */
#define FERRY_WRITER_HYBRID 3   /* O_DIRECT from the end beside buffered writes from the start
                                 * into the page cache's room before writeback */

/* One tensor: name, dtype, shape and its bytes where they live (buf.len = elements x dtype
 * size; 0 for an empty tensor, whose ptr may then be NULL). */
typedef struct ferry_tensor {
    const char *name;    /* UTF-8, NUL-terminated */
    int32_t dtype;       /* FERRY_DTYPE_* (a load: FERRY_DTYPE_ANY leaves it unchecked) */
    size_t ndims;        /* at most FERRY_MAX_DIMS; 0: a scalar */
    const size_t *shape; /* ndims dims (NULL when ndims is 0; a load: NULL leaves it unchecked) */
    ferry_buffer buf;    /* the bytes */
} ferry_tensor;

/* Options; a NULL pointer means all zero (the defaults). */
typedef struct ferry_checkpoint_options {
    int fsync;               /* saves: sync the files and their folder before returning */
    uint64_t shard_bytes;    /* sharded saves: largest shard (0: 5e9, as Hugging Face) */
    uint64_t snapshot_bytes; /* ferry_checkpoint_save_async: host memory for the copy (0: 1 GiB) */
    int threads;             /* file engine workers (0: FERRY_FILE_THREADS, else cores up to 16) */
    int direct;              /* non-zero: O_DIRECT where the file system and alignment allow */
    int keep_snapshot;       /* ferry_checkpoint_save_async: non-zero keeps the copy's host
                              * memory for the next async save that fits in it (its stall is
                              * then the copy alone); 0 frees it and what earlier ones kept;
                              * ignored by ferry_checkpoint_save. */
    int writer;              /* saves: FERRY_WRITER_* (0: FERRY_WRITER_AUTO, the library's
                              * choice); another value is -FERRY_EINVAL. keep_snapshot and
                              * writer are new in this release: callers compiled against an
                              * older ferry.h must be rebuilt. */
} ferry_checkpoint_options;

/* What a call did. */
typedef struct ferry_checkpoint_report {
    uint64_t bytes;          /* loads: tensor bytes; saves: file bytes (headers included) */
    uint64_t tensors;
    uint64_t files;          /* files read or written */
    double seconds;          /* moving the bytes */
    uint64_t pinned_bytes;   /* pinned host memory used (bounce buffers for GPU memory) */
    uint64_t peak_rss_bytes; /* the PROCESS's peak resident memory so far (VmHWM); 0: unknown */
    int writer;              /* saves: the FERRY_WRITER_* that ran (what AUTO chose); loads: 0.
                              * New in this release (rebuild callers of an older ferry.h). */
} ferry_checkpoint_report;

/* Saves n tensors to path: one safetensors file, or a sharded checkpoint where path ends in
 * .safetensors.index.json or is an existing folder (model.safetensors.index.json and shards
 * of at most opts->shard_bytes). Each file appears under its name only once complete; on
 * failure nothing is left behind and existing files are as they were. report may be NULL.
 * -FERRY_EINVAL: NULL/bad arguments, a name given twice, bytes that do not match dtype x
 * shape; -FERRY_ENOTAVAIL: GPU memory without a CUDA driver; -FERRY_EDRIVER: a file or system
 * call failed (the message names the file and the tensor). The buffers must stay valid and
 * unwritten until this returns. The writer is opts->writer; FERRY_WRITER_AUTO (the default;
 * opts->direct is for loads) chooses buffered under 64 MiB; O_DIRECT when fsynced or from
 * host memory; from a GPU, O_DIRECT beside buffered writes into the page cache's room before
 * writeback (FERRY_WRITER_HYBRID). report->writer says which ran. */
int ferry_checkpoint_save(const char *path, const ferry_tensor *tensors, size_t n,
                          const ferry_checkpoint_options *opts, ferry_checkpoint_report *report);

/* As ferry_checkpoint_save, returning once every tensor's bytes are copied out (into at most
 * opts->snapshot_bytes of host memory, pinned for GPU tensors; a larger checkpoint is
 * streamed, this call then also waiting for all but the last window's write): the caller may
 * then change or free the tensors. The files are written in the background; *req completes
 * when they are in place. *req belongs to NO dma: wait/test/destroy it with dma NULL
 * (ferry_request_wait(NULL, &req): -FERRY_EREQUEST with the save's message if it failed), or
 * wait for it with ferry_checkpoint_save_wait for the save's report.
 * Release it before the process exits. Errors as ferry_checkpoint_save (nothing started,
 * *req unchanged). */
int ferry_checkpoint_save_async(const char *path, const ferry_tensor *tensors, size_t n,
                                const ferry_checkpoint_options *opts, ferry_request **req);

/* Waits for an asynchronous save's *req as ferry_request_wait(NULL, req) does (releases it,
 * sets *req = NULL) and fills *report (may be NULL) with what the save did, as
 * ferry_checkpoint_save's. FERRY_SUCCESS; -FERRY_EREQUEST if the save failed (released all
 * the same, *report unchanged); -FERRY_EINVAL: NULL/invalid req, or a request that is not
 * ferry_checkpoint_save_async's (nothing released); -FERRY_EDRIVER: a save that succeeded
 * left no report (not expected; released, *report unchanged). New in this release. */
int ferry_checkpoint_save_wait(ferry_request **req, ferry_checkpoint_report *report);

/* Loads the n named tensors of the checkpoint at path (a .safetensors file, a sharded
 * checkpoint's *.safetensors.index.json, or a folder: its index, else its safetensors file)
 * into the caller's buffers, every shard's reads in flight at once. Every tensor is checked
 * before a byte is read (name in the checkpoint once, buf.len its bytes, dtype and shape
 * where given): -FERRY_EINVAL then writes no buffer; also a malformed file or index.
 * -FERRY_ENOTAVAIL: GPU memory without a CUDA driver; -FERRY_EDRIVER: a file or shard cannot
 * be opened or read (the buffers' bytes are then unspecified). report may be NULL. The
 * buffers must not overlap, and nobody else may touch them until this returns. */
int ferry_checkpoint_load(const char *path, ferry_tensor *tensors, size_t n,
                          const ferry_checkpoint_options *opts, ferry_checkpoint_report *report);

/* ---------------------------------------------------------------------------------------
 * Transfer agent (ferry::agent): registered memory moved between processes of one host, or
 * of several hosts over TCP (ferry_agent_listen_tcp, ferry_agent_connect_tcp).
 * An agent allocates what it registers and gives its address (ferry_region_buffer); a
 * region's descriptor (at most 109 bytes) travels to a peer by any means; the peer connects
 * to the agent's socket, imports the descriptor (the owner confirms it) and reads or writes
 * it with segment lists, one ferry_agent_request each. Host memory: cross-memory attach
 * (pageable) or a shared memfd (shared/pinned); device memory: CUDA IPC, copies on the GPU's
 * copy engines. A request whose peer has exited fails (-FERRY_EREQUEST), never hangs.
 * --------------------------------------------------------------------------------------- */

typedef struct ferry_agent ferry_agent;
typedef struct ferry_region ferry_region;
typedef struct ferry_peer ferry_peer;
typedef struct ferry_remote ferry_remote;
typedef struct ferry_agent_request ferry_agent_request;

/* len bytes from src_off in the source region to dst_off in the destination region. */
typedef struct ferry_segment {
  uint64_t dst_off;
  uint64_t src_off;
  uint64_t len;
} ferry_segment;

/* An agent named name; copies on GPU device's engine, or a CPU engine for device < 0. */
int ferry_agent_create(const char *name, int device, ferry_agent **agent);
/* Closes its socket and peers' connections; *agent = NULL. */
int ferry_agent_destroy(ferry_agent **agent);
/* The socket path peers connect to; valid until the agent is destroyed. */
int ferry_agent_socket_path(const ferry_agent *agent, const char **path);
/* Allocates and registers len zeroed bytes: kind FERRY_MEM_PAGEABLE (shared != 0: a memfd
 * peers map; else cross-memory attach), FERRY_MEM_PINNED (shared, page-locked) or
 * FERRY_MEM_DEVICE (GPU device, CUDA IPC). */
int ferry_agent_alloc(const ferry_agent *agent, size_t len, int kind, int device, int shared,
                      ferry_region **region);
/* Registers len bytes at ptr, host memory the caller keeps (no copy; cross-memory attach);
 * valid until ferry_region_destroy of it returns (it waits for peers' imports to go). */
int ferry_agent_register(const ferry_agent *agent, void *ptr, size_t len, ferry_region **region);
/* The region's address, length and kind. */
int ferry_region_buffer(const ferry_region *region, ferry_buffer *buf);
/* Its descriptor into buf (cap bytes); *len = its length (-FERRY_EINVAL if cap is short). */
int ferry_region_descriptor(const ferry_region *region, uint8_t *buf, size_t cap, size_t *len);
/* Deregisters now; -FERRY_EREQUEST while a peer holds an import of it. */
int ferry_region_deregister(const ferry_region *region);
/* Frees the handle (the memory once no peer holds it); *region = NULL. */
int ferry_region_destroy(ferry_region **region);
/* Connects to the agent at socket path (same host, same user). */
int ferry_agent_connect(const ferry_agent *agent, const char *path, ferry_peer **peer);
/* Serves peers of other hosts too: listens on TCP at addr ("0.0.0.0:7000"; port 0: the
 * kernel picks) for connections that prove key (key_len >= 16 bytes; HMAC-SHA256 challenges
 * both ways, the key never sent; the bytes travel unencrypted); *port (if not NULL) = the
 * port bound. */
int ferry_agent_listen_tcp(const ferry_agent *agent, const char *addr, const uint8_t *key,
                           size_t key_len, uint16_t *port);
/* Connects to the agent listening at addr ("host:port") on this or another host with key;
 * its registrations' bytes then travel over the connection: 4 TCP streams
 * ($FERRY_AGENT_TCP_STREAMS where set), a transfer of at least 512 KiB cut across them. */
int ferry_agent_connect_tcp(const ferry_agent *agent, const char *addr, const uint8_t *key,
                            size_t key_len, ferry_peer **peer);
/* As ferry_agent_connect_tcp over streams TCP streams (1 to 16; 0: the default). */
int ferry_agent_connect_tcp_streams(const ferry_agent *agent, const char *addr,
                                    const uint8_t *key, size_t key_len, size_t streams,
                                    ferry_peer **peer);
int ferry_peer_destroy(ferry_peer **peer);
/* Opens the peer's registration described by the len bytes at desc (refused with the reason:
 * another process's descriptor, a stale or forged one). */
int ferry_peer_import(const ferry_peer *peer, const uint8_t *desc, size_t len,
                      ferry_remote **remote);
/* After its requests end, the peer may free the memory; *remote = NULL. */
int ferry_remote_destroy(ferry_remote **remote);
/* write != 0: region -> remote; else remote -> region. n segments, one request; notify (NULL:
 * none, notify_len bytes) reaches the peer when the request is seen complete. Every segment
 * is checked before any byte moves (-FERRY_EINVAL names the segment). Over TCP, a transfer of
 * at most 64 KiB on a connection with none queued runs in this call and its request is done
 * on return; larger ones return at once. */
int ferry_agent_transfer(const ferry_agent *agent, int write, const ferry_remote *remote,
                         const ferry_region *region, const ferry_segment *segs, size_t n,
                         const void *notify, size_t notify_len, ferry_agent_request **req);
/* Waits (may block), releases, *req = NULL; -FERRY_EREQUEST if it failed. */
int ferry_agent_request_wait(ferry_agent_request **req);
/* *done = 1 once complete (then -FERRY_EREQUEST if it failed), else 0. */
int ferry_agent_request_test(ferry_agent_request *req, int *done);
/* The next notification, waiting at most timeout_ms: up to cap bytes into buf, its length in
 * *len. Returns 1 if one came, 0 if none, or a negative code. */
int ferry_agent_next_notification(const ferry_agent *agent, uint32_t timeout_ms, uint8_t *buf,
                                  size_t cap, size_t *len);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_H */
