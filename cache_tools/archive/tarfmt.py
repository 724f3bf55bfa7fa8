"""The tar format as cache archives use it: a deterministic ustar/PAX header writer, and a strict
stream reader that bounds every header before reading it.

The writer produces, byte for byte, what ``tarfile``'s PAX writer produced for our normalized
members (regular file, mtime 0, uid/gid 0, no owner names, mode 0644/0755), so archives written
before and after it are identical.  The reader takes ustar, PAX ('x') and old-style headers;
everything else (GNU long names, global or sparse PAX headers, links, devices) is reported as
what it is and never read into memory beyond its 512-byte header.  The archive layer above
decides what is acceptable; this module knows nothing about caches.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

BLOCK = 512
#: tarfile pads a stream to a multiple of this (20 blocks)
RECORD = 20 * BLOCK
ZERO_BLOCK = bytes(BLOCK)
_USTAR = b"ustar\x0000"
_GNU_MAGIC = b"ustar  \x00"
_MAX_SIZE = 8 ** 11            # sizes from here on go into a PAX record


class TarFormatError(Exception):
    """A header that cannot be parsed, or a stream that ends inside a header or member.
    ``truncated`` tells the two apart; ``offset`` is the byte where the header starts;
    ``no_header``: the block is no tar header at all (its checksum does not match), not a tar
    header of a kind this reader refuses."""

    def __init__(self, reason: str, offset: int, truncated: bool = False,
                 no_header: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.offset = offset
        self.truncated = truncated
        self.no_header = no_header


# --- writing ----------------------------------------------------------------------------------


_TAIL = bytes(100) + _USTAR + bytes(32 + 32 + 8 + 8 + 155 + 12)
_IDS = b"0000000\0" * 2           # uid, gid
_MTIME = b"00000000000\0"
# Constant part of the checksum: the checksum field as eight spaces, the owner and time fields.
_FIXED = 256 + sum(_IDS) + sum(_MTIME) + sum(_TAIL)
_REG_TAIL = b"0" + _TAIL
_FIXED_REG = _FIXED + ord("0")


def _block(name: bytes, mode: int, size: int, typeflag: bytes) -> bytes:
    """One ustar block with normalized owner and time fields and its checksum."""
    name = name[:100]
    mode_f = b"%07o\0" % (mode & 0o7777)
    size_f = b"%011o\0" % size
    # Written as 6 octal digits, NUL and one of the field's original spaces, as tarfile does.
    chksum = _FIXED + _byte_sum(name + mode_f + size_f) + typeflag[0]
    return (name.ljust(100, b"\0") + mode_f + _IDS + size_f + _MTIME + b"%06o\0 " % chksum
            + typeflag + _TAIL)


def _byte_sum(data: bytes) -> int:
    """The sum of the bytes of ``data`` (at most 256 of them), in C: Adler-32's low half is
    1 + that sum modulo 65521, and 256 bytes sum to at most 65280."""
    return (zlib.adler32(data) & 0xFFFF) - 1


def _pax_records(fields: dict[str, str]) -> bytes:
    out = b""
    for key, value in fields.items():
        kv = key.encode() + b"=" + value.encode("utf-8")
        # The length counts its own digits: iterate to the fixed point, as tarfile does.
        base = len(kv) + 2                  # ' ' and '\n'
        length = previous = 0
        while True:
            length = base + len(str(previous))
            if length == previous:
                break
            previous = length
        out += b"%d " % length + kv + b"\n"
    return out


def header(name: str, size: int, mode: int) -> bytes:
    """The header block(s) of one regular file: a PAX header first when the name is longer than
    100 characters or not ASCII, or the size does not fit 11 octal digits (8 GiB)."""
    if len(name) <= 100 and 0 <= size < _MAX_SIZE and name.isascii():
        # _block for a regular file, in one formatting step (it runs for every member).
        raw = name.encode("ascii")
        chksum = _FIXED_REG + _byte_sum(b"%s%07o\0%011o\0" % (raw, mode & 0o7777, size))
        return b"%s%s%07o\0%s%011o\0%s%06o\0 %s" % (
            raw, bytes(100 - len(raw)), mode & 0o7777, _IDS, size, _MTIME, chksum, _REG_TAIL)
    pax: dict[str, str] = {}
    ascii_name = name.isascii()
    if not ascii_name or len(name) > 100:
        pax["path"] = name
    field_size = size
    if not 0 <= size < _MAX_SIZE:
        pax["size"] = str(size)
        field_size = 0
    raw = name.encode("ascii") if ascii_name else name.encode("ascii", "replace")
    ustar = _block(raw, mode, field_size, b"0")
    if not pax:
        return ustar
    records = _pax_records(pax)
    return (_block(b"././@PaxHeader", 0, len(records), b"x") + records + padding(len(records))
            + ustar)


def span(name: str, size: int, mode: int) -> int:
    """The bytes one member takes in the archive: its header block(s), its data, its padding."""
    if len(name) <= 100 and 0 <= size < _MAX_SIZE and name.isascii():
        head = BLOCK
    else:
        head = len(header(name, size, mode))
    return head + size + (-size % BLOCK)


def entry_span(prefix: str, files: Iterable[tuple[str, int, int]]) -> int:
    """The bytes the members of one entry take in a row: ``span`` of each
    ``(path, size, mode)``, named ``<prefix>/<path>`` (``<prefix>`` for the path '').  The
    common case (short ASCII names) costs no name to build: it runs for every member of every
    archive a pack or restore lays out."""
    short = prefix.isascii() and len(prefix) < 100
    total = 0
    for path, size, mode in files:
        if short and len(prefix) + len(path) < 100 and 0 <= size < _MAX_SIZE and \
                path.isascii():
            total += BLOCK + size + (-size % BLOCK)
        else:
            total += span(f"{prefix}/{path}" if path else prefix, size, mode)
    return total


def layout(start: int, entries: Iterable[tuple[str, Iterable[tuple[str, int, int]]]]
           ) -> tuple[list[int], int]:
    """Entries' members laid out in a row from byte ``start``, each entry given as its name
    prefix and its files' ``(path, size, mode)`` (see ``entry_span``): the byte offset of each
    entry's first header, and the offset after the last member."""
    offsets = []
    offset = start
    for prefix, files in entries:
        offsets.append(offset)
        offset += entry_span(prefix, files)
    return offsets, offset


