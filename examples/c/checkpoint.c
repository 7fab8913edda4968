/*
 * checkpoint.c - a model's tensors saved and loaded through ferry.h's checkpoint calls:
 * one safetensors file, a sharded checkpoint in a folder, a save in the background (the
 * tensors changed while it writes), every byte read back and compared, and a refused load.
 *
 *   cc -std=c11 -I crates/ferry-capi/include examples/c/checkpoint.c \
 *      target/debug/libferry_capi.a -lpthread -ldl -lm -lrt -lgcc_s -lc -o checkpoint
 *   ./checkpoint /tmp/some-empty-folder
 *
 * Prints one line per step and "checkpoint: OK" at the end; exits 1 on the first failure.
 */
#include "ferry.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CHECK(call)                                                                        \
    do {                                                                                   \
        int rc_ = (call);                                                                  \
        if (rc_ != FERRY_SUCCESS) {                                                        \
            printf("%s:%d: %s = %d (%s): %s\n", __FILE__, __LINE__, #call, rc_,            \
                   ferry_strerror(rc_), ferry_last_error_message());                       \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

enum { NT = 3, W_ROWS = 256, W_COLS = 128, B_LEN = 1000 };

/* The model: a float matrix, a bf16 vector (as raw 16-bit words) and a step counter. */
typedef struct model {
    float *w;
    uint16_t *b;
    int64_t step;
} model;

static const size_t w_shape[2] = {W_ROWS, W_COLS};
static const size_t b_shape[1] = {B_LEN};

static ferry_buffer host(void *p, size_t len) {
    ferry_buffer b = {p, len, FERRY_MEM_PAGEABLE, 0};
    return b;
}

static void describe(model *m, ferry_tensor t[NT]) {
    ferry_tensor w = {"w", FERRY_DTYPE_F32, 2, w_shape, host(m->w, sizeof(float) * W_ROWS * W_COLS)};
    ferry_tensor b = {"b", FERRY_DTYPE_BF16, 1, b_shape, host(m->b, sizeof(uint16_t) * B_LEN)};
    ferry_tensor s = {"step", FERRY_DTYPE_I64, 0, NULL, host(&m->step, sizeof(int64_t))};
    t[0] = w;
    t[1] = b;
    t[2] = s;
}

static model alloc_model(int seed) {
    model m;
    m.w = malloc(sizeof(float) * W_ROWS * W_COLS);
    m.b = malloc(sizeof(uint16_t) * B_LEN);
    if (!m.w || !m.b) {
        printf("out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < (size_t)W_ROWS * W_COLS; i++) m.w[i] = (float)(i % 977) * 0.5f + (float)seed;
    for (size_t i = 0; i < B_LEN; i++) m.b[i] = (uint16_t)(i * 31 + (size_t)seed);
    m.step = 1000 + seed;
    return m;
}

static void free_model(model *m) {
    free(m->w);
    free(m->b);
}

/* Loads the checkpoint at path into a zeroed model and compares it with want. */
static void load_and_compare(const char *what, const char *path, const model *want) {
    model got = alloc_model(0);
    memset(got.w, 0, sizeof(float) * W_ROWS * W_COLS);
    memset(got.b, 0, sizeof(uint16_t) * B_LEN);
    got.step = 0;
    ferry_tensor t[NT];
    describe(&got, t);
    ferry_checkpoint_report r;
    CHECK(ferry_checkpoint_load(path, t, NT, NULL, &r));
    if (memcmp(got.w, want->w, sizeof(float) * W_ROWS * W_COLS) != 0 ||
        memcmp(got.b, want->b, sizeof(uint16_t) * B_LEN) != 0 || got.step != want->step) {
        printf("%s: the loaded tensors differ from the saved ones\n", what);
        exit(1);
    }
    printf("%s: %llu tensors, %llu bytes from %llu file(s) checked; pinned %llu bytes, process "
           "peak RSS %s\n",
           what, (unsigned long long)r.tensors, (unsigned long long)r.bytes,
           (unsigned long long)r.files, (unsigned long long)r.pinned_bytes,
           r.peak_rss_bytes > 0 ? "known" : "unknown");
    free_model(&got);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        printf("usage: %s EMPTY_FOLDER\n", argv[0]);
        return 2;
    }
    char file[4096], folder[4096], later[4096];
    snprintf(file, sizeof file, "%s/model.safetensors", argv[1]);
    snprintf(folder, sizeof folder, "%s/sharded", argv[1]);
    snprintf(later, sizeof later, "%s/async.safetensors", argv[1]);
    mkdir(folder, 0700);

    model m = alloc_model(7);
    ferry_tensor t[NT];
    describe(&m, t);

    /* One file. */
    ferry_checkpoint_report r;
    CHECK(ferry_checkpoint_save(file, t, NT, NULL, &r));
    printf("save: %llu tensors, %llu bytes\n", (unsigned long long)r.tensors,
           (unsigned long long)r.bytes);
    load_and_compare("load file", file, &m);

    /* A sharded checkpoint in a folder: shards of at most 64 KiB. */
    ferry_checkpoint_options o;
    memset(&o, 0, sizeof o);
    o.shard_bytes = 64 << 10;
    o.threads = 2;
    CHECK(ferry_checkpoint_save(folder, t, NT, &o, NULL));
    load_and_compare("load folder", folder, &m);

    /* In the background: the model changes as soon as the call returns. */
    model keep = alloc_model(7);
    ferry_request *req = NULL;
    CHECK(ferry_checkpoint_save_async(later, t, NT, NULL, &req));
    for (size_t i = 0; i < (size_t)W_ROWS * W_COLS; i++) m.w[i] = -1.0f;
    m.step = -1;
    /* Waited with its report (ferry_request_wait(NULL, &req) waits without it). */
    ferry_checkpoint_report ar;
    CHECK(ferry_checkpoint_save_wait(&req, &ar));
    printf("async save: %llu tensors, %llu bytes\n", (unsigned long long)ar.tensors,
           (unsigned long long)ar.bytes);
    load_and_compare("load async save", later, &keep);

    /* A refused load: the wrong shape for `w`; nothing is written. */
    static const size_t wrong[2] = {W_COLS, W_ROWS};
    t[0].shape = wrong;
    int rc = ferry_checkpoint_load(file, t, NT, NULL, NULL);
    printf("wrong shape: %d (%s): %s\n", rc, ferry_strerror(rc), ferry_last_error_message());
    if (rc != -FERRY_EINVAL || m.step != -1) return 1;

    free_model(&m);
    free_model(&keep);
    printf("checkpoint: OK\n");
    return 0;
}
