"""Sampling from a store: one reader (:class:`StoreReader`) and its samplers.

The samplers (:class:`WindowSampler`, :class:`SequenceSampler`) draw window positions and
rows and do no I/O; the reader plans where each drawn row is read from (memory or the
store), reads it and handles damaged trajectories.  The buffer and the read-only view both
sample through a reader.
"""

from rbzarr.sampling.reader import StoreReader
from rbzarr.sampling.sampler import Sampler
from rbzarr.sampling.sequences import SequenceSampler
from rbzarr.sampling.window import WindowSampler

__all__ = ["Sampler", "SequenceSampler", "StoreReader", "WindowSampler"]
