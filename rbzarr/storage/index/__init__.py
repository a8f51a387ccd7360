"""The store's catalog: its index, its writers and the records kept beside the data.

- :mod:`~rbzarr.storage.index.store_index`: ``StoreIndex``, the catalog's one entry: one
  probe opens a store (exists, format, metadata, schema, codecs), ``read`` reads the index,
  ``writer`` claims a slot and returns its index writer, ``priorities`` and ``pins`` are the
  records kept beside the data;
- :mod:`~rbzarr.storage.index.writers`: ``IndexWriter``, a slot's commits: ``LogWriter``
  (the log) or ``DocumentsWriter`` (RLinf's documents, pt / pkl);
- :mod:`~rbzarr.storage.index.format_records`: what a layout records of its format in the
  catalog (``FormatRecords``), and the documents written and checked through it;
- :mod:`~rbzarr.storage.index.log`: a writer slot's index as an append-only log of commit
  records, compacted into blocks (``IndexLog``; what a commit writes, what a reader reads);
- :mod:`~rbzarr.storage.index.slots`: where each slot keeps its index (``slot_files``: the
  one choice between the log and the documents, for readers and writers), and the union
  readers see (``read_store_documents``,
  ``read_store_window``);
- :mod:`~rbzarr.storage.index.claims`: exclusive claims of slots (``SlotClaim``);
- :mod:`~rbzarr.storage.index.writer_slot`: the slot a buffer writes (``WriterSlot``);
- :mod:`~rbzarr.storage.index.entry`: one trajectory's index entry, frozen and checked in
  one place (``IndexEntry.parse``);
- :mod:`~rbzarr.storage.index.trajectory_index`: the ids and entries a reader samples from
  (``TrajectoryIndex``);
- :mod:`~rbzarr.storage.index.priorities`: the priority files and their change record;
- :mod:`~rbzarr.storage.index.schema`: the schema and format marker ``metadata.json`` records;
- :mod:`~rbzarr.storage.index.pins`: which trajectories checkpoint manifests hold (``StorePins``).
"""

__all__: list[str] = []
