"""The coordinator's OpenAI-compatible HTTP surface: wire schema here, routes beside it."""
