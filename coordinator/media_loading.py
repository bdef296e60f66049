"""Load every media part of a request (all of one modality) into what the encode worker gets, and
count the placeholder tokens each item expands to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from coordinator.api.schema import ImageURLPart, InputAudioPart, VideoPart
from coordinator.audio import load_audio
from coordinator.data_url import decode_base64
from coordinator.media import ImageInput, MediaLimits, load_image
from coordinator.modalities import ProcessorView
from coordinator.protocol.frames import pack_frames
from coordinator.protocol.messages import Modality
from coordinator.video import load_frame_list, load_video_url


@dataclass(frozen=True)
class MediaPayload:
    """One media item as the encode worker gets it."""

    modality: Modality
    data: bytes
    """Encoded image bytes; a video's frames packed (coordinator/protocol/frames.py); or float32 PCM."""
    num_tokens: int
    """Placeholder tokens this item expands to in the prompt."""


@dataclass(frozen=True)
class LoadedMedia:
    media: list[MediaPayload]
    images: list[ImageInput]
    """The image items, validated (for callers that want their sizes)."""


def load_media(parts: list[tuple[str, Any, str]], limits: MediaLimits, view: ProcessorView) -> LoadedMedia:
    """`parts` are (modality, content part, param) in prompt order; raises MediaError (400) on bad media."""
    images = [load_image(p.image_url.url, limits, f"{param}.image_url.url")
              for _, p, param in parts if isinstance(p, ImageURLPart)]
    counts = iter(view.image_tokens([(im.height, im.width) for im in images]))
    image_iter = iter(images)
    media: list[MediaPayload] = []
    for kind, part, param in parts:
        if isinstance(part, ImageURLPart):
            media.append(MediaPayload("image", next(image_iter).data, next(counts)))
        elif isinstance(part, VideoPart):
            video = (load_frame_list(part.video, limits, f"{param}.video") if part.video is not None
                     else load_video_url(part.video_url.url, limits, f"{param}.video_url.url"))
            media.append(MediaPayload("video", pack_frames(video.frames),
                                      view.video_tokens(len(video.frames), video.height, video.width)))
        elif isinstance(part, InputAudioPart):
            where = f"{param}.input_audio.data"
            raw = decode_base64(part.input_audio.data, limits.max_audio_bytes, "audio", "--max-audio-bytes", where)
            clip = load_audio(raw, part.input_audio.format, view.audio_rate,
                              min(limits.max_audio_seconds, view.audio_window_s), limits.min_audio_seconds, where)
            media.append(MediaPayload("audio", clip.pcm, view.audio_tokens(clip.samples)))
    return LoadedMedia(media, images)
