/*
 * copy_tile.c - the ferry C interface end to end, on the CPU engine.
 *
 * Copies a 32 x 24 tile out of a 64 x 48 row-major matrix of doubles into a padded
 * destination (strided layout, pitch of 40 doubles) and checks every byte, destination
 * padding included; copies the same tile transposed; fills; runs a 8 MiB memcpy split across
 * a multiplex of two CPU engines; submits requests of a user operator that fails and checks
 * that the barrier reports each of them; checks NULL-argument errors.
 *
 * Build (from the repository root, after `cargo build -p ferry-capi`; the README's "From C"
 * lines find the library under any CARGO_TARGET_DIR):
 *   cc -std=c11 -Wall -Wextra -Icrates/ferry-capi/include examples/c/copy_tile.c \
 *      "${CARGO_TARGET_DIR:-target}/debug/libferry_capi.a" -lpthread -ldl -lm -lrt -o copy_tile
 * Prints one line per check and "copy_tile: OK" last; exits 1 at the first failed check.
 */
#include "ferry.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond, ...)                                                                  \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                          \
            fprintf(stderr, __VA_ARGS__);                                                 \
            fprintf(stderr, " [last error: %s]\n", ferry_last_error_message());           \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)
#define OK(call)                                                                          \
    do {                                                                                  \
        int rc_ = (call);                                                                 \
        CHECK(rc_ == FERRY_SUCCESS, "%s returned %d (%s)", #call, rc_, ferry_strerror(rc_)); \
    } while (0)

enum { ROWS = 64, COLS = 48, R0 = 8, R1 = 40, C0 = 4, C1 = 28, TR = R1 - R0, TC = C1 - C0,
       PITCH = 40 /* destination row pitch, in doubles */ };

static double value(size_t r, size_t c) { return (double)(r * 1000 + c); }

/* A user operator that copies a region `*(size_t *)op_arg` bytes past the source's end: every
 * request of it must fail, with the planner's out-of-bounds message. */
static int lower_out_of_bounds(ferry_program *prog, const ferry_layout *dst,
                               const ferry_layout *src, void *op_arg, void *user_data) {
    (void)dst; (void)src;
    size_t dst_len = 0, src_len = 0;
    int rc = ferry_program_buffers(prog, &dst_len, &src_len);
    if (rc != FERRY_SUCCESS) return rc;
    size_t len = dst_len, skip = src_len + *(const size_t *)op_arg;
    ferry_layout *d = NULL, *s = NULL;
    rc = ferry_layout_create_dense(&d, 1, &len, 1, FERRY_ORDER_ROW_MAJOR);
    if (rc == FERRY_SUCCESS) rc = ferry_layout_create_strided(&s, 1, &len, (size_t[]){1}, 1, skip);
    if (rc == FERRY_SUCCESS) rc = ferry_program_copy(prog, d, s);
    ferry_layout_destroy(&d);
    ferry_layout_destroy(&s);
    atomic_fetch_add((atomic_int *)user_data, 1); /* lower may run on two workers at once */
    return rc;
}

int main(void) {
    /* ---- engine */
    ferry_dma *dma = NULL;
    OK(ferry_dma_cpu_create(&dma, 2));

    /* ---- the matrix and the tile's source layout: a slice of a dense layout */
    double *m = malloc(sizeof(double) * ROWS * COLS);
    CHECK(m != NULL, "malloc");
    for (size_t r = 0; r < ROWS; r++)
        for (size_t c = 0; c < COLS; c++) m[r * COLS + c] = value(r, c);
    ferry_layout *whole = NULL, *rows = NULL, *tile_src = NULL;
    OK(ferry_layout_create_dense(&whole, 2, (size_t[]){ROWS, COLS}, sizeof(double),
                                 FERRY_ORDER_ROW_MAJOR));
    OK(ferry_layout_slice(whole, &rows, 0, R0, R1, 1));
    OK(ferry_layout_slice(rows, &tile_src, 1, C0, C1, 1));

    /* ---- destination: TR rows of TC doubles every PITCH doubles (a strided layout) */
    ferry_layout *tile_dst = NULL;
    OK(ferry_layout_create_strided(&tile_dst, 2, (size_t[]){TR, TC},
                                   (size_t[]){PITCH * sizeof(double), sizeof(double)},
                                   sizeof(double), 0));
    size_t dst_len = 0;
    OK(ferry_layout_span(tile_dst, &dst_len));
    CHECK(dst_len == ((TR - 1) * PITCH + TC) * sizeof(double), "span %zu", dst_len);
    unsigned char *out = malloc(dst_len);
    CHECK(out != NULL, "malloc");
    memset(out, 0xAB, dst_len); /* poison: gaps must keep it */

    ferry_request *req = NULL;
    OK(ferry_dma_request_create(dma, &req, out, dst_len, tile_dst, m,
                                sizeof(double) * ROWS * COLS, tile_src, FERRY_OP_COPY, NULL));
    int done = -1;
    OK(ferry_request_test(dma, req, &done));
    CHECK(done == 0 || done == 1, "done = %d", done);
    OK(ferry_request_wait(dma, &req));
    CHECK(req == NULL, "wait must set *req to NULL");
    size_t checked = 0;
    for (size_t b = 0; b < dst_len; b++) {
        size_t r = b / (PITCH * sizeof(double)), c = (b % (PITCH * sizeof(double))) / sizeof(double);
        unsigned char want = 0xAB;
        if (c < TC) {
            double v = value(R0 + r, C0 + c);
            want = ((const unsigned char *)&v)[b % sizeof(double)];
        }
        CHECK(out[b] == want, "byte %zu (row %zu, col %zu): %#x, want %#x", b, r, c, out[b], want);
        checked++;
    }
    printf("tile: %d x %d doubles copied, %zu destination bytes checked\n", TR, TC, checked);

    /* ---- the same tile transposed: dense TC x TR destination, source permuted */
    ferry_layout *tile_t = NULL, *dense_t = NULL;
    OK(ferry_layout_permute(tile_src, &tile_t, 2, (size_t[]){1, 0}));
    OK(ferry_layout_create_dense(&dense_t, 2, (size_t[]){TC, TR}, sizeof(double),
                                 FERRY_ORDER_ROW_MAJOR));
    double *t = calloc(TC * TR, sizeof(double));
    CHECK(t != NULL, "calloc");
    OK(ferry_dma_request_create(dma, &req, t, sizeof(double) * TC * TR, dense_t, m,
                                sizeof(double) * ROWS * COLS, tile_t, FERRY_OP_COPY, NULL));
    OK(ferry_request_wait(dma, &req));
    for (size_t c = 0; c < TC; c++)
        for (size_t r = 0; r < TR; r++)
            CHECK(t[c * TR + r] == value(R0 + r, C0 + c), "transposed [%zu][%zu]", c, r);
    printf("transpose: %d x %d checked\n", TC, TR);

    /* ---- fill the transposed buffer's first column (a strided slice) with -1.0 */
    ferry_layout *col = NULL;
    OK(ferry_layout_slice(dense_t, &col, 1, 0, 1, 1));
    double minus_one = -1.0;
    OK(ferry_dma_request_create(dma, &req, t, sizeof(double) * TC * TR, col, NULL, 0, NULL,
                                FERRY_OP_FILL, &minus_one));
    OK(ferry_request_wait(dma, &req));
    for (size_t c = 0; c < TC; c++)
        for (size_t r = 0; r < TR; r++)
            CHECK(t[c * TR + r] == (r == 0 ? -1.0 : value(R0 + r, C0 + c)), "fill [%zu][%zu]", c, r);
    printf("fill: column of %d checked\n", TC);

    /* ---- memcpy of 8 MiB split across a multiplex of two CPU engines */
    ferry_dma *parts[2] = {NULL, NULL}, *mux = NULL;
    OK(ferry_dma_cpu_create(&parts[0], 1));
    OK(ferry_dma_cpu_create(&parts[1], 1));
    OK(ferry_dma_multiplex_create(&mux, parts, (double[]){1.0, 3.0}, 2, 1 << 20));
    CHECK(parts[0] == NULL && parts[1] == NULL, "multiplex must take its engines");
    size_t big = 8u << 20;
    unsigned char *a = malloc(big), *b = malloc(big);
    CHECK(a && b, "malloc");
    for (size_t i = 0; i < big; i++) a[i] = (unsigned char)(i * 131 + (i >> 12));
    memset(b, 0, big);
    OK(ferry_dma_request_create(mux, &req, b, big, NULL, a, big, NULL, FERRY_OP_MEMCPY, NULL));
    OK(ferry_request_wait(mux, &req));
    CHECK(memcmp(a, b, big) == 0, "multiplex memcpy differs");
    printf("multiplex memcpy: %zu bytes checked\n", big);

    /* ---- a failing user operator: two requests fail, one good copy between them */
    atomic_int calls = 0;
    ferry_operator table = {"out_of_bounds", lower_out_of_bounds, NULL, &calls};
    ferry_op *bad = NULL;
    OK(ferry_operator_create(&bad, &table));
    size_t past = 16;
    ferry_request *r1 = NULL, *r2 = NULL, *r3 = NULL;
    OK(ferry_dma_request_create(dma, &r1, b, 64, NULL, a, 64, NULL, bad, &past));
    OK(ferry_dma_request_create(dma, &r2, b + 64, 64, NULL, a + 64, 64, NULL, FERRY_OP_MEMCPY, NULL));
    OK(ferry_dma_request_create(dma, &r3, b + 128, 64, NULL, a + 128, 64, NULL, bad, &past));
    uint64_t id1 = 0, id3 = 0;
    OK(ferry_request_id(r1, &id1));
    OK(ferry_request_id(r3, &id3));
    /* Release the handles without taking their results: the barrier must report both. */
    OK(ferry_request_destroy(dma, &r1));
    OK(ferry_request_destroy(dma, &r3));
    OK(ferry_request_wait(dma, &r2));
    int failed = ferry_dma_barrier(dma);
    CHECK(failed == 2, "barrier returned %d, want 2", failed);
    printf("barrier: %d failed requests\n", failed);
    for (size_t i = 0; i < (size_t)failed; i++) {
        uint64_t id = 0;
        const char *msg = NULL;
        OK(ferry_dma_barrier_failure(dma, i, &id, &msg));
        CHECK(id == id1 || id == id3, "failure %zu names request %llu", i, (unsigned long long)id);
        CHECK(strstr(msg, "out_of_bounds") && strstr(msg, "buffer"), "message: %s", msg);
        printf("  failure %zu: %s\n", i, msg);
    }
    CHECK(ferry_dma_barrier_failure(dma, 2, NULL, NULL) == -FERRY_EINVAL, "index past the count");
    CHECK(atomic_load(&calls) == 2, "lower ran %d times", atomic_load(&calls));
    CHECK(ferry_dma_barrier(dma) == 0, "a second barrier reports nothing new");
    /* Waiting on a failing request returns its error, and the barrier then does not repeat it. */
    OK(ferry_dma_request_create(dma, &r1, b, 64, NULL, a, 64, NULL, bad, &past));
    int rc = ferry_request_wait(dma, &r1);
    CHECK(rc == -FERRY_EREQUEST && r1 == NULL, "wait on a failing request: %d", rc);
    printf("wait on failing request: %d (%s): %s\n", rc, ferry_strerror(rc), ferry_last_error_message());
    CHECK(ferry_dma_barrier(dma) == 0, "barrier after a waited failure");
    OK(ferry_operator_destroy(&bad));

    /* ---- NULL and invalid arguments are error codes, never crashes */
    rc = ferry_dma_request_create(dma, &req, out, dst_len, tile_dst, m, 8, tile_src, NULL, NULL);
    CHECK(rc == -FERRY_EINVAL && req == NULL, "NULL op: %d", rc);
    printf("null op: %d (%s): %s\n", rc, ferry_strerror(rc), ferry_last_error_message());
    rc = ferry_dma_request_create(NULL, &req, out, dst_len, tile_dst, m, 8, tile_src, FERRY_OP_COPY, NULL);
    CHECK(rc == -FERRY_EINVAL, "NULL dma: %d", rc);
    rc = ferry_layout_create_dense(&col, 2, NULL, 8, FERRY_ORDER_ROW_MAJOR);
    CHECK(rc == -FERRY_EINVAL, "NULL dims: %d", rc);
    rc = ferry_request_wait(dma, NULL);
    CHECK(rc == -FERRY_EINVAL, "NULL req: %d", rc);
    /* A source layout reaching past a too-short source buffer: refused at submit. */
    rc = ferry_dma_request_create(dma, &req, out, dst_len, tile_dst, m, 1024, tile_src, FERRY_OP_COPY, NULL);
    CHECK(rc == -FERRY_ELAYOUT && req == NULL, "short source: %d", rc);
    printf("short source: %d (%s): %s\n", rc, ferry_strerror(rc), ferry_last_error_message());
    ferry_dma *cuda = NULL;
    rc = ferry_dma_cuda_create(&cuda, 0);
    CHECK((rc == FERRY_SUCCESS && cuda != NULL) || (rc == -FERRY_ENOTAVAIL && cuda == NULL), "cuda: %d", rc);
    if (cuda != NULL) ferry_dma_destroy(&cuda);
    printf("cuda: %d (%s)\n", rc, ferry_strerror(rc));

    /* ---- teardown: destroy waits for work in flight */
    OK(ferry_dma_request_create(dma, &req, b, big, NULL, a, big, NULL, FERRY_OP_MEMCPY, NULL));
    CHECK(ferry_dma_destroy(&dma) == 0 && dma == NULL, "destroy");
    CHECK(memcmp(a, b, big) == 0, "copy in flight at destroy did not finish");
    OK(ferry_request_destroy(NULL, &req));
    CHECK(ferry_dma_destroy(&mux) == 0, "destroy mux");
    ferry_layout *ls[] = {whole, rows, tile_src, tile_dst, tile_t, dense_t, col};
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++) OK(ferry_layout_destroy(&ls[i]));
    free(m); free(out); free(t); free(a); free(b);
    printf("copy_tile: OK\n");
    return 0;
}
