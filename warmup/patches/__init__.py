"""SGLang 0.5.22's DeepSeek-V4.1 prefill-graph fixes (PR #44627) applied at launch: detect,
apply, verify and report, one module per fix.

``activate()`` arms the fixes in the calling process: targets already imported are patched at
once, the others right after their first import (a ``sys.meta_path`` post-import hook), so a
process that never loads the DeepSeek-V4 backend never imports it.  ``status()`` returns one
row per fix for this process.  Nothing here raises into SGLang.
"""

from __future__ import annotations

from warmup.patches.registry import activate, inspect_installed, revert, status
from warmup.patches.status import VERDICTS, Detection, FixStatus

__all__ = ["activate", "status", "inspect_installed", "revert", "FixStatus", "Detection",
           "VERDICTS"]
