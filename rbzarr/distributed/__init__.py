"""Beyond one machine: commit notices between writers and learners, and a Ray integration.

The store is the transport: writers append to one shared store (see
:mod:`rbzarr.storage.index.slots`) and send only a :class:`CommitNotice` per trajectory; a
learner's buffer adds it by reference (``TrajectoryReplayBuffer.add_committed``).  The Ray
parts (:mod:`rbzarr.distributed.ray_actor`, :mod:`rbzarr.distributed.ray_datasource`) need
the ``ray`` extra.
"""

from rbzarr.distributed.notices import CommitNotice, commit_notices

__all__ = ["CommitNotice", "commit_notices"]
