"""The kernel form grammar (scripts/layers/kernel_form.py): canonical strings, fields, one-line refusals, and
the forms the exporter refuses."""

from __future__ import annotations

import re

import pytest

from scripts.layers import kernel_form
from scripts.pipeline.errors import ClefError


@pytest.mark.parametrize("text", ["R64+sp+ec+dd+vs6", "loop", "R16", "R128+ec", "loop+sp+ec+dd+vs12", "R32+dd+vs1"])
def test_canonical_strings_round_trip(text):
    assert str(kernel_form.parse(text)) == text


@pytest.mark.parametrize(
    "text, canonical",
    [
        ("vs6+dd+ec+sp+R64", "R64+sp+ec+dd+vs6"),  # any order in, canonical order out
        ("R64+cumsum", "R64"),  # defaults are left out
        ("R64+vs0", "R64"),
    ],
)
def test_parse_normalizes(text, canonical):
    assert str(kernel_form.parse(text)) == canonical
    assert kernel_form.parse(canonical) == kernel_form.parse(text)


def test_parts_land_in_fields():
    f = kernel_form.parse("R32+sp+ec+dd+vs6")
    assert (f.chunk, f.loop, f.sp, f.ec, f.dd, f.vs, f.v_scale) == (32, False, True, True, True, 6, 64.0)
    assert kernel_form.parse("loop") == kernel_form.STOCK


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("R64+xx", "unknown part 'xx'"),
        ("R64+dd+cumsum", "'cumsum' conflicts"),
        ("R64+vs2+vs3", "'vs3' conflicts"),
        ("R64+loop", "'loop' conflicts"),
        ("R64+sp+sp", "'sp' conflicts"),
        ("sp+ec+dd", "no chunk part"),
        ("R48+ec", "chunk 48 is not a power of two"),
        ("R8", "chunk 8 is not a power of two from 16 to 128"),
        ("R256", "chunk 256"),
        ("R64+vs13", "vs13 is out of range"),
        ("", "empty"),
        ("R64++ec", "unknown part ''"),
    ],
)
def test_bad_forms_refused_in_one_line(text, fragment):
    with pytest.raises(ClefError) as info:
        kernel_form.parse(text)
    message = str(info.value)
    assert fragment in message and "\n" not in message
    if "unknown" in fragment or "conflicts" in fragment or "no chunk" in fragment:
        assert "valid parts: R<n>" in message


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("loop", "the loop inverse unrolls"),
        ("R64+sp+ec+vs6", "cumsum lowers to CUMSUM"),
    ],
)
def test_exporter_refuses_loop_and_cumsum(text, fragment):
    with pytest.raises(ClefError, match=fragment):
        kernel_form.check_exportable(kernel_form.parse(text))
    kernel_form.check_exportable(kernel_form.parse("R64+dd"))


def test_no_torch_needed():
    """params.yaml is checked before anything heavy: the grammar must not pull torch in."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    code = "import sys, scripts.pipeline.params; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    "text", ["sp+R64+ec+dd+vs6", " R64+sp+ec+dd+vs6", "R64+sp+ec+dd+vs06", "R64+cumsum", "R64+vs0"]
)
def test_params_take_one_spelling_per_form(text):
    """DVC compares params.yaml's text: another spelling of a form would rebuild every stage for the same
    graph. The grammar reads each (parse), params.yaml's reader refuses it, naming the canonical one."""
    form = kernel_form.parse(text)
    with pytest.raises(ClefError, match=f"did you mean {re.escape(str(form))}\\?"):
        kernel_form.parse_canonical(text)
    assert kernel_form.parse_canonical(str(form)) == form
