"""Number formatting and sizes: exact, labelled, never through a lossy float for big ints."""

import pytest

from lm_accounting.config import AccountingError
from lm_accounting.units import fmt_bytes, fmt_sci, parse_size, size_label


def test_fmt_sci_rounds_exact_ints():
    assert fmt_sci(149_522_795_724_800) == "1.4952e+14"
    assert fmt_sci(11_857_817_501_696_000) == "1.1858e+16"  # 1.18578... rounds up
    assert fmt_sci(999_995) == "1.0000e+06"  # carries into the exponent
    assert fmt_sci(7) == "7.0000e+00"
    assert fmt_sci(10**160) == "1.0000e+160"  # far beyond float range


def test_fmt_bytes_labels_both_units():
    assert fmt_bytes(8_508_230_400) == "8.508 GB (7.924 GiB)"  # GPT-2 XL weights in fp32
    assert fmt_bytes(999_999) == "999,999 B"
    assert fmt_bytes(629_145_600) == "629.146 MB (600.000 MiB)"
    assert fmt_bytes(2_859_677_662_216) == "2.860 TB (2.601 TiB)"
    assert fmt_bytes(6 * 10**20) == "6.0000e+20 B"


def test_parse_size_is_exact_and_needs_a_unit():
    assert parse_size("80GB") == 80 * 10**9
    assert parse_size("80 GiB") == 80 * 2**30
    assert parse_size("1.5TB") == 1_500_000_000_000
    assert parse_size("0.5KiB") == 512
    assert parse_size("80 GB") == 80_000_000_000 and parse_size("80TB") == 80 * 10**12
    assert parse_size("80gB") == parse_size("80GB") and parse_size("80GIB") == 85_899_345_920  # 80 · 1,073,741,824
    assert size_label("80giB") == "80 GiB" and size_label("1.5TB") == "1.5 TB"
    for bad in ("80", "GB", "", "-1GB", "0GB", "0.0001B", "80 parsecs", "1e3GB", "80 G B", "9" * 5000 + "GB"):
        with pytest.raises(AccountingError, match="needs a number and a unit|at least one byte|plain digits"):
            parse_size(bad)


@pytest.mark.parametrize("bits", ["80Gb", "80gb", "80Mb", "80 kb", "80gib", "80GiB".replace("B", "b"), "1.5Tb", "8b"])
def test_parse_size_refuses_bits(bits):
    with pytest.raises(AccountingError, match="lower-case 'b' means bits") as err:
        parse_size(bits)
    assert "80GB" in str(err.value) and "80GiB" in str(err.value) and "\n" not in str(err.value)


def test_parse_size_message_never_echoes_a_huge_input():
    with pytest.raises(AccountingError) as err:
        parse_size("7" * 100_000 + "GB")
    assert len(str(err.value)) < 300
