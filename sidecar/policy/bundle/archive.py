"""Bundle archives (gzipped tarballs) read into memory safely, and written reproducibly.

Reading never extracts anything to disk: the members become ``{bundle path: bytes}``.
A member name may start with ``/`` (``opa build`` writes every member that way) or
``./`` (``tar -C dir -czf b.tar.gz .``); either prefix means the bundle root and is
dropped. Refused with ``BundleFormatError`` naming the member: any other absolute
form, ``..``, ``.`` or empty path components, names that are not UTF-8, duplicates,
anything but regular files and directories (links, devices, FIFOs), and sizes over
the limits below. The archive is decompressed with a bound, so a gzip bomb stops at
``MAX_BUNDLE_BYTES``.
"""

from __future__ import annotations

import gzip
import io
import tarfile
import zlib
from collections.abc import Mapping

from sidecar.errors import BundleFormatError

__all__ = ["MAX_BUNDLE_BYTES", "MAX_FILES", "MAX_FILE_BYTES", "read_archive", "write_archive"]

MAX_BUNDLE_BYTES = 64 * 1024 * 1024  # compressed or uncompressed, tar headers included
MAX_FILE_BYTES = 16 * 1024 * 1024
MAX_FILES = 10_000
_KINDS = {tarfile.SYMTYPE: "a symbolic link", tarfile.LNKTYPE: "a hard link", tarfile.CHRTYPE: "a character device",
          tarfile.BLKTYPE: "a block device", tarfile.FIFOTYPE: "a FIFO"}


def read_archive(archive: bytes) -> dict[str, bytes]:
    """The regular files of a gzipped tar archive by bundle path (see the module docstring)."""
    files: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(_gunzip(archive)), mode="r:") as tar:
            for count, member in enumerate(tar, start=1):
                if count > MAX_FILES:
                    raise BundleFormatError(f"the bundle has more than {MAX_FILES} members")
                if not member.isdir():
                    name = _bundle_path(member)
                    if name in files:
                        raise BundleFormatError(f"bundle member {member.name!r} appears twice")
                    files[name] = _content(tar, member)
    except (tarfile.TarError, EOFError) as exc:
        raise BundleFormatError(f"not a tar archive: {exc}") from None
    return files


def write_archive(files: Mapping[str, bytes]) -> bytes:
    """A gzipped tar of ``files`` in their order; the same files always give the same bytes."""
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as compressed, \
            tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(content), 0o644
            tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def _gunzip(archive: bytes) -> bytes:
    if len(archive) > MAX_BUNDLE_BYTES:
        raise BundleFormatError(f"the bundle is larger than {MAX_BUNDLE_BYTES} bytes")
    inflater = zlib.decompressobj(wbits=zlib.MAX_WBITS | 16)
    try:
        data = inflater.decompress(archive, MAX_BUNDLE_BYTES + 1)
    except zlib.error as exc:
        raise BundleFormatError(f"not a gzip file: {exc}") from None
    if len(data) > MAX_BUNDLE_BYTES:
        raise BundleFormatError(f"the bundle is larger than {MAX_BUNDLE_BYTES} bytes uncompressed")
    if not inflater.eof or inflater.unused_data:
        raise BundleFormatError("not a single complete gzip stream (truncated, or data after its end)")
    return data


def _bundle_path(member: tarfile.TarInfo) -> str:
    """The member's path from the bundle root; ``BundleFormatError`` when it is unsafe or not a regular file."""
    name = member.name
    if not member.isreg():
        raise BundleFormatError(f"bundle member {name!r} is {_KINDS.get(member.type, 'not a regular file')}")
    path = name[2:] if name.startswith("./") else name.removeprefix("/")
    if any(part in ("", ".", "..") for part in path.split("/")):
        raise BundleFormatError(f"bundle member {name!r} has an unsafe path (absolute, '..', '.' or empty parts)")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise BundleFormatError(f"bundle member {name!r} has a name that is not UTF-8") from None
    if member.size > MAX_FILE_BYTES:
        raise BundleFormatError(f"bundle member {name!r} is larger than {MAX_FILE_BYTES} bytes")
    return path


def _content(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    extracted = tar.extractfile(member)
    assert extracted is not None  # a regular file always has content
    return extracted.read()
