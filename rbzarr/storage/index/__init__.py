"""The index of a store and its writers: one home for "many writers, one store".

- :mod:`~rbzarr.storage.index.log`: a writer slot's index as an append-only log of commit
  records, compacted into blocks (``IndexLog``; what a commit writes, what a reader reads);
- :mod:`~rbzarr.storage.index.slots`: where each slot keeps its index, and the union readers
  see (``read_store_documents``, ``read_store_window``);
- :mod:`~rbzarr.storage.index.claims`: exclusive claims of slots (``SlotClaim``);
- :mod:`~rbzarr.storage.index.writer_slot`: the slot a buffer writes (``WriterSlot``);
- :mod:`~rbzarr.storage.index.trajectory_index`: the ids and entries a reader samples from
  (``TrajectoryIndex``);
- :mod:`~rbzarr.storage.index.schema`: the schema and format marker ``metadata.json`` records;
- :mod:`~rbzarr.storage.index.pins`: which trajectories checkpoint manifests hold (``StorePins``).
"""

__all__: list[str] = []
