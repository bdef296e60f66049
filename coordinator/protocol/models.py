"""Where the embedded default model lives; every node resolves `--model` against it."""

from pathlib import Path

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "assets" / "tiny-llava"
DEFAULT_MODEL_NAME = "tiny-llava"
