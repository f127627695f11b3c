#!/usr/bin/env python3
"""Writes the small IDX files (good, corrupt, truncated, foreign) used by test_data_idx.c.

Run from this folder; the output is deterministic (gzip mtime 0, fixed contents), so the
committed files can be regenerated and compared.
"""
import gzip
import struct


def idx(type_code, dims, body):
    return bytes([0, 0, type_code, len(dims)]) + struct.pack(">%dI" % len(dims), *dims) + body


def gz(data):
    return gzip.compress(data, compresslevel=9, mtime=0)


def write(name, data):
    with open(name, "wb") as f:
        f.write(data)


good_pixels = bytes((i * 7 + 3) % 256 for i in range(5 * 3 * 2))
good_images = idx(0x08, [5, 3, 2], good_pixels)
good_labels = idx(0x08, [5], bytes([9, 0, 4, 1, 7]))

write("idx_good_images.gz", gz(good_images))
write("idx_good_labels.gz", gz(good_labels))
write("idx_plain_images.idx", good_images)                      # uncompressed is accepted
write("idx_labels4.gz", gz(idx(0x08, [4], bytes([1, 2, 3, 4]))))  # count differs
write("idx_bad_type.gz", gz(idx(0x0D, [5, 3, 2], good_pixels)))   # float elements
write("idx_bad_magic.gz", gz(b"\x12\x34" + good_images[2:]))
write("idx_foreign.gz", gz(b"this is not an idx file, just some text\n" * 3))
write("idx_trunc_header.gz", gz(good_images[:6]))
write("idx_trunc_data.gz", gz(good_images[:-10]))
write("idx_trailing.gz", gz(good_images + b"\x01\x02\x03"))
write("idx_zero_dim.gz", gz(idx(0x08, [5, 0, 2], b"")))
write("idx_huge.gz", gz(idx(0x08, [100000, 1000, 1000], good_pixels)))
write("idx_claims_more.gz", gz(idx(0x08, [1000, 28, 28], good_pixels)))

# A gzip stream cut in the middle of its compressed data, and one whose CRC is wrong.
noisy = bytes((i * 2654435761 >> 13) % 256 for i in range(50 * 8 * 8))
noisy_gz = gz(idx(0x08, [50, 8, 8], noisy))
write("idx_trunc_gzip.gz", noisy_gz[: len(noisy_gz) // 2])
bad_crc = bytearray(gz(good_images))
bad_crc[-8] ^= 0xFF
write("idx_bad_crc.gz", bytes(bad_crc))
