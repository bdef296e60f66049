/*
 * tierserve's fixed C ABI over libsmctrl, which is dlopen()ed at run time from a path the user gives.
 *
 * libsmctrl (Bakita & Anderson, UNC) sets per-stream TPC masks by writing into the CUDA driver's
 * stream structure; a SET bit DISABLES that TPC. Its exported API has varied between releases: a
 * 64-bit libsmctrl_set_stream_mask, later a 128-bit libsmctrl_set_stream_mask_ext for GPUs with
 * more than 64 TPCs, and TPC counts by nvdebug index (libsmctrl_get_tpc_info) or by CUDA device
 * (libsmctrl_get_tpc_info_cuda). This shim resolves whichever of them the loaded build has, so the
 * Python wrapper (native/smctrl.py) sees one stable set of calls that return 0, or non-zero with a
 * message in `err`. It is never linked against libsmctrl or CUDA and needs no CUDA headers: a
 * stream is a void* (a cudaStream_t / CUstream) and the 128-bit mask is gcc's unsigned __int128.
 *
 * The mask setters are called as returning void, as upstream libsmctrl.h declares them; a return
 * value some fork adds is ignored. One library is open per process (libsmctrl itself is process-wide
 * state); opening another closes the previous one.
 */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

enum {
    TS_OK = 0,
    TS_NOT_OPEN = 1,
    TS_LOAD_FAILED = 2,
    TS_MISSING_SYMBOL = 3,
    TS_BAD_ARGUMENT = 4,
    TS_LIBRARY_ERROR = 5,
};

typedef unsigned __int128 ts_u128;
typedef void (*ts_set_mask64)(void *stream, uint64_t mask);
typedef void (*ts_set_mask128)(void *stream, ts_u128 mask);
typedef int (*ts_tpc_info)(uint32_t *num_tpcs, int dev);

static struct {
    void *handle;
    ts_set_mask64 set_stream_mask;
    ts_set_mask128 set_stream_mask_ext;
    ts_tpc_info tpc_info_cuda;
    ts_tpc_info tpc_info;
} lib;

static int fail(int code, char *err, int errlen, const char *fmt, ...) {
    if (err != NULL && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, (size_t)errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

static void *resolve(void *handle, const char *name) {
    dlerror();
    return dlsym(handle, name);
}

/* Load libsmctrl from `path` (RTLD_NOW: a missing libcuda shows up here, not at the first call). */
int ts_smctrl_open(const char *path, char *err, int errlen) {
    if (path == NULL || path[0] == '\0')
        return fail(TS_BAD_ARGUMENT, err, errlen, "no libsmctrl path given");
    dlerror();
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        const char *why = dlerror();
        return fail(TS_LOAD_FAILED, err, errlen, "dlopen(%s) failed: %s", path, why ? why : "unknown error");
    }
    ts_set_mask64 m64 = (ts_set_mask64)resolve(handle, "libsmctrl_set_stream_mask");
    ts_set_mask128 m128 = (ts_set_mask128)resolve(handle, "libsmctrl_set_stream_mask_ext");
    if (m64 == NULL && m128 == NULL) {
        dlclose(handle);
        return fail(TS_MISSING_SYMBOL, err, errlen,
                    "%s exports neither libsmctrl_set_stream_mask nor libsmctrl_set_stream_mask_ext: "
                    "is it libsmctrl?", path);
    }
    if (lib.handle != NULL && lib.handle != handle)
        dlclose(lib.handle);
    lib.handle = handle;
    lib.set_stream_mask = m64;
    lib.set_stream_mask_ext = m128;
    lib.tpc_info_cuda = (ts_tpc_info)resolve(handle, "libsmctrl_get_tpc_info_cuda");
    lib.tpc_info = (ts_tpc_info)resolve(handle, "libsmctrl_get_tpc_info");
    return TS_OK;
}

/* 1 if the open library has the 128-bit _ext setter, 0 if only the 64-bit one, -1 if none is open. */
int ts_smctrl_has_ext(void) {
    if (lib.handle == NULL)
        return -1;
    return lib.set_stream_mask_ext != NULL;
}

/* TPCs of CUDA device `device`: libsmctrl_get_tpc_info_cuda, else libsmctrl_get_tpc_info (whose
 * device number is nvdebug's, which can differ from CUDA's; the message says which was used). */
int ts_smctrl_num_tpcs(int device, uint32_t *out, char *err, int errlen) {
    if (lib.handle == NULL)
        return fail(TS_NOT_OPEN, err, errlen, "libsmctrl is not open (call ts_smctrl_open first)");
    if (out == NULL)
        return fail(TS_BAD_ARGUMENT, err, errlen, "out is NULL");
    const char *name = "libsmctrl_get_tpc_info_cuda";
    ts_tpc_info fn = lib.tpc_info_cuda;
    if (fn == NULL) {
        name = "libsmctrl_get_tpc_info";
        fn = lib.tpc_info;
    }
    if (fn == NULL)
        return fail(TS_MISSING_SYMBOL, err, errlen,
                    "this libsmctrl exports neither libsmctrl_get_tpc_info_cuda nor libsmctrl_get_tpc_info");
    uint32_t n = 0;
    int rc = fn(&n, device);
    if (rc != 0)
        return fail(TS_LIBRARY_ERROR, err, errlen, "%s(device=%d) returned %d (%s)", name, device, rc,
                    rc > 0 ? strerror(rc) : "negative error code");
    *out = n;
    return TS_OK;
}

/* Set the TPC mask of `stream` (bit i set = TPC i disabled) to hi:lo. The 128-bit _ext setter is
 * used whenever the library has it; without it only masks with hi == 0 can be set. */
int ts_smctrl_set_stream_mask(void *stream, uint64_t lo, uint64_t hi, char *err, int errlen) {
    if (lib.handle == NULL)
        return fail(TS_NOT_OPEN, err, errlen, "libsmctrl is not open (call ts_smctrl_open first)");
    if (stream == NULL)
        return fail(TS_BAD_ARGUMENT, err, errlen,
                    "stream is NULL: libsmctrl masks a created stream's struct; the legacy default stream "
                    "cannot be masked");
    if (lib.set_stream_mask_ext != NULL) {
        lib.set_stream_mask_ext(stream, ((ts_u128)hi << 64) | (ts_u128)lo);
        return TS_OK;
    }
    if (hi != 0)
        return fail(TS_MISSING_SYMBOL, err, errlen,
                    "mask 0x%016llx%016llx names TPCs >= 64 but this libsmctrl has no "
                    "libsmctrl_set_stream_mask_ext (build a newer libsmctrl)",
                    (unsigned long long)hi, (unsigned long long)lo);
    lib.set_stream_mask(stream, lo);
    return TS_OK;
}

/* Close the library (the masks already set on streams stay as they are). */
void ts_smctrl_close(void) {
    if (lib.handle != NULL)
        dlclose(lib.handle);
    memset(&lib, 0, sizeof lib);
}
