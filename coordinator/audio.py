"""Turn an OpenAI `input_audio` part into mono float32 PCM at the encoder's sampling rate.

The coordinator decodes audio (unlike images, which the encode worker decodes) because the prompt's
audio-token count depends on the clip's length after resampling, and a clip that is too long, too
short or not what its `format` says must be refused with a 4xx before anything is queued.

WAV is parsed here with the standard library and numpy (PCM 8/16/24/32-bit and IEEE float 32/64,
any channel count, down-mixed by averaging). MP3 needs a decoder: the `soundfile` package (libsndfile
>= 1.1 decodes MP3) is used when it is installed; otherwise an mp3 part is refused with that advice.
A clip's length is read from its header (WAV's data chunk size, the MP3's Xing/Info frame count or
bitrate) and a clip over the limit is refused before its samples are decoded.
Resampling is band-limited (FFT), so a 44.1 kHz clip is not aliased into the 16 kHz band.
"""

from __future__ import annotations

import io
import math
import struct
from dataclasses import dataclass

import numpy as np

from coordinator.media import MediaError


@dataclass(frozen=True)
class AudioInput:
    """One validated clip, ready for the encoder."""

    pcm: bytes
    """float32 little-endian mono samples at `rate`."""
    rate: int
    samples: int

    @property
    def seconds(self) -> float:
        return self.samples / self.rate


MAX_ABS_SAMPLE = 4.0
"""Largest |sample| accepted; full scale is 1.0. Float audio legitimately overshoots full scale by a few dB
(MP3 decoding, unclipped float masters), so 1.0 would refuse real clips; 4.0 (+12 dBFS) leaves room for that
and still refuses what is not audio at this scale: int16-scale values written as float (up to 32767), or
finite but huge values (1e30) whose squared STFT magnitudes overflow float32 in the encoder's log-mel (NaN)."""

_WAVE_FORMAT_PCM, _WAVE_FORMAT_FLOAT, _WAVE_FORMAT_EXTENSIBLE = 1, 3, 0xFFFE


def _chunks(data: bytes):
    pos = 12
    while pos + 8 <= len(data):
        cid, size = data[pos : pos + 4], struct.unpack_from("<I", data, pos + 4)[0]
        yield cid, data[pos + 8 : pos + 8 + size], pos + 8 + size > len(data)
        pos += 8 + size + (size & 1)


def check_duration(seconds: float, max_seconds: float, param: str | None) -> None:
    if seconds > max_seconds:
        raise MediaError(f"audio clip is {seconds:.2f} s; the limit is {max_seconds:g} s (the encoder's window, "
                         "or --max-audio-seconds); cut the clip into shorter ones", param)


def check_samples(x: np.ndarray, param: str | None) -> None:
    """Refuse samples the encoder cannot turn into finite features (see MAX_ABS_SAMPLE)."""
    if not np.isfinite(x).all():
        raise MediaError("audio has NaN or infinite samples; send finite samples scaled to [-1, 1]", param)
    peak = float(np.abs(x).max()) if x.size else 0.0
    if peak > MAX_ABS_SAMPLE:
        raise MediaError(f"audio samples reach {peak:.3g}; float samples must lie within +-{MAX_ABS_SAMPLE:g} "
                         "(full scale is 1.0); scale the clip to [-1, 1] (int16-scale values: divide by 32768)",
                         param)


