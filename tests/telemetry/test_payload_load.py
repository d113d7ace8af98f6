"""A batch's body as JSON: orjson for speed, and what orjson refuses is read (and refused, or
not) by the standard library exactly as before, so every body answers as Python's json does."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from telemetry.errors import TelemetryError
from telemetry.payload import load as load_module
from telemetry.payload import payload_load

documents = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


def _stdlib(body: bytes):
    """The reference: what the standard library makes of the body, or its refusal."""
    try:
        return ("read", json.loads(body, parse_constant=load_module._reject_constant))
    except (ValueError, RecursionError) as exc:
        return ("refused", type(exc).__name__)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=8), documents, max_size=6), st.sampled_from([0, 2]))
def test_a_body_reads_as_the_standard_library_reads_it(document, indent):
    body = json.dumps(document, indent=indent or None, ensure_ascii=indent == 0).encode()
    got = payload_load(body)
    assert got == _stdlib(body)[1]
    assert json.dumps(got, sort_keys=True) == json.dumps(document, sort_keys=True)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"", "is empty"),
        (b'{"a": NaN}', "finite numbers only"),
        (b'{"a": -Infinity}', "finite numbers only"),
        (b'{"a": [1, 2', "not valid JSON"),
        (b'{"a": 1} x', "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'"text"', "must be a JSON object"),
        (b'{"a": "\xff"}', "is not UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ],
)
def test_every_refusal_keeps_its_words(body, words):
    with pytest.raises(TelemetryError) as refused:
        payload_load(body)
    assert words in refused.value.errors["body"][0]
    assert refused.value.status == 400


@pytest.mark.parametrize(
    "body",
    [
        b'{"n": 123456789012345678901234567890}',  # beyond 64 bits
        b'{"s": "\\ud800"}',  # a lone surrogate
        b'\xef\xbb\xbf{"a": 1}',  # a byte order mark
        '{"a": "é"}'.encode("utf-16"),
        b'{"a": 1, "a": 2}',
        b'{"f": 1e400}',
    ],
)
def test_what_orjson_refuses_is_read_as_the_standard_library_reads_it(body):
    expected = _stdlib(body)
    if expected[0] == "read":
        assert payload_load(body) == expected[1]
    else:
        with pytest.raises(TelemetryError):
            payload_load(body)
