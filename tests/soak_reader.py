"""Soak-test reader: a separate process that keeps reading a store while it is written.

Usage: ``python soak_reader.py <store> <final-count>``.  Each pass reads
the store's index (its log), then reads in full every listed trajectory it has not read yet
(and three it has, at random) and checks each against :func:`expected_trajectory`.  It
prints ``ready`` after its first pass, and exits 0 after a pass over an index of
``<final-count>`` trajectories, printing
``{"passes": ..., "reads": ..., "states": ...}`` (``states``: distinct index lengths seen);
any error or mismatch exits non-zero with a traceback.
"""

from __future__ import annotations

import json
import random
import sys

import torch
from crash_writer import expected_trajectory

from rbzarr.storage.index.slots import read_store_documents
from rbzarr.storage.io.location import Location
from rbzarr.storage.zarr.layout import ZarrLayout


def main(store: str, final: int) -> None:
    location = Location.from_url(store)
    layout = ZarrLayout(location, handle_cache_size=0)
    rng = random.Random(0)
    seen: set[int] = set()
    passes = reads = 0
    states: set[int] = set()
    while True:
        index = read_store_documents(location).trajectory_index
        ids = [int(i) for i in index["trajectory_id_list"]]
        states.add(len(ids))
        todo = [i for i in ids if i not in seen]
        todo += rng.sample(sorted(seen), min(3, len(seen)))
        for trajectory_id in todo:
            got = layout.read(index["trajectory_index"][str(trajectory_id)]).tensors()
            want = expected_trajectory(trajectory_id).tensors()
            assert list(got) == list(want), (trajectory_id, list(got))
            for key, value in want.items():
                assert torch.equal(got[key], value), (trajectory_id, key)
            seen.add(trajectory_id)
            reads += 1
        passes += 1
        if passes == 1:
            print("ready", flush=True)  # the test starts writing only now
        if len(ids) >= final:
            print(json.dumps({"passes": passes, "reads": reads, "states": len(states)}))
            return


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
