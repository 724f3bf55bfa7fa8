"""cache_tools: persist, verify, relocate and share the JIT caches SGLang uses.

Standard library only at import time (it runs in slim image stages); torch, Triton, SGLang,
redis and zstandard are imported lazily by the functions that need them.  The modules:
locations (cache kinds and directories), fingerprint (toolchain identity), scan (inventory),
manifest / tarfmt / reader / writer / groups / archive / restore / staging (pack, verify,
restore, merge), prune, remote (Redis), cli.
"""
