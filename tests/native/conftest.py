"""Factories for native/ tests: a private shim cache, and stand-in C libraries compiled per test session.

The stand-ins (native_fakes.py) replace libraries that only work on an NVIDIA GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from native_fakes import FAKE_LIBCUDA, FAKE_LIBSMCTRL

from native.cbuild import build_shared, find_compiler


@pytest.fixture(scope="session")
def shim_cache(tmp_path_factory) -> Path:
    """A private cache for the compiled shim, so tests never touch ~/.cache."""
    if find_compiler() is None:
        pytest.skip("gcc (or cc) is not on PATH: the shim and the stand-in libraries cannot be compiled")
    return tmp_path_factory.mktemp("native-cache")


@pytest.fixture(scope="session")
def compile_c(tmp_path_factory, shim_cache) -> Callable[[str, str], Path]:
    """compile_c(name, source) -> path of a shared object built from `source` (cached by content)."""
    src_dir = tmp_path_factory.mktemp("fake-src")

    def compile_(name: str, source: str) -> Path:
        src = src_dir / f"{name}.c"
        src.write_text(source)
        return build_shared(src, shim_cache)

    return compile_


@pytest.fixture(scope="session")
def fake_libsmctrl(compile_c) -> Callable[..., Path]:
    """fake_libsmctrl(ext=True, tpc_cuda=True): a stand-in libsmctrl of that API generation."""

    def make(ext: bool = True, tpc_cuda: bool = True) -> Path:
        head = f"#define HAVE_EXT {int(ext)}\n#define HAVE_TPC_CUDA {int(tpc_cuda)}\n"
        return compile_c(f"fake_libsmctrl_ext{int(ext)}_cuda{int(tpc_cuda)}", head + FAKE_LIBSMCTRL)

    return make


@pytest.fixture(scope="session")
def fake_libcuda(compile_c) -> Path:
    """A stand-in libcuda with just the green-context calls (132 SMs, Hopper rounding, driver 12.8)."""
    return compile_c("fake_libcuda", FAKE_LIBCUDA)
