"""Image bombs: small streams whose headers claim huge frames, and stores that hold one.

:func:`bomb` is a ``BOMB_SIDE`` x ``BOMB_SIDE`` black frame (432 MB decoded at 3 channels)
in one image codec's stream: 0.4 MB of PNG, 2.3 MB of QOI or JPEG, 30 KB of JPEG-XL.
:func:`write_image_store` writes a zarr store of one trajectory ``[1, 1]`` whose
``curr_obs/image`` holds one small frame; :func:`plant_bomb` replaces that frame's inner
chunk by a bomb and edits the shard size the trajectory's attributes record, as a hostile
author can.
"""

from __future__ import annotations

import functools
import json
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
from conftest import make_trajectory
from hostile_stores import proc_status, reset_peak

# A bomb's side: 12000 x 12000 x 3 decodes to 432 MB.
BOMB_SIDE = 12000
# The small frames the stores hold (what each array declares).
FRAME_SIDE = 32
KEY = "curr_obs/image"
# The stream each image codec name rbzarr writes decodes with.
STREAMS = {
    "qoi": "qoi",
    "png": "png",
    "jpeg": "jpeg",
    "jpegxl": "jpegxl",
    "jpegxl-lossless": "jpegxl",
}


@functools.cache
def bomb(codec: str, channels: int = 3) -> bytes:
    """A black ``BOMB_SIDE``-square frame of ``channels`` in ``codec``'s stream."""
    import imagecodecs  # noqa: PLC0415

    stream = STREAMS[codec]
    if stream == "png":
        return png_of_zeros(BOMB_SIDE, BOMB_SIDE, channels)
    shape = (BOMB_SIDE, BOMB_SIDE, channels) if channels > 1 else (BOMB_SIDE, BOMB_SIDE)
    frame = np.zeros(shape, np.uint8)  # zero pages: the encoders read them, none resident
    if stream == "qoi":
        return bytes(imagecodecs.qoi_encode(frame))
    if stream == "jpeg":
        return bytes(imagecodecs.jpeg8_encode(frame, level=50, subsampling="420"))
    return bytes(imagecodecs.jpegxl_encode(frame, lossless=True, effort=1))


def png_of_zeros(height: int, width: int, channels: int) -> bytes:
    """A PNG of a black frame, deflated without building it: its rows (a filter byte and
    zeros) are zeros, deflated as one flushed block repeated."""
    colour = {1: 0, 3: 2, 4: 6}[channels]
    raw = height * (1 + width * channels)
    block = 1 << 20
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    repeated = deflate.compress(bytes(block)) + deflate.flush(zlib.Z_FULL_FLUSH)
    count, rest = divmod(raw, block)
    tail = deflate.compress(bytes(rest)) + deflate.flush()
    adler = ((raw % 65521) << 16) | 1  # adler32 of zeros
    stream = b"\x78\xda" + repeated * count + tail + adler.to_bytes(4, "big")
    header = struct.pack(">IIBBBBB", width, height, 8, colour, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", stream)
        + _chunk(b"IEND", b"")
    )


def _chunk(kind: bytes, data: bytes) -> bytes:
    """One PNG chunk: length, type, data, crc32."""
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def frame(layout: str, channels: int = 3) -> torch.Tensor:
    """The ``[1, 1, ...]`` uint8 image a store holds (``"hwc"`` or ``"chw"``): a gradient."""
    side = torch.arange(FRAME_SIDE, dtype=torch.uint8) * 7
    hwc = (side.reshape(-1, 1, 1) + side.reshape(1, -1, 1)).expand(-1, -1, channels)
    image = hwc.permute(2, 0, 1) if layout == "chw" else hwc
    return image.contiguous().reshape(1, 1, *image.shape)


def write_image_store(path: Path, codec: str, layout: str) -> None:
    """A zarr store of one trajectory ``[1, 1]`` whose ``curr_obs/image`` is one frame
    encoded by ``codec`` (a spec: ``"png"``, ``"jpeg:90"``), laid out as ``layout``."""
    from rbzarr import TrajectoryReplayBuffer  # noqa: PLC0415

    trajectory = make_trajectory(1, 1, 0)
    trajectory.curr_obs["image"] = frame(layout)
    buffer = TrajectoryReplayBuffer(
        auto_save=True,
        auto_save_path=str(path),
        trajectory_format="zarr",
        layout_options={"codecs": {KEY: codec}},
    )
    buffer.add_trajectories([trajectory])
    buffer.close()


