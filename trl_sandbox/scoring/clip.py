"""Program output cut to a size in bytes of UTF-8, head and tail around a marker, for every place
the host keeps it beyond one call (the result cache's details, episodes' observations).

A flood is up to 16 MiB a stream: every function here does work and holds memory bounded by the
size asked for, never by the text, and never cuts inside a UTF-8 sequence or a surrogate pair.
"""

from __future__ import annotations


def clip_text(text: str, max_bytes: int) -> str:
    """``text`` if its UTF-8 form fits ``max_bytes``, else its head and tail around a marker
    ``... [N bytes cut] ...``, the whole at most ``max_bytes`` bytes.

    The cut falls between characters, never inside a UTF-8 sequence (a lone surrogate counts as
    the three bytes ``surrogatepass`` gives it). Work and memory are bounded by ``max_bytes``, not
    by the text: a 16 MiB flood is measured in slices, never encoded whole.
    """
    if len(text) <= max_bytes // 4:  # at most 4 bytes a character: it fits
        return text
    total = utf8_size(text)
    if total <= max_bytes:
        return text
    room = max(0, max_bytes - len(_marker(total)))
    head = _utf8_prefix(text, room - room // 2)
    tail = _utf8_suffix(text, room // 2)
    # A surrogate pair (text decoded with ``surrogatepass``) is one character: never split it.
    if head and "\ud800" <= head[-1] <= "\udbff" and "\udc00" <= text[len(head)] <= "\udfff":
        head = head[:-1]
    if tail and "\udc00" <= tail[0] <= "\udfff" and "\ud800" <= text[-len(tail) - 1] <= "\udbff":
        tail = tail[1:]
    kept = len(head.encode("utf-8", "surrogatepass")) + len(tail.encode("utf-8", "surrogatepass"))
    return head + _marker(total - kept) + tail


def clip_bytes(data: bytes, max_bytes: int) -> str:
    """``data`` as text (UTF-8, undecodable bytes as U+FFFD), at most ``max_bytes`` bytes of UTF-8,
    with a marker ``... [N bytes cut] ...`` counting the bytes of ``data`` left out.

    Only the head and tail that can be shown are decoded, each cut at the start of a UTF-8
    sequence: a 64 MiB file costs the host a few KiB of text, not the 4 x its size that decoding
    it whole with ``errors="replace"`` costs.
    """
    if len(data) <= max_bytes // 3:  # a byte decodes to at most 3 bytes of UTF-8 (U+FFFD)
        return data.decode("utf-8", "replace")
    if len(data) <= max_bytes:
        whole = data.decode("utf-8", "replace")
        if len(whole.encode("utf-8", "surrogatepass")) <= max_bytes:
            return whole
    room = max(0, max_bytes - len(_marker(len(data))))
    for share in (1, 3):  # as much as fits; undecodable bytes take three bytes each when shown
        end = (room - room // 2) // share
        start = len(data) - (room // 2) // share
        for _ in range(3):  # back to the start of a sequence cut in two
            if 0 < end < len(data) and (data[end] & 0xC0) == 0x80:
                end -= 1
            if start < len(data) and (data[start] & 0xC0) == 0x80:
                start += 1
        head = data[:end].decode("utf-8", "replace")
        tail = data[start:].decode("utf-8", "replace")
        marker = _marker(start - end)
        if len((head + marker + tail).encode("utf-8", "surrogatepass")) <= max_bytes:
            break
    return head + marker + tail


def _marker(cut: int) -> str:
    return f"\n... [{cut} bytes cut] ...\n"


def utf8_size(text: str) -> int:
    if text.isascii():
        return len(text)
    step = 1 << 18
    return sum(len(text[i:i + step].encode("utf-8", "surrogatepass")) for i in range(0, len(text), step))


def _utf8_prefix(text: str, max_bytes: int) -> str:
    """The longest prefix of ``text`` whose UTF-8 form fits ``max_bytes`` (whole characters only)."""
    head = text[:max_bytes]  # no character is shorter than a byte
    data = head.encode("utf-8", "surrogatepass")
    if len(data) <= max_bytes:
        return head
    end = max_bytes
    while end > 0 and (data[end] & 0xC0) == 0x80:  # back to the start of the character cut in two
        end -= 1
    return data[:end].decode("utf-8", "surrogatepass")


def _utf8_suffix(text: str, max_bytes: int) -> str:
    """The longest suffix of ``text`` whose UTF-8 form fits ``max_bytes`` (whole characters only)."""
    if max_bytes <= 0:
        return ""
    tail = text[-max_bytes:]
    data = tail.encode("utf-8", "surrogatepass")
    if len(data) <= max_bytes:
        return tail
    start = len(data) - max_bytes
    while start < len(data) and (data[start] & 0xC0) == 0x80:  # on to the next whole character
        start += 1
    return data[start:].decode("utf-8", "surrogatepass")
