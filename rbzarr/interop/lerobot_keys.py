"""How LeRobot v3 features map to rbzarr's flat trajectory keys, and back.

==========================  ===================================================
LeRobot feature             rbzarr key
==========================  ===================================================
``observation.<name>``      ``curr_obs/<name>`` (and ``next_obs/<name>``, shifted)
``action``                  ``actions``
``next.reward``             ``rewards`` (zeros when the dataset has none)
``next.done``               ``terminations`` (``dones`` = it or the episode's end)
``timestamp``, ``task_index``, any other feature
                            ``forward_inputs/<feature>``
``frame_index``, ``episode_index``, ``index``
                            checked on import, recomputed on export
==========================  ===================================================
"""

from __future__ import annotations

__all__ = [
    "CODEBASE_VERSION",
    "RECOMPUTED",
    "feature_name",
    "flat_key",
]

CODEBASE_VERSION = "v3.0"
# Per-frame columns that follow from an episode's position; checked on import.
RECOMPUTED = ("frame_index", "episode_index", "index")

_NAMED = {"action": "actions", "next.reward": "rewards", "next.done": "terminations"}
_OBSERVATION = "observation."


def flat_key(feature: str) -> str | None:
    """The flat trajectory key of a LeRobot feature; ``None`` for recomputed columns."""
    if feature in RECOMPUTED:
        return None
    if feature in _NAMED:
        return _NAMED[feature]
    if feature.startswith(_OBSERVATION):
        return "curr_obs/" + feature.removeprefix(_OBSERVATION)
    return "forward_inputs/" + feature


def feature_name(key: str) -> str | None:
    """The LeRobot feature of a flat key; ``None`` for keys with no LeRobot counterpart."""
    for feature, named in _NAMED.items():
        if key == named:
            return feature
    if key.startswith("curr_obs/") and key.count("/") == 1:
        return _OBSERVATION + key.removeprefix("curr_obs/")
    if key.startswith("forward_inputs/") and key.count("/") == 1:
        return key.removeprefix("forward_inputs/")
    return None