def padding(size: int) -> bytes:
    """Zero bytes from the end of ``size`` bytes of data to the next block boundary."""
    return bytes(-size % BLOCK)


def end(offset: int) -> bytes:
    """The end of an archive whose members end at ``offset``: two zero blocks, then zeros up to
    a multiple of the 20-block record (as tarfile's stream writer ends it)."""
    total = offset + 2 * BLOCK
    return bytes(2 * BLOCK + (-total % RECORD))


# --- reading ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Header:
    """One member's header as read.  ``name`` is None when it is not valid UTF-8 (``raw_name``
    holds the bytes); ``typeflag`` is the ustar type byte (b"0" regular, b"2" symlink, ...)."""

    offset: int
    name: str | None
    raw_name: bytes
    size: int
    typeflag: bytes
    linkname: str
    #: a PAX header came first (and said, among other things, whether the file is sparse)
    pax: bool = False
    sparse: bool = False


def _number(field: bytes, what: str, offset: int) -> int:
    if field[:1] in (b"\x80", b"\xff"):    # GNU base-256
        if field[0] == 0xFF:
            raise TarFormatError(f"negative {what}", offset)
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip(b" ")
    if not text:
        return 0
    if not all(0x30 <= c <= 0x37 for c in text):
        raise TarFormatError(f"{what} field is not an octal number", offset)
    return int(text, 8)


def _checksum_ok(block: bytes, offset: int) -> bool:
    try:
        stored = _number(block[148:156], "checksum", offset)
    except TarFormatError:
        return False
    unsigned = _byte_sum(block[:148]) + 256 + _byte_sum(block[156:384]) + \
        _byte_sum(block[384:])
    if stored == unsigned:
        return True
    signed = unsigned - 256 * (sum(1 for b in block[:148] if b > 127)
                               + sum(1 for b in block[156:] if b > 127))
    return stored == signed


def _text(field: bytes) -> bytes:
    return field.split(b"\0", 1)[0]


