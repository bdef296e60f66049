"""The contracts every process shares: messages, Redis keys, the model card, log format."""
