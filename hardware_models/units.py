"""Parsing and printing of human units.

Internal units are bytes, seconds, FLOP/s and bytes/s. Decimal prefixes (KB, MB, GB, TB, PB) are powers
of 1000; binary ones (KiB, MiB, GiB, TiB, PiB) powers of 1024. A plain number (or a numeric string such
as ``"1e9"``) is taken in the internal unit. Unit letters are matched case-insensitively, except that a
lower-case final ``b`` ("Gb") is refused because it conventionally means bits.

Every parser takes the dotted `field` path that the value came from and raises `HardwareInputError`
naming it. Parsers do not check signs or ranges (the value objects do, naming the same field), but
they refuse NaN and infinity.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from hardware_models.errors import HardwareInputError
from hardware_models.frozen import FrozenDict

__all__ = [
    "GB",
    "GIB",
    "fmt_bandwidth",
    "fmt_bytes",
    "fmt_flops",
    "fmt_time",
    "parse_bandwidth",
    "parse_bool",
    "parse_bytes",
    "parse_flops",
    "parse_fraction",
    "parse_int",
    "parse_number",
    "parse_time",
]

GB = 1e9
GIB = float(2**30)

_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_QUANTITY = re.compile(rf"^\s*({_NUMBER})\s*([^\s\d].*?)?\s*$")

_BYTE_UNITS: Mapping[str, float] = FrozenDict(
    {
        "B": 1.0,
        "KB": 1e3,
        "MB": 1e6,
        "GB": 1e9,
        "TB": 1e12,
        "PB": 1e15,
        "KiB": float(2**10),
        "MiB": float(2**20),
        "GiB": float(2**30),
        "TiB": float(2**40),
        "PiB": float(2**50),
    }
)
_TIME_DIVISORS: Mapping[str, float] = FrozenDict(
    {  # divide (not multiply by 1e-6) so "5us" gives exactly 5e-06
        "s": 1.0,
        "ms": 1e3,
        "us": 1e6,
        "\u00b5s": 1e6,  # micro sign
        "\u03bcs": 1e6,  # greek mu
        "ns": 1e9,
    }
)
_FLOPS_PREFIX: Mapping[str, float] = FrozenDict(
    {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
)
_FLOPS_UNIT = re.compile(r"^([KMGTPE]?)FLOP(?:S|/S)$", re.IGNORECASE)

_SIZE_HINT = "expected a size like '80GB' or '80GiB'"
_BW_HINT = "expected a bandwidth like '25GB/s'"
_TIME_HINT = "expected a time like '5us', '1.5ms' or '2s'"
_FLOPS_HINT = "expected a compute rate like '312TFLOPS'"


def _finite(value: float, text: object, field: str, hint: str) -> float:
    if not math.isfinite(value):
        raise HardwareInputError(f"{hint}, got {text!r} (not a finite number)", field=field)
    return value


def _split(text: object, field: str, hint: str) -> tuple[float, str]:
    """Number and unit of `text`; a bare int/float has unit ''."""
    if isinstance(text, bool):
        raise HardwareInputError(f"{hint}, got {text!r}", field=field)
    if isinstance(text, int | float):
        return _finite(float(text), text, field, hint), ""
    if not isinstance(text, str):
        raise HardwareInputError(f"{hint}, got {text!r}", field=field)
    match = _QUANTITY.match(text)
    if match is None:
        raise HardwareInputError(f"{hint}, got {text!r}", field=field)
    number = _finite(float(match.group(1)), text, field, hint)
    return number, match.group(2) or ""


def _byte_factor(unit: str, text: object, field: str, hint: str) -> float:
    if unit in _BYTE_UNITS:
        return _BYTE_UNITS[unit]
    folded = {k.lower(): v for k, v in _BYTE_UNITS.items()}
    if unit.lower() in folded:
        if unit.endswith("b"):
            raise HardwareInputError(
                f"{hint}, got {text!r} (a lower-case 'b' means bits; write 'B' for bytes)", field=field
            )
        return folded[unit.lower()]
    raise HardwareInputError(f"{hint}, got {text!r} (unknown unit {unit!r})", field=field)


def parse_bytes(text: object, field: str = "value") -> float:
    """``"80GB"`` -> 8e10, ``"80GiB"`` -> 80*2**30, ``"1e9"``/``1e9`` -> 1e9 bytes."""
    number, unit = _split(text, field, _SIZE_HINT)
    if not unit:
        return number
    return number * _byte_factor(unit, text, field, _SIZE_HINT)


def parse_bandwidth(text: object, field: str = "value") -> float:
    """``"25GB/s"`` (or ``"25 GBps"``) -> 2.5e10 bytes/s; a plain number is bytes/s."""
    number, unit = _split(text, field, _BW_HINT)
    if not unit:
        return number
    if unit.endswith(("/s", "ps")) and len(unit) > 2:
        base = unit[:-2]
    else:
        raise HardwareInputError(f"{_BW_HINT}, got {text!r} (a size without '/s')", field=field)
    return number * _byte_factor(base.strip(), text, field, _BW_HINT)


def parse_time(text: object, field: str = "value") -> float:
    """``"5us"`` -> 5e-6, ``"1.5ms"`` -> 1.5e-3, ``"2s"`` -> 2.0; a plain number is seconds."""
    number, unit = _split(text, field, _TIME_HINT)
    if not unit:
        return number
    divisor = _TIME_DIVISORS.get(unit, _TIME_DIVISORS.get(unit.lower()))
    if divisor is None:
        raise HardwareInputError(f"{_TIME_HINT}, got {text!r} (unknown unit {unit!r})", field=field)
    return number / divisor


def parse_flops(text: object, field: str = "value") -> float:
    """``"312TFLOPS"``/``"312 TFLOP/s"``/``"312e12"`` -> 3.12e14 FLOP/s."""
    number, unit = _split(text, field, _FLOPS_HINT)
    if not unit:
        return number
    match = _FLOPS_UNIT.match(unit)
    if match is None:
        raise HardwareInputError(f"{_FLOPS_HINT}, got {text!r} (unknown unit {unit!r})", field=field)
    return number * _FLOPS_PREFIX[match.group(1).upper()]


def parse_number(text: object, field: str = "value") -> float:
    """A unit-less number: ``36``, ``"3.9e9"``."""
    hint = "expected a number like '36' or '3.9e9'"
    number, unit = _split(text, field, hint)
    if unit:
        raise HardwareInputError(f"{hint}, got {text!r} (no unit expected)", field=field)
    return number


def parse_fraction(text: object, field: str = "value") -> float:
    """A fraction: ``0.79`` or ``"79%"``."""
    hint = "expected a fraction like '0.79' or '79%'"
    number, unit = _split(text, field, hint)
    if unit == "%":
        return number / 100.0
    if unit:
        raise HardwareInputError(f"{hint}, got {text!r}", field=field)
    return number


def parse_int(text: object, field: str = "value") -> int:
    """A whole number: ``8`` or ``"8"`` (``8.0`` is accepted, ``8.5`` is not)."""
    hint = "expected a whole number like '8'"
    number, unit = _split(text, field, hint)
    if unit or number != int(number):
        raise HardwareInputError(f"{hint}, got {text!r}", field=field)
    return int(number)


def parse_bool(text: object, field: str = "value") -> bool:
    """``true``/``false`` (YAML booleans or the strings true/false/yes/no)."""
    if isinstance(text, bool):
        return text
    if isinstance(text, str) and text.strip().lower() in ("true", "yes", "on", "1"):
        return True
    if isinstance(text, str) and text.strip().lower() in ("false", "no", "off", "0"):
        return False
    raise HardwareInputError(f"expected true or false, got {text!r}", field=field)


def _scaled(value: float, units: tuple[tuple[str, float], ...]) -> str:
    for name, factor in units:
        if abs(value) >= factor:
            scaled = value / factor
            return f"{scaled:.1f} {name}" if abs(scaled) >= 10 else f"{scaled:.2f} {name}"
    name, factor = units[-1]
    scaled = value / factor
    return f"{scaled:.2f} {name}" if value else f"0 {name}"


_DEC_BYTES = (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3), ("B", 1.0))
_BIN_BYTES = (
    ("PiB", 2.0**50),
    ("TiB", 2.0**40),
    ("GiB", 2.0**30),
    ("MiB", 2.0**20),
    ("KiB", 2.0**10),
    ("B", 1.0),
)


def fmt_bytes(value: float, binary: bool = False) -> str:
    """``8e10`` -> ``"80.0 GB"``; with ``binary=True`` -> ``"74.5 GiB"``."""
    return _scaled(value, _BIN_BYTES if binary else _DEC_BYTES)


def fmt_bandwidth(value: float) -> str:
    """``2.49e10`` -> ``"24.9 GB/s"``."""
    return fmt_bytes(value) + "/s"


def fmt_time(value: float) -> str:
    """``5e-6`` -> ``"5.00 us"``."""
    return _scaled(value, (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)))


def fmt_flops(value: float) -> str:
    """``3.12e14`` -> ``"312.0 TFLOPS"``."""
    return _scaled(
        value, (("PFLOPS", 1e15), ("TFLOPS", 1e12), ("GFLOPS", 1e9), ("MFLOPS", 1e6), ("FLOPS", 1.0))
    )


def gb(x: float) -> str:
    """Bytes as decimal GB with one decimal and thousands separators: the tables' and verdicts' unit."""
    return f"{x / 1e9:,.1f} GB"


def secs(x: float) -> str:
    """Seconds as s, ms or us with three significant-ish decimals (tables and verdict lines)."""
    if x >= 1:
        return f"{x:,.3f} s"
    if x >= 1e-3:
        return f"{x * 1e3:,.2f} ms"
    return f"{x * 1e6:,.1f} us"
