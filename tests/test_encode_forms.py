"""What arrays of one schema store alike is made once per schema and never mixes schemas."""

from __future__ import annotations

import json

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rbzarr.storage.zarr.chunking import plan_key
from rbzarr.storage.zarr.codecs import parse_codecs
from rbzarr.storage.zarr.encode import encode_array
from rbzarr.storage.zarr.sharded import encode_trajectory

schemas = st.tuples(
    st.sampled_from(["raw", "zstd"]),
    st.sampled_from([np.uint8, np.float32, np.int64]),
    st.integers(1, 5),  # T
    st.integers(1, 4),  # B
    st.sampled_from([(), (3,), (2, 5)]),
)


@settings(max_examples=40, deadline=None)
@given(st.lists(schemas, min_size=2, max_size=6), st.data())
def test_each_array_gets_its_own_schemas_document_and_description(
    cases: list[tuple[str, type, int, int, tuple[int, ...]]], data: st.DataObject
) -> None:
    """Arrays of several schemas encoded in turn (the same key, each schema twice): each
    one's document and description name its own shape, dtype, codec and time/env sizes,
    and the second array of a schema reads exactly as the first."""
    order = data.draw(st.permutations(list(range(len(cases))) * 2))
    first: dict[int, tuple[bytes, dict]] = {}
    plans = {}
    for case in range(len(cases)):
        spec, dtype, T, B, trailing = cases[case]
        shape = (T, B, *trailing)
        plans[case] = plan_key(shape, np.dtype(dtype), parse_codecs({"k": spec}), "k")
    for case in order:
        spec, dtype, T, B, trailing = cases[case]
        shape = (T, B, *trailing)
        values = (np.arange(int(np.prod(shape))) % 50).astype(dtype).reshape(shape)
        encoded = encode_array("k", torch.from_numpy(values), plans[case], T, B)
        document = json.loads(encoded.document)
        assert document["shape"] == list(shape)
        assert document["dimension_names"][:2] == ["time", "env"]
        assert document["attributes"]["torch_dtype"] == str(torch.from_numpy(values).dtype)[6:]
        description = encoded.description
        assert description["shape"] == list(shape)
        assert description["dtype"] == np.dtype(dtype).newbyteorder("<").str
        assert description["kind"] == plans[case].kind
        assert description["shard_bytes"] == sum(memoryview(p).nbytes for p in encoded.shard)
        if case in first:
            assert (encoded.document, description) == first[case]
        else:
            first[case] = (encoded.document, description)


def test_a_copy_is_encoded_from_its_numpy_array() -> None:
    """The writer encodes a staged copy from the numpy array it was copied into (no torch
    call to reach its memory): the shard holds that array's bytes."""
    values = torch.arange(24, dtype=torch.float32).reshape(4, 2, 3)
    plans = {"rewards": plan_key((4, 2, 3), np.dtype(np.float32), parse_codecs({}), "rewards")}
    copy = values.numpy() + 1  # the array a copy was made into, told apart by its values
    files, _, _ = encode_trajectory(
        {"rewards": values}, plans, 4, 2, ".", False, None, {"rewards": copy}
    )
    (shard,) = files.values()
    assert b"".join(bytes(part) for part in shard)[: copy.nbytes] == copy.tobytes()
    files, _, _ = encode_trajectory({"rewards": values}, plans, 4, 2, ".", False)
    (shard,) = files.values()
    assert b"".join(bytes(part) for part in shard)[: values.numel() * 4] == values.numpy().tobytes()
