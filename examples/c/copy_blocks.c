/* Block copies through ferry's C API (ferry.h): a KV cache's swap, as vLLM's swap_blocks is
 * called, on the CPU engine. Two layers (two table pairs), blocks named by a mapping, one
 * request; every destination byte checked (the mapped blocks, and every other byte
 * untouched); then refused mappings (a block past its table's end, a negative index, two
 * entries writing one destination block) return -FERRY_EINVAL before any byte moves.
 * Prints one line per check and "copy_blocks: OK" last; exits 1 on the first mismatch.
 *
 *   cc -std=c11 -Wall -Wextra -Icrates/ferry-capi/include examples/c/copy_blocks.c \
 *      target/debug/libferry_capi.a -lpthread -ldl -lm -lrt -o copy_blocks */
#include "ferry.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { LAYERS = 2, SRC_BLOCKS = 8, DST_BLOCKS = 6, BLOCK = 96, UNTOUCHED = 0xEE };

static int fail(const char *what, int rc) {
    printf("FAILED: %s: %d (%s): %s\n", what, rc, ferry_strerror(-rc), ferry_last_error_message());
    return 1;
}

/* The byte `i` of source table `layer`. */
static unsigned char pattern(int layer, size_t i) {
    return (unsigned char)(layer * 131 + i * 7 + i / BLOCK);
}

/* Every byte of the destination tables: the mapped blocks from their sources, the rest
 * UNTOUCHED. Returns the number of bytes checked, or -1 after printing the first mismatch. */
static long check_tables(unsigned char *dst[LAYERS], const int64_t *src_blocks,
                         const int64_t *dst_blocks, size_t n) {
    long checked = 0;
    for (int l = 0; l < LAYERS; l++) {
        for (size_t i = 0; i < (size_t)DST_BLOCKS * BLOCK; i++) {
            unsigned char want = UNTOUCHED;
            for (size_t k = 0; k < n; k++)
                if ((size_t)dst_blocks[k] == i / BLOCK)
                    want = pattern(l, (size_t)src_blocks[k] * BLOCK + i % BLOCK);
            if (dst[l][i] != want) {
                printf("FAILED: layer %d byte %zu (block %zu): %u, want %u\n", l, i, i / BLOCK,
                       dst[l][i], want);
                return -1;
            }
            checked++;
        }
    }
    return checked;
}

int main(void) {
    ferry_dma *dma = NULL;
    int rc = ferry_dma_cpu_create(&dma, 2);
    if (rc) return fail("cpu engine", rc);

    unsigned char *src[LAYERS], *dst[LAYERS];
    ferry_buffer src_tables[LAYERS], dst_tables[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        src[l] = malloc((size_t)SRC_BLOCKS * BLOCK);
        dst[l] = malloc((size_t)DST_BLOCKS * BLOCK);
        if (!src[l] || !dst[l]) return fail("malloc", -FERRY_EINVAL);
        for (size_t i = 0; i < (size_t)SRC_BLOCKS * BLOCK; i++) src[l][i] = pattern(l, i);
        memset(dst[l], UNTOUCHED, (size_t)DST_BLOCKS * BLOCK);
        src_tables[l] = (ferry_buffer){src[l], (size_t)SRC_BLOCKS * BLOCK, FERRY_MEM_PAGEABLE, 0};
        dst_tables[l] = (ferry_buffer){dst[l], (size_t)DST_BLOCKS * BLOCK, FERRY_MEM_PAGEABLE, 0};
    }

    /* Blocks 3, 0, 7, 4 (4 and 5: a run on both sides) into 1, 4, 0, 2, 3. */
    const int64_t src_blocks[] = {3, 0, 7, 4, 5};
    const int64_t dst_blocks[] = {1, 4, 0, 2, 3};
    const size_t n = sizeof src_blocks / sizeof src_blocks[0];
    ferry_request *req = NULL;
    rc = ferry_dma_copy_blocks(dma, &req, dst_tables, src_tables, LAYERS, BLOCK, src_blocks,
                               dst_blocks, n);
    if (rc) return fail("copy_blocks", rc);
    rc = ferry_request_wait(dma, &req);
    if (rc) return fail("wait", rc);
    long checked = check_tables(dst, src_blocks, dst_blocks, n);
    if (checked < 0) return 1;
    printf("blocks: %zu of %d bytes in %d layers, %ld destination bytes checked\n", n, BLOCK,
           LAYERS, checked);

    /* Refused mappings: nothing submitted, nothing moved. */
    struct {
        const char *what;
        int64_t s[2], d[2];
    } bad[] = {
        {"destination past its table", {0, 1}, {2, DST_BLOCKS}},
        {"source past its table", {SRC_BLOCKS, 1}, {0, 1}},
        {"negative index", {0, -1}, {0, 1}},
        {"one destination twice", {0, 1}, {5, 5}},
    };
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        for (int l = 0; l < LAYERS; l++) memset(dst[l], UNTOUCHED, (size_t)DST_BLOCKS * BLOCK);
        req = NULL;
        rc = ferry_dma_copy_blocks(dma, &req, dst_tables, src_tables, LAYERS, BLOCK, bad[b].s,
                                   bad[b].d, 2);
        if (rc != -FERRY_EINVAL || req != NULL) {
            printf("FAILED: %s: %d, want %d and no request\n", bad[b].what, rc, -FERRY_EINVAL);
            return 1;
        }
        if (check_tables(dst, src_blocks, dst_blocks, 0) < 0) return 1;
        printf("refused (%s): %d (%s): %s\n", bad[b].what, rc, ferry_strerror(FERRY_EINVAL),
               ferry_last_error_message());
    }

    rc = ferry_dma_destroy(&dma);
    if (rc) return fail("destroy", rc);
    for (int l = 0; l < LAYERS; l++) {
        free(src[l]);
        free(dst[l]);
    }
    printf("copy_blocks: OK\n");
    return 0;
}
