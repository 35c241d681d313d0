/*
 * results.c -- the memory of large result arrays, kept for reuse.
 *
 * A new array of some tens of megabytes is mapped from the operating system
 * and each of its pages is zeroed on its first write (glibc's malloc maps
 * every block above 32 MiB and unmaps it when freed): writing a fresh
 * 128 MiB result costs about half as much again as writing into memory the
 * process already holds. So the memory of a result array of at least
 * FA_RESULT_MIN_BYTES goes, when its last array goes, to a small cache of
 * at most FA_RESULT_SLOTS blocks and fa_result_limit bytes, and the next
 * result of the same rounded size takes it from there (as ONNX Runtime's
 * arena hands back the memory of earlier results). A block's size is
 * rounded up to FA_RESULT_ALIGN (a huge page) and aligned to it, and on
 * Linux it is offered to transparent huge pages (NumPy offers its large
 * arrays too, unaligned: a 128 MiB numpy.empty array got none where a block
 * got all of its pages huge, with huge pages on request).
 *
 * The cache is one record for the process, read and written under one
 * lock where the build has OpenMP (fastattn._core calls in with the GIL
 * held, so the lock is never contended there; a build without OpenMP relies
 * on the GIL alone).
 */
#if defined(__linux__)
#define _GNU_SOURCE /* (glibc 2.17 on, musl, under -std=c99: posix_memalign, madvise, MADV_HUGEPAGE) */
#endif
#include "fastattn.h"

#include <stdlib.h>

#if defined(__linux__)
#include <sys/mman.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef _WIN32
#include <malloc.h>
#endif

#define FA_RESULT_ALIGN ((int64_t)1 << 21)
#define FA_RESULT_SLOTS 4

static struct {
    void *p;
    int64_t bytes;
} fa_cached[FA_RESULT_SLOTS]; /* oldest first */
static int fa_ncached = 0;
static int64_t fa_cached_bytes = 0;
static int64_t fa_result_limit = FA_RESULT_CACHE_DEFAULT;

static void *block_alloc(int64_t bytes)
{
    void *p = NULL;
#ifdef _WIN32
    p = _aligned_malloc((size_t)bytes, (size_t)FA_RESULT_ALIGN);
#else
    if (posix_memalign(&p, (size_t)FA_RESULT_ALIGN, (size_t)bytes) != 0)
        p = NULL;
#endif
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (p)
        (void)madvise(p, (size_t)bytes, MADV_HUGEPAGE); /* (a hint: a refusal changes nothing) */
#endif
    return p;
}

static void block_free(void *p)
{
#ifdef _WIN32
    _aligned_free(p);
#else
    free(p);
#endif
}

/* Frees the oldest cached blocks until the cache holds at most `bytes` and
 * has a slot free for one more where `slot` (called within the lock). */
static void shrink_to(int64_t bytes, int slot)
{
    int i, drop = 0;
    while (drop < fa_ncached
           && (fa_cached_bytes > bytes || (slot && fa_ncached - drop == FA_RESULT_SLOTS))) {
        fa_cached_bytes -= fa_cached[drop].bytes;
        block_free(fa_cached[drop].p);
        drop++;
    }
    for (i = drop; i < fa_ncached; i++)
        fa_cached[i - drop] = fa_cached[i];
    fa_ncached -= drop;
}

int64_t fa_result_bytes(int64_t nbytes)
{
    if (nbytes < FA_RESULT_MIN_BYTES || nbytes > INT64_MAX - FA_RESULT_ALIGN)
        return -1;
    return (nbytes + FA_RESULT_ALIGN - 1) / FA_RESULT_ALIGN * FA_RESULT_ALIGN;
}

void *fa_result_alloc(int64_t bytes)
{
    void *p = NULL;
    int i, j;
    if (bytes < FA_RESULT_MIN_BYTES || bytes % FA_RESULT_ALIGN != 0)
        return NULL;
#ifdef _OPENMP
#pragma omp critical(fastattn_results)
#endif
    for (i = fa_ncached - 1; i >= 0; i--) /* (the newest of that size: its pages the warmest) */
        if (fa_cached[i].bytes == bytes) {
            p = fa_cached[i].p;
            fa_cached_bytes -= bytes;
            for (j = i + 1; j < fa_ncached; j++)
                fa_cached[j - 1] = fa_cached[j];
            fa_ncached--;
            break;
        }
    return p ? p : block_alloc(bytes);
}

void fa_result_free(void *p, int64_t bytes)
{
    int kept = 0;
    if (!p)
        return;
#ifdef _OPENMP
#pragma omp critical(fastattn_results)
#endif
    if (bytes <= fa_result_limit) {
        shrink_to(fa_result_limit - bytes, 1);
        fa_cached[fa_ncached].p = p;
        fa_cached[fa_ncached].bytes = bytes;
        fa_ncached++;
        fa_cached_bytes += bytes;
        kept = 1;
    }
    if (!kept)
        block_free(p);
}

int64_t fa_result_cache(int64_t limit, int64_t *held)
{
    int64_t before;
#ifdef _OPENMP
#pragma omp critical(fastattn_results)
#endif
    {
        before = fa_result_limit;
        if (limit >= 0) {
            fa_result_limit = limit;
            shrink_to(limit, 0);
        }
        if (held)
            *held = fa_cached_bytes;
    }
    return before;
}
