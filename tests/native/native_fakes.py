"""C sources of stand-in libraries for the native/ tests.

They replace libraries that only work on an NVIDIA GPU (libsmctrl writes into the CUDA driver's
stream structs; green contexts need a real driver), which no CPU machine can provide. They record
what they were called with, so the tests check what crosses the ctypes/C boundary, not the GPU.
"""

import ctypes


def libcuda_loads() -> bool:
    """Whether this machine has a CUDA driver (then "unsupported" reasons differ)."""
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


FAKE_LIBSMCTRL = r"""
#include <stdint.h>
typedef unsigned __int128 u128;
#define FAKE_MAX_CALLS 16
int fake_ncalls, fake_calls64, fake_calls128, fake_tpc_rc, fake_tpc_dev = -1;
void *fake_streams[FAKE_MAX_CALLS];
uint64_t fake_los[FAKE_MAX_CALLS], fake_his[FAKE_MAX_CALLS];
uint32_t fake_tpcs = 66;

static void record(void *s, uint64_t lo, uint64_t hi) {
    if (fake_ncalls < FAKE_MAX_CALLS) {
        fake_streams[fake_ncalls] = s; fake_los[fake_ncalls] = lo; fake_his[fake_ncalls] = hi;
    }
    fake_ncalls++;
}
void fake_reset(void) { fake_ncalls = fake_calls64 = fake_calls128 = fake_tpc_rc = 0; fake_tpc_dev = -1; }
#if HAVE_EXT
void libsmctrl_set_stream_mask_ext(void *s, u128 m) {
    fake_calls128++; record(s, (uint64_t)m, (uint64_t)(m >> 64));
}
#endif
void libsmctrl_set_stream_mask(void *s, uint64_t m) { fake_calls64++; record(s, m, 0); }
#if HAVE_TPC_CUDA
int libsmctrl_get_tpc_info_cuda(uint32_t *n, int dev) {
    fake_tpc_dev = dev; if (fake_tpc_rc) return fake_tpc_rc; *n = fake_tpcs; return 0;
}
#else
int libsmctrl_get_tpc_info(uint32_t *n, int dev) {
    fake_tpc_dev = 1000 + dev; if (fake_tpc_rc) return fake_tpc_rc; *n = fake_tpcs; return 0;
}
#endif
"""

NOT_LIBSMCTRL = "int something_else(void) { return 0; }\n"