def decode_wav(data: bytes, param: str | None = None, max_seconds: float = math.inf) -> tuple[np.ndarray, int]:
    """(mono float32 samples, sampling rate) of a RIFF/WAVE file; its length is checked against
    `max_seconds` from the header, before any sample is converted."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise MediaError(f"input_audio.format is 'wav' but the data is not a WAV file (it starts with {data[:4]!r}, "
                         "not b'RIFF'); send a RIFF/WAVE file or set format to match the data", param)
    fmt = samples = None
    for cid, body, truncated in _chunks(data):
        if cid == b"fmt " and len(body) >= 16:
            fmt = struct.unpack_from("<HHIIHH", body)
            if fmt[0] == _WAVE_FORMAT_EXTENSIBLE and len(body) >= 26:
                fmt = (struct.unpack_from("<H", body, 24)[0], *fmt[1:])
        elif cid == b"data":
            if truncated:
                raise MediaError("WAV data chunk is truncated (the file is shorter than its header says)", param)
            samples = body
    if fmt is None or samples is None:
        raise MediaError("WAV file has no 'fmt ' or no 'data' chunk; it is truncated or not a WAV file", param)
    code, channels, rate, _, _, bits = fmt
    dtypes = {(_WAVE_FORMAT_PCM, 8): "u1", (_WAVE_FORMAT_PCM, 16): "<i2", (_WAVE_FORMAT_PCM, 32): "<i4",
              (_WAVE_FORMAT_FLOAT, 32): "<f4", (_WAVE_FORMAT_FLOAT, 64): "<f8"}
    if channels < 1 or rate < 1:
        raise MediaError(f"WAV header says {channels} channels at {rate} Hz; it is corrupt", param)
    width = bits // 8 * channels
    usable = len(samples) - len(samples) % max(width, 1)
    check_duration(usable // max(width, 1) / rate, max_seconds, param)
    if (code, bits) == (_WAVE_FORMAT_PCM, 24):
        raw = np.frombuffer(samples[:usable], np.uint8).reshape(-1, 3)
        x = (raw[:, 0].astype(np.int32) | raw[:, 1].astype(np.int32) << 8 | raw[:, 2].astype(np.int8).astype(np.int32) << 16)
        x = x / float(1 << 23)
    elif (code, bits) in dtypes:
        x = np.frombuffer(samples[:usable], dtypes[code, bits]).astype(np.float64)
        if code == _WAVE_FORMAT_FLOAT:  # integer PCM is within [-1, 1] by construction
            check_samples(x, param)
        if code == _WAVE_FORMAT_PCM:
            x = (x - 128) / 128 if bits == 8 else x / float(1 << (bits - 1))
    else:
        raise MediaError(f"WAV encoding {code} with {bits} bits is not supported; send PCM (8/16/24/32-bit) "
                         "or IEEE float (32/64-bit)", param)
    return x.reshape(-1, channels).mean(axis=1).astype(np.float32), rate


def decode_mp3(data: bytes, param: str | None = None, max_seconds: float = math.inf) -> tuple[np.ndarray, int]:
    """(mono float32 samples, sampling rate) of an MP3; its length is checked against `max_seconds` from
    the header (soundfile.info: the Xing/Info frame count, else size / bitrate) before decoding, and at
    most that many samples are decoded in case the header understates the length."""
    try:
        import soundfile
    except ImportError:
        raise MediaError("mp3 audio cannot be decoded on this server (no MP3 decoder installed: "
                         "pip install soundfile); send the clip as wav", param) from None
    try:
        info = soundfile.info(io.BytesIO(data))
        check_duration(info.frames / info.samplerate, max_seconds, param)
        most = -1 if math.isinf(max_seconds) else math.floor(max_seconds * info.samplerate) + 1
        x, rate = soundfile.read(io.BytesIO(data), frames=most, dtype="float32", always_2d=True)
    except MediaError:
        raise
    except Exception as e:
        raise MediaError(f"input_audio.format is 'mp3' but the data could not be decoded as MP3 ({e})", param) from None
    x = x.mean(axis=1).astype(np.float32)
    check_samples(x, param)
    return x, int(rate)


def resample(x: np.ndarray, rate: int, target: int) -> np.ndarray:
    """Band-limited resampling by truncating or zero-padding the spectrum (scipy.signal.resample's method)."""
    if rate == target or len(x) == 0:
        return x.astype(np.float32)
    n = int(round(len(x) * target / rate))
    spectrum = np.fft.rfft(x.astype(np.float64))
    keep = min(len(spectrum), n // 2 + 1)
    out = np.zeros(n // 2 + 1, dtype=complex)
    out[:keep] = spectrum[:keep]
    return (np.fft.irfft(out, n) * (n / len(x))).astype(np.float32)


def load_audio(data: bytes, fmt: str, target_rate: int, max_seconds: float, min_seconds: float,
               param: str | None = None) -> AudioInput:
    """Decode, check the length, resample: the clip exactly as the encoder will see it."""
    decode = decode_wav if fmt == "wav" else decode_mp3
    x, rate = decode(data, param, max_seconds)
    seconds = len(x) / rate
    check_duration(seconds, max_seconds, param)  # again: decoding may find more samples than a header said
    if seconds < min_seconds:
        raise MediaError(f"audio clip is {seconds:.3f} s; it must be at least {min_seconds:g} s", param)
    y = resample(x, rate, target_rate)
    return AudioInput(pcm=y.astype("<f4").tobytes(), rate=target_rate, samples=len(y))
