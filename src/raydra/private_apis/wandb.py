"""W&B's private API (raydra.private_apis says why such a module exists)."""

from typing import Any, Iterator

# A run's `.wandb` file (its transaction log, offline or online: what `wandb sync` uploads) is a
# LevelDB log of `wandb.proto.wandb_internal_pb2.Record`s behind a 7-byte header. wandb 0.29 read it
# with wandb.sdk.internal.datastore, which 0.31 no longer ships; no public reader exists. The layout
# (wandb 0.29's datastore.py, LevelDB's doc/log_format.md): 32 KiB blocks of chunks, each chunk
# a 7-byte header (CRC-32 of its type and data, data length, type: full, first, middle, last); a
# block's tail shorter than a header is zero padding.
WANDB_FILE_HEADER = b":W&B\xe1\xbe\x00"  # ident ":W&B", magic 0xBEE1 (little-endian), version 0


WANDB_BLOCK = 32768


WANDB_CHUNK_HEADER = 7


WANDB_FULL, WANDB_FIRST, WANDB_MIDDLE, WANDB_LAST = 1, 2, 3, 4


def wandb_records(path: Any) -> Iterator[Any]:
    """Every whole record of a `.wandb` file, in order, as W&B's protobuf Record. A file its writer
    never finished (a process killed mid-write) ends at its last whole record: what W&B holds."""
    import struct
    import zlib

    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as file:
        data = file.read()
    if not data.startswith(WANDB_FILE_HEADER):
        return
    offset, pieces = len(WANDB_FILE_HEADER), []
    while True:
        left_in_block = WANDB_BLOCK - offset % WANDB_BLOCK
        if left_in_block < WANDB_CHUNK_HEADER:
            offset += left_in_block
        if offset + WANDB_CHUNK_HEADER > len(data):
            return
        checksum, length, kind = struct.unpack_from("<IHB", data, offset)
        chunk = data[offset + WANDB_CHUNK_HEADER : offset + WANDB_CHUNK_HEADER + length]
        if len(chunk) < length or kind not in (WANDB_FULL, WANDB_FIRST, WANDB_MIDDLE, WANDB_LAST):
            return
        if zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != checksum:
            return  # a chunk its writer did not finish: nothing after it was written whole
        offset += WANDB_CHUNK_HEADER + length
        if kind in (WANDB_FULL, WANDB_FIRST):
            pieces = [chunk]
        else:
            pieces.append(chunk)
        if kind in (WANDB_FULL, WANDB_LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(pieces))
            yield record