FAKE_LIBCUDA = r"""
#include <string.h>
typedef int CUresult;
typedef int CUdevice;
/* CUDA 13's layout; 12.x ends in _oversize[48] without the pointer. Both are 144 bytes with
 * smCount at offset 96, which is all the wrapper reads. */
typedef struct { unsigned smCount, minSmPartitionSize, smCoscheduledAlignment, flags; } CUdevSmResource;
typedef struct CUdevResource_st {
    int type;
    unsigned char _internal_padding[92];
    union { CUdevSmResource sm; unsigned char _oversize[40]; };
    struct CUdevResource_st *nextResource;
} CUdevResource;
#define MAXN 32
int fake_version = 12080, fake_sms = 132, fake_sizeof_resource = sizeof(CUdevResource);
int fake_nctx, fake_ctx_first[MAXN], fake_ctx_count[MAXN], fake_ctx_destroyed, fake_streams_destroyed;
static int desc_first[MAXN], desc_count[MAXN], ndesc;
static char ctxs[MAXN], streams[MAXN];

void fake_reset(void) {
    fake_version = 12080; fake_sms = 132;
    fake_nctx = fake_ctx_destroyed = fake_streams_destroyed = ndesc = 0;
}

/* The first SM of a resource lives in the driver-private padding, as a real driver's bookkeeping would. */
static int first_of(const CUdevResource *r) { int f; memcpy(&f, r->_internal_padding, sizeof f); return f; }
static void set_first(CUdevResource *r, int f) { memcpy(r->_internal_padding, &f, sizeof f); }

CUresult cuDriverGetVersion(int *v) { *v = fake_version; return 0; }
CUresult cuInit(unsigned flags) { return 0; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) { if (ordinal != 0) return 101; *d = ordinal; return 0; }
CUresult cuGetErrorName(CUresult rc, const char **s) {
    *s = rc == 101 ? "CUDA_ERROR_INVALID_DEVICE" : "CUDA_ERROR_UNKNOWN";
    return 0;
}
CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
    *v = attr == 16 ? fake_sms : attr == 75 ? 9 : 0;
    return 0;
}
CUresult cuDeviceGetDevResource(CUdevice d, CUdevResource *r, int type) {
    memset(r, 0, sizeof *r);
    r->type = type; r->sm.smCount = fake_sms; set_first(r, 0);
    return 0;
}
CUresult cuDevSmResourceSplitByCount(CUdevResource *result, unsigned *nb, const CUdevResource *input,
                                     CUdevResource *remaining, unsigned flags, unsigned minCount) {
    unsigned n = minCount < 8 ? 8 : (minCount + 7) / 8 * 8;  /* Hopper: at least 8, steps of 8 */
    if (*nb < 1 || n > input->sm.smCount) { *nb = 0; return 0; }
    CUdevResource in = *input;
    result[0] = in; result[0].sm.smCount = n;
    *remaining = in; remaining->sm.smCount = in.sm.smCount - n; set_first(remaining, first_of(&in) + n);
    *nb = 1;
    return 0;
}
CUresult cuDevResourceGenerateDesc(void **desc, CUdevResource *res, unsigned n) {
    if (n != 1 || res->type != 1 || ndesc >= MAXN) return 1;
    desc_first[ndesc] = first_of(res); desc_count[ndesc] = res->sm.smCount;
    *desc = &desc_first[ndesc++];
    return 0;
}
CUresult cuGreenCtxCreate(void **ctx, void *desc, CUdevice d, unsigned flags) {
    if (!(flags & 1) || fake_nctx >= MAXN) return 1;  /* CU_GREEN_CTX_DEFAULT_STREAM is required */
    int i = (int *)desc - desc_first;
    fake_ctx_first[fake_nctx] = desc_first[i]; fake_ctx_count[fake_nctx] = desc_count[i];
    *ctx = &ctxs[fake_nctx++];
    return 0;
}
CUresult cuGreenCtxStreamCreate(void **s, void *ctx, unsigned flags, int priority) {
    if (flags != 1) return 1;  /* must be CU_STREAM_NON_BLOCKING */
    *s = &streams[(char *)ctx - ctxs];
    return 0;
}
CUresult cuGreenCtxDestroy(void *ctx) { fake_ctx_destroyed++; return 0; }
CUresult cuStreamDestroy_v2(void *s) { fake_streams_destroyed++; return 0; }
"""


class FakeStream:
    """A CUDA stream as torch shows it: its cudaStream_t as an int, and cross-stream waits (recorded)."""

    def __init__(self, handle: int) -> None:
        self.cuda_stream = handle
        self.waited_on: list[int] = []

    def wait_stream(self, other: "FakeStream") -> None:
        self.waited_on.append(other.cuda_stream)


class FakeCuda:
    """``torch.cuda`` as a worker thread sees it on a real GPU, for the stream calls the partition makes.

    As on a GPU, a thread's current stream is the legacy default stream (handle 0) until a `stream()`
    block makes another current; created streams get non-zero handles. A CPU build of torch cannot
    create streams at all, hence the stand-in.
    """

    def __init__(self) -> None:
        import threading

        self._local = threading.local()
        self.created: list[FakeStream] = []

    def Stream(self, device=None) -> FakeStream:  # noqa: N802 (torch's name)
        s = FakeStream(0x7F00_0000 + 0x100 * (len(self.created) + 1))
        self.created.append(s)
        return s

    def ExternalStream(self, handle: int, device=None) -> FakeStream:  # noqa: N802 (torch's name)
        return FakeStream(handle)

    def current_stream(self, device=None) -> FakeStream:
        return getattr(self._local, "current", None) or FakeStream(0)

    def stream(self, s: FakeStream):
        import contextlib

        @contextlib.contextmanager
        def use():
            before = getattr(self._local, "current", None)
            self._local.current = s
            try:
                yield
            finally:
                self._local.current = before

        return use()