class TarStream:
    """Reads a tar stream member by member from ``read(n)`` (which returns up to n bytes, b""
    at the end).  Headers are bounded: a PAX header above ``max_header_bytes`` is refused
    from its 512-byte ustar block, before its records are read."""

    def __init__(self, read: Callable[[int], bytes], *, max_header_bytes: int,
                 chunk: int = 1 << 20) -> None:
        self._read = read
        self.max_header_bytes = max_header_bytes
        self.chunk = chunk
        self._buf = b""
        self._pos = 0
        #: bytes of the stream consumed so far (the offset of the next header)
        self.offset = 0
        self._pad = 0          # padding of the previous member, skipped before the next header
        #: the end-of-archive block was read (a stream that just stops is truncated)
        self.end_block = False

    # -- buffer -------------------------------------------------------------------------------

    def _ensure(self, n: int) -> bool:
        """At least ``n`` bytes buffered from the current position; False at the end."""
        have = len(self._buf) - self._pos
        while have < n:
            data = self._read(max(self.chunk, n - have))
            if not data:
                return False
            self._buf = self._buf[self._pos:] + data if have else data
            self._pos = 0
            have = len(self._buf)
        return True

    def _take(self, n: int) -> bytes:
        data = self._buf[self._pos:self._pos + n]
        self._pos += n
        self.offset += n
        return data

    def skip_padding(self, after: str) -> None:
        """Consume the previous member's padding, refusing any byte that is not zero (data
        hidden outside every member); ``after`` names that member in the message."""
        if self._pad:
            if not self._ensure(self._pad):
                raise TarFormatError(f"the stream ends in the padding after {after}",
                                     self.offset, truncated=True)
            offset = self.offset
            if self._take(self._pad) != ZERO_BLOCK[:self._pad]:
                raise TarFormatError(f"non-zero bytes in the padding of {after} (data "
                                     f"hidden outside every member)", offset)
            self._pad = 0

    # -- headers ------------------------------------------------------------------------------

    def match(self, expected: bytes) -> bool:
        """Consume the next header when it is exactly ``expected`` (the bytes our writer
        produces for the member the manifest lists next): the fast path for our own archives."""
        self.skip_padding("the previous member")
        n = len(expected)
        if not self._ensure(n) or self._buf[self._pos:self._pos + n] != expected:
            return False
        self._pos += n
        self.offset += n
        return True

    def whole(self, expected: bytes, size: int) -> memoryview | None:
        """The fast path for a small member of our own: header ``expected`` then ``size``
        bytes of data, consumed at once; None, with nothing consumed, when the bytes are not
        exactly that (the caller then goes through ``match``/``next_header`` and ``data``)."""
        pad, n = self._pad, len(expected)
        need = pad + n + size
        if len(self._buf) - self._pos < need and not self._ensure(need):
            return None
        buf = self._buf
        start = self._pos + pad
        if buf[start:start + n] != expected or (pad and buf[self._pos:start] != ZERO_BLOCK[:pad]):
            return None                      # (non-zero padding: ``skip_padding`` refuses it)
        start += n
        self._pos = start + size
        self.offset += need
        self._pad = -size % BLOCK
        return memoryview(buf)[start:start + size]

    def next_header(self) -> Header | None:
        """The next member's header, PAX records applied; None at the end-of-archive block."""
        self.skip_padding("the previous member")
        pax: dict[str, str] | None = None
        start = self.offset
        while True:
            offset = self.offset
            if not self._ensure(BLOCK):
                if len(self._buf) - self._pos == 0 and pax is None:
                    return None
                raise TarFormatError("the stream ends inside a header", offset, truncated=True)
            block = self._take(BLOCK)
            if block == ZERO_BLOCK:
                if pax is not None:
                    raise TarFormatError("a PAX header is followed by the end of the archive",
                                         start)
                self.end_block = True
                return None
            if not _checksum_ok(block, offset):
                raise TarFormatError("bad header checksum", offset, no_header=True)
            typeflag = block[156:157]
            size = _number(block[124:136], "size", offset)
            if typeflag in (b"L", b"K"):
                raise TarFormatError("GNU long-name header (only ustar/PAX archives are read)",
                                     offset)
            if typeflag == b"g":
                raise TarFormatError("global PAX header", offset)
            if typeflag == b"x":
                if pax is not None:
                    raise TarFormatError("two PAX headers in a row", offset)
                if size > self.max_header_bytes:
                    raise TarFormatError(f"PAX header of {size} bytes exceeds the limit of "
                                         f"{self.max_header_bytes} bytes", offset)
                if not self._ensure(size + (-size % BLOCK)):
                    raise TarFormatError("the stream ends inside a PAX header", offset,
                                         truncated=True)
                records = self._take(size)
                if self._take(-size % BLOCK) != ZERO_BLOCK[:-size % BLOCK]:
                    raise TarFormatError("non-zero bytes in the padding of a PAX header",
                                         offset)
                pax = _parse_pax(records, offset)
                continue
            return self._member(block, offset, typeflag, size, pax, start)

    def _member(self, block: bytes, offset: int, typeflag: bytes, size: int,
                pax: dict[str, str] | None, start: int) -> Header:
        magic = block[257:265]
        raw = _text(block[0:100])
        if magic == _USTAR and block[345] != 0:
            raw = _text(block[345:500]) + b"/" + raw
        linkname = _text(block[157:257]).decode("utf-8", "replace")
        sparse = typeflag == b"S"
        if pax is not None:
            if "path" in pax:
                raw = pax["path"].encode("utf-8", "surrogateescape")
            if "linkpath" in pax:
                linkname = pax["linkpath"]
            if "size" in pax:
                if not pax["size"].isdigit():
                    raise TarFormatError("PAX size is not a number", start)
                size = int(pax["size"])
            sparse = sparse or any(k.startswith("GNU.sparse.") for k in pax)
        if magic not in (_USTAR, _GNU_MAGIC) and magic[:5] == b"ustar":
            raise TarFormatError("unknown ustar version", offset)
        if typeflag in (b"5", b"0", b"\0") and raw.endswith(b"/"):
            typeflag = b"5"
        if typeflag == b"5":
            raw = raw.rstrip(b"/") or raw
        try:
            name: str | None = raw.decode("utf-8")
        except UnicodeDecodeError:
            name = None
        return Header(start, name, raw, size, typeflag, linkname, pax is not None, sparse)

    # -- data ---------------------------------------------------------------------------------

    def data(self, size: int) -> memoryview:
        """All ``size`` bytes of the current member at once (sizes up to a few chunks)."""
        if not self._ensure(size):
            got = len(self._buf) - self._pos
            self.offset += got
            self._pos = len(self._buf)
            raise TarFormatError(f"{got} of {size} bytes", self.offset, truncated=True)
        view = memoryview(self._buf)[self._pos:self._pos + size]
        self._pos += size
        self.offset += size
        self._pad = -size % BLOCK
        return view

    def chunks(self, size: int) -> Iterator[memoryview]:
        """The current member's ``size`` bytes in pieces of at most one chunk."""
        left = size
        while left:
            have = len(self._buf) - self._pos
            if not have:
                self._buf, self._pos = self._read(self.chunk), 0
                have = len(self._buf)
                if not have:
                    raise TarFormatError(f"{size - left} of {size} bytes", self.offset,
                                         truncated=True)
            n = min(have, left)
            view = memoryview(self._buf)[self._pos:self._pos + n]
            self._pos += n
            self.offset += n
            left -= n
            yield view
        self._pad = -size % BLOCK

    def exhausted(self) -> bool:
        """Nothing buffered, and the source gives nothing more."""
        return len(self._buf) - self._pos == 0 and not self._read(1)

    def rest_is_zero(self) -> int | None:
        """After the end-of-archive block: None when every remaining byte is zero, else the
        offset of the first block holding data (hidden content is refused, not ignored)."""
        while True:
            have = len(self._buf) - self._pos
            if not have:
                self._buf, self._pos = self._read(self.chunk), 0
                if not self._buf:
                    return None
                continue
            rest = self._buf[self._pos:]
            if rest.count(0) != len(rest):
                return self.offset + (len(rest) - len(rest.lstrip(b"\0"))) // BLOCK * BLOCK
            self.offset += len(rest)
            self._pos = len(self._buf)


def _parse_pax(records: bytes, offset: int) -> dict[str, str]:
    """``LEN key=value\\n`` records, strictly (the length covers the whole record)."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(records):
        if records[pos:].strip(b"\0") == b"":
            break                                   # zero padding inside the declared size
        space = records.find(b" ", pos, pos + 21)
        if space < 0 or not records[pos:space].isdigit():
            raise TarFormatError("malformed PAX header (no record length)", offset)
        length = int(records[pos:space])
        end = pos + length
        if length <= space - pos + 1 or end > len(records) or records[end - 1:end] != b"\n":
            raise TarFormatError("malformed PAX header (bad record length)", offset)
        key, eq, value = records[space + 1:end - 1].partition(b"=")
        if not eq or not key:
            raise TarFormatError("malformed PAX header (a record without '=')", offset)
        try:
            k = key.decode("utf-8")
            v = value.decode("utf-8", "surrogateescape" if k == "path" else "strict")
        except UnicodeDecodeError:
            raise TarFormatError(f"malformed PAX header (record {key!r} is not UTF-8)",
                                 offset) from None
        out[k] = v
        pos = end
    return out
