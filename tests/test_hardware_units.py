"""hardware_models.units and hardware_models.errors: parsing, printing, one-line errors."""

from __future__ import annotations

import pickle

import pytest

from hardware_models.errors import HardwareInputError
from hardware_models.units import (
    fmt_bandwidth,
    fmt_bytes,
    fmt_flops,
    fmt_time,
    parse_bandwidth,
    parse_bool,
    parse_bytes,
    parse_flops,
    parse_fraction,
    parse_int,
    parse_number,
    parse_time,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("80GB", 80e9),
        ("80 GB", 80e9),
        ("80GiB", 80 * 2**30),
        ("81920MiB", 80 * 2**30),
        ("1.5TB", 1.5e12),
        ("2TiB", 2 * 2**40),
        ("512KiB", 512 * 1024),
        ("3KB", 3000.0),
        ("3kB", 3000.0),
        ("7B", 7.0),
        ("1e9", 1e9),
        (1e9, 1e9),
        (42, 42.0),
        ("-1GB", -1e9),  # sign is kept; the value objects reject it naming the field
    ],
)
def test_parse_bytes(text: object, expected: float) -> None:
    assert parse_bytes(text, field="x") == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("25GB/s", 25e9), ("2039 GB/s", 2039e9), ("25GBps", 25e9), ("1.5TiB/s", 1.5 * 2**40), ("3e9", 3e9)],
)
def test_parse_bandwidth(text: str, expected: float) -> None:
    assert parse_bandwidth(text, field="x") == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("5us", 5e-6), ("5\u00b5s", 5e-6), ("1.5ms", 1.5e-3), ("2s", 2.0), ("100ns", 1e-7), ("0.25", 0.25)],
)
def test_parse_time(text: str, expected: float) -> None:
    assert parse_time(text, field="x") == pytest.approx(expected, rel=1e-15)


def test_parse_time_is_exact_for_round_microseconds() -> None:
    assert parse_time("5us") == 5e-6
    assert parse_time("10us") == 1e-5


@pytest.mark.parametrize(
    ("text", "expected"),
    [("312TFLOPS", 312e12), ("312 TFLOP/s", 312e12), ("312e12", 312e12), ("1.5PFLOPS", 1.5e15),
     ("19.5tflops", 19.5e12), ("900GFLOPS", 9e11)],
)  # fmt: skip
def test_parse_flops(text: str, expected: float) -> None:
    assert parse_flops(text, field="x") == pytest.approx(expected, rel=1e-15)


def test_small_parsers() -> None:
    assert parse_number("3.9e9") == 3.9e9
    assert parse_fraction("79%") == pytest.approx(0.79)
    assert parse_fraction(0.7) == 0.7
    assert parse_int("8") == 8
    assert parse_int(8.0) == 8
    assert parse_bool("false") is False
    assert parse_bool(True) is True


@pytest.mark.parametrize(
    ("parser", "text", "needle"),
    [
        (parse_bytes, "eighty", "expected a size like '80GB'"),
        (parse_bytes, "80Gb", "bits"),
        (parse_bytes, "80GB/s", "unknown unit"),
        (parse_bytes, "80 furlongs", "unknown unit"),
        (parse_bytes, True, "expected a size"),
        (parse_bytes, float("nan"), "finite"),
        (parse_bytes, [80], "expected a size"),
        (parse_bandwidth, "25GB", "without '/s'"),
        (parse_bandwidth, "25Gb/s", "bits"),
        (parse_time, "5 fortnights", "expected a time"),
        (parse_flops, "312 TOPS", "expected a compute rate"),
        (parse_number, "36 B", "no unit expected"),
        (parse_int, "8.5", "whole number"),
        (parse_fraction, "79 percent", "fraction"),
        (parse_bool, "maybe", "true or false"),
    ],
)
def test_parse_errors_name_the_field(parser: object, text: object, needle: str) -> None:
    with pytest.raises(HardwareInputError) as info:
        parser(text, "host.dram")  # type: ignore[operator]
    message = str(info.value)
    assert message.startswith("field 'host.dram': ")
    assert needle in message
    assert "\n" not in message
    assert info.value.field == "host.dram"


def test_error_is_a_value_error_with_file_field_and_fix() -> None:
    err = HardwareInputError("expected a size like '80GB', got 'eighty'", field="gpu.memory")
    assert isinstance(err, ValueError)
    located = err.in_file("a100x8.yaml")
    assert str(located) == "a100x8.yaml: field 'gpu.memory': expected a size like '80GB', got 'eighty'"
    assert located.in_file("other.yaml") is located  # the innermost file wins
    assert str(HardwareInputError("x\n  y").problem) == "x y"


def test_error_within_prefixes_the_path_and_pickles() -> None:
    err = HardwareInputError("bad", field="[2]").within("gpu.gemm_efficiency")
    assert err.field == "gpu.gemm_efficiency[2]"
    assert HardwareInputError("bad", field="b").within("a").field == "a.b"
    copy = pickle.loads(pickle.dumps(err.in_file("f.yaml")))
    assert str(copy) == "f.yaml: field 'gpu.gemm_efficiency[2]': bad"


def test_formatters() -> None:
    assert fmt_bytes(80e9) == "80.0 GB"
    assert fmt_bytes(80 * 2**30, binary=True) == "80.0 GiB"
    assert fmt_bytes(3.84e12) == "3.84 TB"
    assert fmt_bytes(0) == "0 B"
    assert fmt_bandwidth(24.885e9) == "24.9 GB/s"
    assert fmt_time(5e-6) == "5.00 us"
    assert fmt_time(1.5e-3) == "1.50 ms"
    assert fmt_flops(312e12) == "312.0 TFLOPS"
