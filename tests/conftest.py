"""Shared test setup. TRITON_INTERPRET must be set before any @triton.jit runs."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("PYTHONUNBUFFERED", "1")
