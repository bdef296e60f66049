import pytest
import torch

from transport.wire import TensorDescriptor, WireError, describe, rebuild, tensor_bytes

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.uint8]


def _sample(dtype: torch.dtype, shape=(3, 5)) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(0, 250, shape, generator=g).to(dtype)


def _through_json(desc: TensorDescriptor) -> TensorDescriptor:
    return TensorDescriptor.model_validate_json(desc.model_dump_json())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_is_bit_exact_for_every_dtype(dtype):
    t = _sample(dtype)
    desc, raw = describe("r1", "x", t)
    back = rebuild(_through_json(desc), bytes(raw))
    assert back.dtype == dtype and back.shape == t.shape
    # compare bits, not values, so bfloat16/float16 rounding or NaN cannot hide a difference
    assert bytes(tensor_bytes(back)) == bytes(tensor_bytes(t))
    assert desc.nbytes == t.numel() * t.element_size()


@pytest.mark.parametrize("shape", [(0,), (0, 4), (2, 0, 3)])
def test_zero_size_tensors(shape):
    t = torch.empty(shape, dtype=torch.bfloat16)
    desc, raw = describe("r1", "empty", t)
    assert desc.nbytes == 0
    back = rebuild(desc, bytes(raw))
    assert back.shape == torch.Size(shape) and back.dtype == torch.bfloat16


def test_non_contiguous_tensors_travel_as_their_values():
    base = torch.arange(60, dtype=torch.float32).reshape(6, 10)
    for t in (base.t(), base[:, ::3], base[1:5, 2:7]):
        assert not t.is_contiguous()
        desc, raw = describe("r1", "view", t)
        back = rebuild(desc, bytes(raw))
        assert back.shape == t.shape and torch.equal(back, t)


def test_checksum_mismatch_raises():
    desc, raw = describe("r1", "x", _sample(torch.float32))
    corrupted = bytearray(raw)
    corrupted[5] ^= 0x01
    with pytest.raises(WireError, match="checksum"):
        rebuild(desc, corrupted)


@pytest.mark.parametrize("delta", [-1, 1])
def test_length_mismatch_raises(delta):
    desc, raw = describe("r1", "x", _sample(torch.int32))
    data = bytes(raw)[:delta] if delta < 0 else bytes(raw) + b"\0"
    with pytest.raises(WireError, match="bytes, descriptor says"):
        rebuild(desc, data)


def test_unsupported_dtype_is_refused():
    with pytest.raises(ValueError, match="cannot cross the wire"):
        describe("r1", "x", torch.zeros(3, dtype=torch.complex64))


def test_scalar_tensor_round_trip():
    desc, raw = describe("r1", "scalar", torch.tensor(2.5))
    assert rebuild(desc, bytes(raw)).item() == 2.5


@pytest.mark.parametrize("shape,nbytes,needle", [
    ((-1, 4), 16, "negative dimension"), ((2, 4), 16, "32 bytes"), ((0, 2**63), 0, "too large"),
    ((0, 2**40, 2**40), 0, "too large"),
])
def test_descriptor_must_agree_with_its_shape(shape, nbytes, needle):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=needle):
        TensorDescriptor(request_id="r", name="x", dtype="float32", shape=shape, nbytes=nbytes, checksum=0)


def test_rebuild_views_writable_memory_without_copy():
    desc, raw = describe("r1", "x", torch.arange(6, dtype=torch.float32))
    buf = bytearray(raw)
    out = rebuild(desc, memoryview(buf))
    buf[:4] = bytes(4)  # zero the first float in place: the tensor sees it, so no copy was made
    assert out[0].item() == 0.0 and out[1].item() == 1.0
