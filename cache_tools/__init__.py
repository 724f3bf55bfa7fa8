"""cache_tools: persist, verify, relocate and share the JIT caches SGLang uses.

Standard library only at import time (it runs in slim image stages); torch, Triton, SGLang,
redis and zstandard are imported lazily by the functions that need them.  The parts:
locations (cache kinds and directories), fingerprint (toolchain identity), scan (inventory),
prune, compile_log, ``archive/`` (the format, pack, verify, restore, merge), ``stores/``
(Redis, OCI registries), ``replay/`` (Triton entries rebuilt on a CPU machine).
"""
