"""--dataset JSONL: good files load; each malformed line is refused with its file and line number."""

from __future__ import annotations

import json

import pytest
from media_factory import image_bytes

from benchmarks.bench.dataset import DatasetError, load_dataset, take
from benchmarks.bench.workload import Length


def write(tmp_path, *lines: str):
    p = tmp_path / "trace.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_a_good_file_loads(tmp_path):
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a.png").write_bytes(image_bytes(1))
    (tmp_path / "clip.wav").write_bytes(b"RIFF0000WAVE")
    p = write(tmp_path,
              "# a comment, then a blank line", "",
              json.dumps({"prompt": "What is this?", "images": ["imgs/a.png"], "output_tokens": 12, "timestamp": 0.5}),
              json.dumps({"prompt": "Listen.", "audio": "clip.wav"}),
              json.dumps({"messages": [{"role": "user", "content": "hi"}], "timestamp": 1}))
    specs = load_dataset(p)
    assert len(specs) == 3
    img = specs[0].content[0]["image_url"]["url"]
    assert img.startswith("data:image/png;base64,")  # sent inline, the server needs no access to our disk
    assert specs[0].max_tokens == 12 and specs[0].timestamp == 0.5 and specs[0].meta["modality"] == "image"
    assert specs[1].content[0]["input_audio"]["format"] == "wav" and specs[1].meta["modality"] == "audio"
    assert specs[2].chat_messages() == [{"role": "user", "content": "hi"}]
    five = take(specs, 5, Length(a=7), seed=0)
    assert [s.index for s in five] == list(range(5))
    assert [s.max_tokens for s in five] == [12, 7, 7, 12, 7]  # cycles; --output-tokens where the line gave none


@pytest.mark.parametrize("line,needle", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"images": []}', "exactly one of"),
    ('{"prompt": "a", "messages": [{"role": "user"}]}', "exactly one of"),
    ('{"prompt": 3}', "\"prompt\" must be a string"),
    ('{"prompt": "a", "output_tokens": 0}', "integer >= 1"),
    ('{"prompt": "a", "output_tokens": "9"}', "integer >= 1"),
    ('{"prompt": "a", "timestamp": -1}', "seconds >= 0"),
    ('{"prompt": "a", "images": "x.png"}', "must be a list"),
    ('{"prompt": "a", "images": ["missing.png"]}', "not found"),
    ('{"prompt": "a", "audio": "a.flac"}', ".wav or .mp3"),
    ('{"prompt": "a", "colour": "red"}', "unknown field"),
    ('{"messages": []}', "non-empty list"),
])
def test_malformed_lines_name_file_and_line(tmp_path, line, needle):
    p = write(tmp_path, json.dumps({"prompt": "fine"}), line)
    with pytest.raises(DatasetError, match=needle) as e:
        load_dataset(p)
    assert f"{p}:2:" in str(e.value)


def test_empty_and_missing_files(tmp_path):
    with pytest.raises(DatasetError, match="no requests"):
        load_dataset(write(tmp_path, "# nothing"))
    with pytest.raises(DatasetError, match="no such file"):
        load_dataset(tmp_path / "absent.jsonl")
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(DatasetError, match="not UTF-8"):
        load_dataset(tmp_path / "bin.jsonl")
