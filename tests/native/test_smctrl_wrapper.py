"""The libsmctrl shim and its Python wrapper, on a CPU: builds, error messages, and the mask words it passes.

The real libsmctrl only works against an NVIDIA driver and GPU, which a CPU machine cannot provide,
so the word-passing tests load a stand-in libsmctrl (conftest.FAKE_LIBSMCTRL) that records each
call's stream and 64/128-bit mask. That checks our half of the boundary (split -> mask -> words ->
ctypes -> C shim -> libsmctrl symbol); whether the real library then confines kernels to those TPCs
is for benchmarks/gpu/smpartition.py.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import pytest
from native_fakes import NOT_LIBSMCTRL, libcuda_loads

from coordinator.policies.sm_partition import SMPartition, SMPartitionConfig, TPCSplit
from native import cbuild, envs
from native.smctrl import SHIM_SOURCE, SMControlError, SMController, load_shim, probe
from native.tpc_mask import masks_for, to_words

ERRLEN = 512
ENC, PRE = 0x7F00_1000, 0x7F00_2000
"""Stand-in stream handles: the fake only records them, nothing dereferences them."""


def _calls(fake: Path) -> list[tuple[int, int, int]]:
    """(stream, low64, high64) of every mask call the fake has seen since fake_reset()."""
    lib = ctypes.CDLL(str(fake))
    n = ctypes.c_int.in_dll(lib, "fake_ncalls").value
    streams = (ctypes.c_void_p * 16).in_dll(lib, "fake_streams")
    los = (ctypes.c_uint64 * 16).in_dll(lib, "fake_los")
    his = (ctypes.c_uint64 * 16).in_dll(lib, "fake_his")
    return [(streams[i] or 0, los[i], his[i]) for i in range(n)]


def _counter(fake: Path, name: str) -> ctypes.c_int:
    return ctypes.c_int.in_dll(ctypes.CDLL(str(fake)), name)


def _controller(fake: Path, shim_cache: Path) -> SMController:
    ctypes.CDLL(str(fake)).fake_reset()
    ctl = SMController(fake, cache_dir=shim_cache, check_driver=False)
    assert ctl.available().ok, ctl.available().reason
    return ctl


# --- the shim itself -----------------------------------------------------------------------------

def test_shim_compiles_once_and_is_reused(shim_cache):
    first = cbuild.build_shared(SHIM_SOURCE, shim_cache, libs=("-ldl",))
    assert first.is_file() and first.parent == shim_cache
    assert cbuild.build_shared(SHIM_SOURCE, shim_cache, libs=("-ldl",)) == first
    shim = load_shim(shim_cache)
    for name in ("ts_smctrl_open", "ts_smctrl_num_tpcs", "ts_smctrl_set_stream_mask", "ts_smctrl_has_ext"):
        assert hasattr(shim, name)


def test_shim_builds_into_the_env_cache_dir(tmp_path, monkeypatch, shim_cache):
    monkeypatch.setenv("TIERSERVE_NATIVE_CACHE", str(tmp_path / "c"))
    assert envs.native_cache_dir() == tmp_path / "c"
    assert load_shim()._name.startswith(str(tmp_path / "c"))


def test_open_missing_path_says_why(shim_cache):
    shim = load_shim(shim_cache)
    err = ctypes.create_string_buffer(ERRLEN)
    rc = shim.ts_smctrl_open(b"/nonexistent/libsmctrl.so", err, ERRLEN)
    assert rc != 0
    assert "dlopen(/nonexistent/libsmctrl.so) failed" in err.value.decode()
    assert "No such file" in err.value.decode()


def test_open_a_library_that_is_not_libsmctrl(shim_cache, compile_c):
    other = compile_c("not_libsmctrl", NOT_LIBSMCTRL)
    shim = load_shim(shim_cache)
    err = ctypes.create_string_buffer(ERRLEN)
    assert shim.ts_smctrl_open(str(other).encode(), err, ERRLEN) != 0
    assert "is it libsmctrl?" in err.value.decode()


def test_calls_before_open_and_null_stream(shim_cache, fake_libsmctrl):
    shim = load_shim(shim_cache)
    shim.ts_smctrl_close()
    err = ctypes.create_string_buffer(ERRLEN)
    assert shim.ts_smctrl_set_stream_mask(ctypes.c_void_p(ENC), 0, 0, err, ERRLEN) != 0
    assert "not open" in err.value.decode()
    assert shim.ts_smctrl_has_ext() == -1
    ctl = _controller(fake_libsmctrl(), shim_cache)
    with pytest.raises(SMControlError, match="stream is NULL"):
        ctl.apply(0, 0xF0, 8)


# --- words for splits ----------------------------------------------------------------------------

@pytest.mark.parametrize("split, total, encoder_words, prefill_words", [
    (TPCSplit(4, 4, "static"), 8, (0xF0, 0), (0x0F, 0)),
    (TPCSplit(3, 5, "dynamic"), 8, (0xF8, 0), (0x07, 0)),
    (TPCSplit(32, 32, "static"), 64, (0xFFFF_FFFF_0000_0000, 0), (0x0000_0000_FFFF_FFFF, 0)),
    # H100/H200: 66 TPCs, so the masks need the 128-bit call and a second word.
    (TPCSplit(33, 33, "static"), 66, (0xFFFF_FFFE_0000_0000, 0b11), (0x0000_0001_FFFF_FFFF, 0)),
    (TPCSplit(65, 1, "dynamic"), 66, (0, 0b10), ((1 << 64) - 1, 0b01)),
    (TPCSplit(64, 64, "static"), 128, (0, (1 << 64) - 1), ((1 << 64) - 1, 0)),
    (TPCSplit(66, 66, "none"), 66, (0, 0), (0, 0)),
])
def test_split_reaches_libsmctrl_as_the_right_words(shim_cache, fake_libsmctrl, split, total,
                                                    encoder_words, prefill_words):
    fake = fake_libsmctrl(ext=True)
    ctl = _controller(fake, shim_cache)
    ctl.apply_split(split, total, ENC, PRE)
    assert _calls(fake) == [(ENC, *encoder_words), (PRE, *prefill_words)]
    assert _counter(fake, "fake_calls128").value == 2 and _counter(fake, "fake_calls64").value == 0


@pytest.mark.parametrize("total", [8, 29, 64, 66, 128])
@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_policy_splits_arrive_intact(shim_cache, fake_libsmctrl, total, mode):
    fake = fake_libsmctrl(ext=True)
    ctl = _controller(fake, shim_cache)
    policy = SMPartition(total, SMPartitionConfig(mode=mode))
    for tokens, backlog in ((576, 100), (576, 10**5), (5000, 3000)):
        ctypes.CDLL(str(fake)).fake_reset()
        split = policy.split(1, tokens, backlog)
        ctl.apply_split(split, total, ENC, PRE)
        enc, pre = masks_for(split, total)
        got = _calls(fake)
        assert got == [(ENC, *to_words(enc, total)), (PRE, *to_words(pre, total))]
        # Reassembled, the two masks enable disjoint TPC sets that cover the GPU.
        every = (1 << total) - 1
        enc_on, pre_on = (~(lo | hi << 64) & every for _, lo, hi in got)
        assert enc_on & pre_on == 0 and enc_on | pre_on == every


def test_a_side_with_no_tpcs_is_left_alone(shim_cache, fake_libsmctrl):
    fake = fake_libsmctrl()
    ctl = _controller(fake, shim_cache)
    ctl.apply_split(TPCSplit(8, 0, "dynamic"), 8, ENC, PRE)
    assert _calls(fake) == [(ENC, 0, 0)]


def test_64_bit_only_libsmctrl(shim_cache, fake_libsmctrl):
    fake = fake_libsmctrl(ext=False)
    ctl = _controller(fake, shim_cache)
    assert not ctl.has_ext and "without the 128-bit _ext API" in ctl.available().reason
    ctl.apply_split(TPCSplit(4, 4, "static"), 8, ENC, PRE)
    assert _calls(fake) == [(ENC, 0xF0, 0), (PRE, 0x0F, 0)]
    assert _counter(fake, "fake_calls64").value == 2
    with pytest.raises(SMControlError, match="total_tpcs=66 .* no libsmctrl_set_stream_mask_ext"):
        ctl.apply(ENC, 0, 66)
    err = ctypes.create_string_buffer(ERRLEN)
    assert load_shim(shim_cache).ts_smctrl_set_stream_mask(ctypes.c_void_p(ENC), 0, 1, err, ERRLEN) != 0
    assert "TPCs >= 64" in err.value.decode()


def test_bad_masks_never_reach_the_library(shim_cache, fake_libsmctrl):
    fake = fake_libsmctrl()
    ctl = _controller(fake, shim_cache)
    with pytest.raises(ValueError, match="0x1ff"):
        ctl.apply(ENC, 0x1FF, 8)
    assert _calls(fake) == []


# --- TPC counts ----------------------------------------------------------------------------------

def test_num_tpcs_by_cuda_device(shim_cache, fake_libsmctrl):
    fake = fake_libsmctrl(tpc_cuda=True)
    ctl = _controller(fake, shim_cache)
    assert ctl.num_tpcs(1) == 66
    assert _counter(fake, "fake_tpc_dev").value == 1
    _counter(fake, "fake_tpc_rc").value = 19  # ENODEV
    with pytest.raises(SMControlError, match=r"libsmctrl_get_tpc_info_cuda\(device=0\) returned 19 \(No such device\)"):
        ctl.num_tpcs(0)


def test_num_tpcs_falls_back_to_the_nvdebug_call(shim_cache, fake_libsmctrl):
    fake = fake_libsmctrl(tpc_cuda=False)
    ctl = _controller(fake, shim_cache)
    assert ctl.num_tpcs(0) == 66
    assert _counter(fake, "fake_tpc_dev").value == 1000


# --- availability on this machine ------------------------------------------------------------------

def test_reports_missing_driver_first():
    if libcuda_loads():
        pytest.skip("this machine has a CUDA driver; the no-driver reason cannot be observed")
    state = SMController().available()
    assert not state.ok
    assert state.reason.startswith("unsupported: no CUDA driver (libcuda)")
    assert probe() == state


def test_reports_libsmctrl_not_found(monkeypatch):
    monkeypatch.delenv("TIERSERVE_LIBSMCTRL", raising=False)
    monkeypatch.setattr("ctypes.util.find_library", lambda name: None)
    state = SMController(check_driver=False).available()
    assert not state.ok
    assert state.reason == ("unsupported: libsmctrl not found; build it (native/README.md) and set "
                            "TIERSERVE_LIBSMCTRL to the libsmctrl.so")
    monkeypatch.setenv("TIERSERVE_LIBSMCTRL", "/opt/none/libsmctrl.so")
    assert "libsmctrl not found at /opt/none/libsmctrl.so" in SMController(check_driver=False).available().reason
    with pytest.raises(SMControlError, match="SM partitioning is unavailable: unsupported: libsmctrl not found"):
        SMController(check_driver=False).apply(ENC, 0, 8)


def test_env_var_names_the_library(monkeypatch, shim_cache, fake_libsmctrl):
    fake = fake_libsmctrl()
    monkeypatch.setenv("TIERSERVE_LIBSMCTRL", str(fake))
    state = SMController(cache_dir=shim_cache, check_driver=False).available()
    assert state == (state.__class__(True, f"libsmctrl loaded from {fake} (with the 128-bit _ext API)"))


def test_reports_gcc_missing(monkeypatch, tmp_path, fake_libsmctrl):
    fake = fake_libsmctrl()
    monkeypatch.setattr(cbuild, "find_compiler", lambda: None)
    state = SMController(fake, cache_dir=tmp_path / "empty", check_driver=False).available()
    assert not state.ok and state.reason.startswith("unsupported: gcc missing")


def test_reports_a_load_failure(shim_cache, compile_c):
    other = compile_c("not_libsmctrl", NOT_LIBSMCTRL)
    state = SMController(other, cache_dir=shim_cache, check_driver=False).available()
    assert not state.ok
    assert "unsupported: libsmctrl failed to load" in state.reason and "is it libsmctrl?" in state.reason


def test_import_builds_and_loads_nothing(tmp_path):
    cache = tmp_path / "cache"
    code = "import native.smctrl, native.green_context, native.cbuild"
    env = {"TIERSERVE_NATIVE_CACHE": str(cache), "TIERSERVE_LIBSMCTRL": "/nonexistent.so", "PATH": ""}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=Path(__file__).parents[2],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert not cache.exists()