def plant_bomb(store: Path, stream: bytes) -> None:
    """Replace trajectory 0's only ``curr_obs/image`` frame by ``stream``, and the shard size
    its group's attributes record by the new one."""
    from rbzarr.storage.zarr.shard_index import encode_index  # noqa: PLC0415

    group = store / "trajectories" / "0"
    shard = next(p for p in (group / KEY).rglob("c*") if p.is_file())
    old = shard.read_bytes()
    (offset, nbytes) = struct.unpack("<QQ", old[-20:-4])
    assert (offset, nbytes) == (0, len(old) - 20), "one inner chunk expected"
    shard.write_bytes(stream + encode_index([0], [len(stream)]))
    document_path = group / "zarr.json"
    document: dict[str, Any] = json.loads(document_path.read_bytes())
    described = document["attributes"]["rbzarr_layout"]["arrays"][KEY]
    described["shard_bytes"] = len(stream) + 20
    document_path.write_text(json.dumps(document))


def spec_of(name: str) -> str:
    """The spec that writes image codec ``name`` (lossy ones at quality 90)."""
    from rbzarr.storage.zarr.codecs import parse_codec  # noqa: PLC0415

    try:
        return parse_codec(name).text
    except ValueError:  # a lossy codec takes its quality
        return parse_codec(f"{name}:90").text


def decode_entry_points(streams: dict[tuple[str, int], bytes], folder: str) -> list[dict[str, Any]]:
    """Every decode entry point of every image codec rbzarr writes, fed its bomb where a
    ``FRAME_SIDE`` frame is declared (run in a capped child): what each raised, and the peak
    resident memory it added.

    The entry points: :meth:`Codec.decode_frame`, the shard reader's decoder
    (:func:`rbzarr.storage.zarr.local.decoder`, which ``sample``, whole reads, ``verify``,
    ``export``, ``stats`` and ``recode`` use) for HWC and CHW frames, and the zarr codec
    class zarr's registry holds for the codec's name (plain ``zarr.open_group``), for both.
    ``streams`` is keyed ``(codec name, channels)``.
    """
    import zarr  # noqa: PLC0415
    from zarr.registry import get_codec_class  # noqa: PLC0415

    from rbzarr.storage.zarr.codecs import parse_codec  # noqa: PLC0415
    from rbzarr.storage.zarr.local import decoder  # noqa: PLC0415
    from rbzarr.storage.zarr.spec import ArraySpec  # noqa: PLC0415

    found = []
    for (name, channels), stream in streams.items():
        codec = parse_codec(spec_of(name))
        hwc = (FRAME_SIDE, FRAME_SIDE, channels)
        calls: dict[str, Any] = {
            "Codec.decode_frame": functools.partial(
                codec.decode_frame, stream, np.empty(hwc, np.uint8)
            )
        }
        for layout in ("hwc", "chw"):
            shape = hwc if layout == "hwc" else (channels, FRAME_SIDE, FRAME_SIDE)
            description = {
                "kind": "image",
                "shape": [1, 1, *shape],
                "dtype": "|u1",
                "inner": [1, 1, *shape],
                "shard_bytes": len(stream) + 20,
                "codec": codec.text,
                "image": layout,
            }
            spec = ArraySpec.parse(KEY, description, "bomb")
            target = np.empty(FRAME_SIDE * FRAME_SIDE * channels, np.uint8)
            read = decoder(spec)
            assert read is not None
            calls[f"local.decoder {layout}"] = functools.partial(read, stream, target)
            chain = [
                get_codec_class(c.to_dict()["name"]).from_dict(c.to_dict())
                for c in codec.shard_codecs(np.dtype(np.uint8), layout)
            ]
            path = f"{folder}/{name}-{channels}-{layout}"
            array = zarr.create_array(
                path,
                shape=(1, 1, *shape),
                chunks=(1, 1, *shape),
                dtype="uint8",
                filters=chain[:-1],
                serializer=chain[-1],
                compressors=None,
            )
            (Path(path) / "c" / "0" / "0" / "0" / "0").mkdir(parents=True)
            (Path(path) / "c" / "0" / "0" / "0" / "0" / "0").write_bytes(stream)
            calls[f"zarr {layout}"] = functools.partial(array.__getitem__, ...)
        for entry, call in calls.items():
            before = reset_peak()
            try:
                call()
                outcome = {"error": "", "message": ""}
            except Exception as exc:
                outcome = {"error": type(exc).__name__, "message": str(exc)[:500]}
            found.append(
                {
                    "codec": name,
                    "channels": channels,
                    "entry": entry,
                    "peak_growth": proc_status("VmHWM") - before,
                    **outcome,
                }
            )
    return found
