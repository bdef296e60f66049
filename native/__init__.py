"""Thin typed wrappers over native GPU libraries (libsmctrl); each loads lazily and says why it can't."""
