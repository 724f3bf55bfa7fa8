"""A fake ``sglang`` package for the prebake tests: only ``python -m sglang.launch_server``."""
