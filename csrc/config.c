/*
 * config.c -- build and runtime facts reported by fastattn.show_config(),
 * the cache size the work units are planned for, and the thread policy
 * (fa_threads_for, see fa_internal.h).
 */
#include "fastattn.h"
#include "fa_internal.h"

#include <stdio.h>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

int fa_built_with_openmp(void)
{
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

int fa_omp_max_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

#define FA_STR2(x) #x
#define FA_STR(x) FA_STR2(x)

const char *fa_compiler(void)
{
#if defined(__clang__)
    return "clang " __clang_version__;
#elif defined(__GNUC__)
    return "gcc " __VERSION__;
#elif defined(_MSC_VER)
    return "msvc " FA_STR(_MSC_FULL_VER);
#else
    return "unknown C compiler";
#endif
}

int64_t fa_l2_cache_bytes(void)
{
#if defined(_SC_LEVEL2_CACHE_SIZE)
    const long n = sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (n > 0)
        return (int64_t)n;
#endif
    return (int64_t)1 << 20;
}

/* When the machine stops counting as loaded, in microseconds of fa_now();
 * read and written by any thread (a record, not a lock: each writes a value
 * any of them could; two records written together may be read from two
 * different calls, which at worst makes one window a step too long or
 * short). */
static int64_t fa_busy_until_us = 0;
/* When the last threaded attention call ended, likewise (0: none yet). */
static int64_t fa_team_end_us = 0;
/* 1 if that call had a late thread while the threads were awake, likewise. */
static int64_t fa_was_late = 0;
/* The length of the last window of load, in microseconds, likewise. */
static int64_t fa_busy_span_us = 0;

static int64_t record_get(const int64_t *r)
{
#if defined(__GNUC__) || defined(__clang__)
    return __atomic_load_n(r, __ATOMIC_RELAXED);
#else
    return *(const volatile int64_t *)r;
#endif
}

static void record_set(int64_t *r, int64_t v)
{
#if defined(__GNUC__) || defined(__clang__)
    __atomic_store_n(r, v, __ATOMIC_RELAXED);
#else
    *(volatile int64_t *)r = v;
#endif
}

double fa_now(void)
{
#ifdef _OPENMP
    return omp_get_wtime();
#else
    return 0.0;
#endif
}

void fa_set_busy(double seconds)
{
    /* (at most a day: the microseconds stay far from overflow) */
    const double s = seconds > 86400.0 ? 86400.0 : seconds;
    record_set(&fa_busy_until_us, s > 0.0 ? (int64_t)((fa_now() + s) * 1e6) : 0);
    record_set(&fa_busy_span_us, s > 0.0 ? (int64_t)(s * 1e6) : 0);
    if (!(s > 0.0))
        record_set(&fa_was_late, 0);
}

void fa_busy_window(int64_t *until_us, int64_t *span_us)
{
    *until_us = record_get(&fa_busy_until_us);
    *span_us = record_get(&fa_busy_span_us);
}

int64_t fa_busy_span(int64_t now_us, int64_t until_us, int64_t span_us)
{
    const int64_t lo = (int64_t)(FA_BUSY_MIN_S * 1e6), hi = (int64_t)(FA_BUSY_S * 1e6);
    /* (compared without sums or products that could overflow) */
    if (until_us == 0 || span_us <= 0 || (now_us > until_us && now_us - until_us >= span_us))
        return lo; /* the first load in a while: perhaps a moment's */
    return span_us >= hi / 4 ? hi : (4 * span_us < lo ? lo : 4 * span_us);
}

/* The machine counts as loaded from now for fa_busy_span's window. */
static void count_loaded(void)
{
    const int64_t now = (int64_t)(fa_now() * 1e6);
    const int64_t span = fa_busy_span(now, record_get(&fa_busy_until_us),
                                      record_get(&fa_busy_span_us));
    record_set(&fa_busy_span_us, span);
    record_set(&fa_busy_until_us, now + span);
}

/* 1 where threads other than the call's keep the machine's cores busy now:
 * on Linux, the threads running or waiting to run (/proc/loadavg's fourth
 * field, which counts the whole machine, less the nt of the call just
 * ended, whose threads still spin) fill every core the machine has online
 * (not only those this process may use: the count is the machine's too);
 * elsewhere (no such count, or none to read) 1, a late thread's word taken
 * as it stands. */
static int others_fill_the_cores(int nt)
{
#if defined(__linux__) && defined(_OPENMP)
    int running = 0;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    FILE *f = fopen("/proc/loadavg", "r");
    if (!f)
        return 1;
    if (cores < 1)
        cores = omp_get_num_procs();
    if (fscanf(f, "%*f %*f %*f %d/", &running) != 1)
        running = (int)cores + nt;
    fclose(f);
    return running - nt >= cores;
#else
    (void)nt;
    return 1;
#endif
}

void fa_note_wait(double start, double wait, int nt)
{
    const int64_t prev = record_get(&fa_team_end_us);
    const int late = wait >= FA_LATE_S && prev != 0;
    const int hot = start * 1e6 - (double)prev < FA_HOT_S * 1e6;
    if (late) {
        /* while the threads still wait awake, a late one was kept off its
         * core: by other threads, or for a moment by the host of a virtual
         * machine (the second such call in a row counts); after a pause it
         * may only have been slow to wake */
        if ((hot && record_get(&fa_was_late)) || others_fill_the_cores(nt))
            count_loaded();
    }
    /* (a late thread after a pause is no stall: the next call is not the
     * second late one in a row) */
    record_set(&fa_was_late, late && hot);
    record_set(&fa_team_end_us, (int64_t)(fa_now() * 1e6));
}

int fa_busy(void)
{
    const int64_t until = record_get(&fa_busy_until_us);
    return until != 0 && (int64_t)(fa_now() * 1e6) < until;
}

int fa_threads_for(int nthreads, double work, int64_t nitems)
{
    int nt = nthreads < 1 ? 1 : nthreads;
    if (work < 2.0 * FA_MIN_WORK_PER_THREAD)
        return 1;
    if ((double)nt > work / FA_MIN_WORK_PER_THREAD)
        nt = (int)(work / FA_MIN_WORK_PER_THREAD);
    if ((int64_t)nt > nitems)
        nt = (int)nitems;
    if (nt > 1 && work < FA_BUSY_WORK && fa_busy())
        nt = 1;
    return nt < 1 ? 1 : nt;
}

/* dtypes.h's table, row by row, for fastattn._core. */
static const struct {
    int code, bytes, block;
    const char *name;
} fa_dtype_rows[] = {
#define FA_DTYPE_ROW(NAME, code, name, bytes, block, at) {code, bytes, block, name},
    FA_DTYPES(FA_DTYPE_ROW)
#undef FA_DTYPE_ROW
};

int fa_dtype_count(void)
{
    return (int)(sizeof fa_dtype_rows / sizeof fa_dtype_rows[0]);
}

void fa_dtype_row(int i, int *code, const char **name, int *bytes, int *block)
{
    *code = fa_dtype_rows[i].code;
    *name = fa_dtype_rows[i].name;
    *bytes = fa_dtype_rows[i].bytes;
    *block = fa_dtype_rows[i].block;
}
