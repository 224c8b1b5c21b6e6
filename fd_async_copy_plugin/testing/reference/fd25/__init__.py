"""Replica of FastDeploy 2.5 (branch ``r3_fix_int32_bug_2.5``: #6176, #6259, #6362 merged) at the
plugin's patch points; smaller than the 2.4 replica (V1 scheduler only, no KSM, no warm-up).

Module paths mirror ``fastdeploy``. Pieces that are identical in 2.4 and 2.5 and are not patch
points (config dataclasses, ``Request``, ``platforms``, ``StreamTransferData``) are re-exported
from the 2.4 replica; every class or function at a patch point is this root's own.
"""

__version__ = "2.5.0"
