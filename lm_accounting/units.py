"""Byte sizes, data types and number formatting.  GB means 10^9 bytes and GiB 2^30, always labelled."""

from __future__ import annotations

import re

from .config import MAX_SIZE, AccountingError
from .names import DTYPE_BYTES  # noqa: F401  (re-exported: the byte sizes live in names.py)

UNIT_BYTES = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


_NOT_PLAIN = re.compile(r"\s*[+-]?(?:inf(?:inity)?|nan|[0-9.]+[eE][+-]?[0-9]+)\s*[A-Za-z]{1,3}\s*", re.IGNORECASE)
_SIZE = re.compile(r"\s*([0-9]{1,30}(?:\.[0-9]{1,30})?|\.[0-9]{1,30})\s*([A-Za-z]{1,3})\s*")


def parse_size(text: str) -> int:
    """'80GB' -> 80·10^9, '80GiB' -> 80·2^30, '1.5TB' -> 1.5·10^12 bytes.  A unit is required.

    The rule: a number (at most 30 digits each side of the point), optional spaces, then one of
    B, KB, MB, GB, TB (powers of 10) or KiB, MiB, GiB, TiB (powers of 2).  The unit's letters are
    case-insensitive (``80gB``, ``80GIB``) except the final ``B``: a lower-case final ``b`` means
    *bits* in networking (``80Gb`` is 10 GB), so any unit ending in ``b`` (``80Gb``, ``80gb``,
    ``80Mb``, ``80gib``) is refused with a message that shows ``80GB``/``80GiB``.  The value is
    exact (decimal arithmetic, no float) and must be at least one byte."""
    if not isinstance(text, str):
        raise AccountingError(f"size must be a string such as '80GB', got {type(text).__name__}")
    shown = text if len(text) <= 40 else text[:39] + f"…({len(text):,} characters)"
    match = _SIZE.fullmatch(text)
    if match and match.group(2).endswith("b") and match.group(2).upper() in UNIT_BYTES:
        raise AccountingError(
            f"size '{shown}': a lower-case 'b' means bits; give bytes with a capital B, "
            "e.g. 80GB (10^9 bytes) or 80GiB (2^30 bytes)"
        )
    if not match and _NOT_PLAIN.fullmatch(text):
        raise AccountingError(
            f"size '{shown}': give the number in plain digits, e.g. 80GB or 1.5TB (no exponent, inf or nan)"
        )
    if not match or match.group(2).upper() not in UNIT_BYTES:
        raise AccountingError(
            f"size '{shown}' needs a number and a unit: B, KB, MB, GB, TB (powers of 10) "
            "or KiB, MiB, GiB, TiB (powers of 2), e.g. 80GB or 80GiB"
        )
    number, unit = match.group(1), match.group(2).upper()
    whole, _, frac = number.partition(".")
    scale = UNIT_BYTES[unit]
    # exact decimal arithmetic: '1.5' -> 15 / 10
    value = (int(whole or "0") * 10 ** len(frac) + int(frac or "0")) * scale // 10 ** len(frac)
    if value <= 0:
        raise AccountingError(f"size '{shown}' must be at least one byte")
    if value > MAX_SIZE:
        raise AccountingError(f"size '{shown}' is beyond the supported 10^18 bytes (1,000,000 TB)")
    return value


def size_label(text: str) -> str:
    """'80gB' -> '80 GB', '80GiB' -> '80 GiB': the budget as the user gave it, tidied for titles."""
    parse_size(text)
    match = _SIZE.fullmatch(text)
    unit = match.group(2).upper()
    if unit.endswith("IB"):  # KiB, MiB, GiB, TiB
        unit = unit[0] + "iB"
    return f"{match.group(1)} {unit}"


BYTE_UNITS = (
    (10**6, "MB", 2**20, "MiB"),
    (10**9, "GB", 2**30, "GiB"),
    (10**12, "TB", 2**40, "TiB"),
    (10**15, "PB", 2**50, "PiB"),
)


def fmt_bytes(n_bytes: int) -> str:
    """'8.508 GB (7.924 GiB)': a decimal and a binary unit, both labelled."""
    if n_bytes < 10**6:
        return f"{n_bytes:,} B"
    if n_bytes >= 10**18:
        return f"{fmt_sci(n_bytes)} B"
    scale, unit, bscale, bunit = next(u for u in reversed(BYTE_UNITS) if n_bytes >= u[0])
    return f"{n_bytes / scale:,.3f} {unit} ({n_bytes / bscale:,.3f} {bunit})"


def fmt_sci(n: int) -> str:
    """An exact int in scientific notation, rounded half up without a float: '1.4952e+14'."""
    value, exponent = abs(n), len(str(abs(n))) - 1
    if exponent >= 4:
        q, r = divmod(value, 10 ** (exponent - 4))
        q += 2 * r >= 10 ** (exponent - 4)
    else:
        q = value * 10 ** (4 - exponent)
    if q == 10**5:  # 9.99995 rounds up to 10.0000
        q, exponent = 10**4, exponent + 1
    return f"{'-' if n < 0 else ''}{q // 10**4}.{q % 10**4:04d}e+{exponent:02d}"


def fmt_share(x: float) -> str:
    return f"{100 * x:.2f}%"
