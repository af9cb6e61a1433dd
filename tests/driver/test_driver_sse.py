"""The pure SSE parser: chunk boundaries, line ends, multi-line data, comments, cuts."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_haico.driver.sse import SSEDecoder

# Non-ASCII text (multi-byte UTF-8), a comment, fields the driver ignores, an
# event without data, CRLF, CR and LF line ends, multi-line data, and a last
# event the stream cuts off.
STREAM = b"".join(
    [
        b": connected\n\n",
        b'data: {"type": "step"}\n\n',
        b"id: 7\r\ndata: Chania \xe2\x86\x92 Heraklion, \xf0\x9f\x8f\x96\r\n\r\n",
        b"event: ping\nid: 8\nretry: 3000\n\n",
        b"data: one\rdata\rdata:two\r\r",
        b"data:  leading space kept\n\n",
        b"data: cut off",
    ]
)
EVENTS = [
    '{"type": "step"}',
    "Chania → Heraklion, 🏖",
    "one\n\ntwo",
    " leading space kept",
]


def _decode(chunks: list[bytes]) -> list[str]:
    decoder = SSEDecoder()
    return [data for chunk in chunks for data in decoder.feed(chunk)]


def _split(data: bytes, *offsets: int) -> list[bytes]:
    bounds = [0, *offsets, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def test_a_whole_stream_yields_each_complete_event() -> None:
    assert _decode([STREAM]) == EVENTS


def test_every_pair_of_split_points_yields_the_same_events() -> None:
    # Inside multi-byte characters, CRLF pairs and field names too.
    for first in range(len(STREAM) + 1):
        for second in range(first, len(STREAM) + 1):
            assert _decode(_split(STREAM, first, second)) == EVENTS, (first, second)


def test_one_byte_at_a_time() -> None:
    assert _decode([STREAM[i : i + 1] for i in range(len(STREAM))]) == EVENTS


def test_an_event_ending_in_cr_is_dispatched_without_waiting_for_more() -> None:
    # A backend that ends lines with CR and then keeps the stream open must not
    # have its last event held back until a next chunk that never comes.
    decoder = SSEDecoder()
    assert decoder.feed(b"data: done\r\r") == ["done"]
    assert decoder.feed(b"\ndata: next\n\n") == ["next"]  # the LF completed a CRLF


def test_an_event_cut_off_by_the_end_of_the_stream_is_never_returned() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b'data: {"type": "complete"}\n') == []
    assert decoder.feed(b"") == []


@pytest.mark.parametrize(
    ("stream", "events"),
    [
        pytest.param(b"data\n\n", [""], id="field-without-colon"),
        pytest.param(b"data:\n\n", [""], id="empty-value"),
        pytest.param(b"data:x\n\n", ["x"], id="no-space"),
        pytest.param(b"datum: x\ndata-x: y\n\n", [], id="other-fields"),
        pytest.param(b"id: 1\nevent: e\n\n", [], id="no-data-no-event"),
        pytest.param(b":data: x\n\n", [], id="comment"),
        pytest.param(b"\n\n\n", [], id="blank-lines"),
        pytest.param(b"data: \xff\xfe\n\n", ["\ufffd\ufffd"], id="invalid-utf-8"),
    ],
)
def test_fields_and_values(stream: bytes, events: list[str]) -> None:
    assert _decode([stream]) == events


def test_one_leading_bom_is_ignored_even_split_across_chunks() -> None:
    bom = "\ufeff".encode()
    assert _decode([bom[:1], bom[1:], b"data: x\n\n"]) == ["x"]
    assert _decode([bom + bom + b"data: x\n\n"]) == []  # a second BOM is part of the name


def test_a_long_line_in_many_chunks() -> None:
    payload = b"x" * 100_000
    chunks = [b"data: ", *(payload[i : i + 7] for i in range(0, len(payload), 7)), b"\n\n"]
    assert _decode(chunks) == [payload.decode()]


def _reference(stream: bytes) -> list[str]:
    """The spec's algorithm over the whole stream at once."""
    text = stream.decode("utf-8", "replace").removeprefix("\ufeff")
    lines = re.split("\r\n|\r|\n", text)[:-1]  # the last piece has no line end
    events, data = [], None
    for line in lines:
        if not line:
            if data is not None:
                events.append("\n".join(data))
            data = None
            continue
        name, colon, value = line.partition(":")
        if name == "data":
            value = value[1:] if colon and value.startswith(" ") else value
            data = [*(data or []), value]
    return events


_LINES = st.sampled_from(
    [
        b"data: a",
        b"data:b",
        b"data",
        b": c",
        b"id: 1",
        b"event: x",
        b"",
        b"datax: q",
        b"data:  sp",
        "data: \u00e9\u2192".encode(),
    ]
)
_ENDS = st.sampled_from([b"\n", b"\r\n", b"\r"])


@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(st.tuples(_LINES, _ENDS), max_size=12),
    tail=_LINES,
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=4),
)
def test_chunked_decoding_matches_the_spec_over_the_whole_stream(
    lines: list[tuple[bytes, bytes]], tail: bytes, cuts: list[int]
) -> None:
    stream = b"".join(line + end for line, end in lines) + tail
    offsets = sorted(min(cut, len(stream)) for cut in cuts)
    assert _decode(_split(stream, *offsets)) == _reference(stream)
