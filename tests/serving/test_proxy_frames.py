"""The proxy's SSE frame accounting (exporters/serving/engines/openai/frames.py), with no socket and no event
loop: bytes in, events out. The same stream split at every byte, or fed one byte per read, gives the same
tokens, usage, finish, first-token read and forwarded bytes."""

from __future__ import annotations

from typing import Any

import pytest

from exporters.serving.engine import FinishReason, GenerationRequest, OutputEvent, SamplingParams
from exporters.serving.engines.openai.frames import FrameReader

PLAIN = [  # chunks the byte-level path reads; the JSON path reads the same fields from them
    b'{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},'
    b'"logprobs":null,"finish_reason":null}]}',
    b'{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"t1 "},'
    b'"logprobs":null,"finish_reason":null}]}',
    b'{"id":"c","choices":[{"index":0,"delta":{"content":"say \\"hi\\" caf\\u00e9\\n"},"finish_reason":null}],'
    b'"usage":null}',
    b'{"id":"c","choices":[{"index":0,"delta":{"content":""}}]}',
    b'{"id":"c","choices":[{"index":0,"delta":{"content":null,"reasoning_content":"hmm"}}]}',
    b'{"id":"c","choices":[{"index":0,"delta":{"content":"x"}}],"usage":{"prompt_tokens":3,"completion_tokens":5}}',
]
OTHER = [  # chunks only the JSON path reads
    b'{"id":"c","choices":[{"index":0,"delta":{"content":"y"},"finish_reason":"length","stop_reason":null}]}',
    b'{"id":"c", "choices": [{"index": 0, "delta": {"content": "spaced"}}]}',
    b'{"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7}}',
]


def _reader(endpoint: str, stream_options: dict[str, bool], client_streams: bool) -> Any:
    request = GenerationRequest(
        request_id="r",
        endpoint=endpoint,  # type: ignore[arg-type]
        model="m",
        prompt="p",
        image_count=0,
        sampling=SamplingParams(max_tokens=8),
        arrival_time=0.0,
        body={"stream_options": stream_options},
        stream_requested=client_streams,
    )
    return FrameReader.for_request(request, "http://u:1")


def _frames(*payloads: bytes) -> bytes:
    return b"".join(b"data: " + p + b"\n\n" for p in payloads)


def _summary(event: Any) -> tuple[object, ...]:
    return (event.text, event.new_tokens, event.prompt_tokens, event.output_tokens, event.finish_reason)


@pytest.mark.parametrize("client_streams", [True, False])
@pytest.mark.parametrize("options", [{}, {"include_usage": True, "continuous_usage_stats": True}])
def test_byte_level_chunk_reading_matches_json(client_streams: bool, options: dict[str, bool]) -> None:
    def events(fast: bool) -> list[object]:
        reader = _reader("chat", options, client_streams)
        if not fast:
            reader._fast = lambda payload: None
        out = [reader.feed(_frames(p)) for p in PLAIN + OTHER]
        return [None if e is None else _summary(e) for e in out] + [e.wire_frames for e in out if e is not None]

    with_fast, json_only = events(True), events(False)
    assert with_fast == json_only
    keep = bool(options)
    # (text, new tokens, prompt, output, finish) per chunk; None: nothing to send and no count changed.
    # The role chunk carries no token, content one each, reasoning one, a usage-carrying chunk what its
    # usage adds (counted also when not asked for; then stripped from the forwarded chunk).
    texts = ["", "t1 ", 'say "hi" caf\u00e9\n', "", "", "x", "y", "spaced", ""]
    counts = [(0, 0, 0), (1, 0, 1), (1, 0, 2), (0, 0, 2), (1, 0, 3), (2, 3, 5), (1, 3, 6), (1, 3, 7), (0, 3, 7)]
    finish = [None] * 6 + ["length", None, None]
    expected: list[object] = [
        (texts[i] if not client_streams else "", *counts[i], finish[i]) for i in range(len(counts))
    ]
    if client_streams:
        expected[8] = expected[8] if keep else None  # the usage-only chunk: sent only when asked for
    else:
        expected[0] = expected[3] = expected[8] = None
    assert with_fast[: len(counts)] == expected
    probe = _reader("chat", options, client_streams)
    read_by_bytes = [probe._fast(p) is not None for p in PLAIN + OTHER]
    assert read_by_bytes == [True, True, True, True, True, keep, False, False, False]
    wires = with_fast[len(counts) :]
    if not client_streams:
        assert wires == [None] * len(wires)
        return
    assert wires[:5] == [_frames(p) for p in PLAIN[:5]]  # forwarded byte for byte
    stripped = b'{"id":"c","choices":[{"index":0,"delta":{"content":"x"}}]}'
    assert wires[5] == _frames(PLAIN[5] if keep else stripped)
    if keep:
        assert wires[6:] == [_frames(OTHER[0]), _frames(OTHER[1]), _frames(OTHER[2])]
    else:
        # A client that asked for no usage: the finishing chunk waits for the usage chunk's fingerprint
        # (test_the_finishing_chunk_gets_the_dropped_usage_chunks_fingerprint), and goes out, in order, with
        # the next frame forwarded; the usage-only chunk is not sent.
        assert wires[6:] == [b"", _frames(OTHER[0], OTHER[1])]


def test_one_event_per_read_with_every_frame_and_partial_frames_kept() -> None:
    reader = _reader("chat", {}, True)
    data = _frames(PLAIN[1], PLAIN[1], PLAIN[1]) + b"data: " + PLAIN[1][:20]
    event = reader.feed(data)
    assert (event.new_tokens, event.output_tokens) == (3, 3)
    assert event.wire_frames == _frames(PLAIN[1], PLAIN[1], PLAIN[1])  # one write
    assert reader.feed(PLAIN[1][20:]) is None  # still no frame end
    event = reader.feed(b"\r\n\r\n: keep-alive comment\n\nevent: x\ndata: " + OTHER[0] + b"\n\ndata: [DONE]\n\n")
    assert (event.new_tokens, event.output_tokens, event.finish_reason) == (2, 5, "length")
    assert event.wire_frames == _frames(PLAIN[1], OTHER[0])  # comment and event: lines dropped, [DONE] ours
    assert reader.ended


def test_byte_level_reading_of_completions_chunks() -> None:
    reader = _reader("completions", {}, False)
    ev = reader.feed(_frames(b'{"choices":[{"index":0,"text":"a\\tb","finish_reason":null}]}'))
    assert (ev.text, ev.new_tokens) == ("a\tb", 1)
    assert reader.feed(_frames(b'{"choices":[{"index":0,"text":null}]}')) is None  # nothing new
    assert reader._fast(b'{"choices":[{"index":0,"text":"a"}]') is None  # truncated frame
    with pytest.raises(Exception, match="invalid JSON"):
        reader.feed(_frames(b'{"choices":[{"index":0,"text":"a"}]'))


ROLE = b'{"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}'
FINISH = b'{"id":"c","choices":[{"index":0,"delta":{"content":""},"finish_reason":"stop","stop_reason":null}]}'
FINAL_USAGE = b'{"id":"c","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":4}}'
DONE = b"data: [DONE]\n\n"


def _chat_chunk(text: str, usage: bytes = b"") -> bytes:
    return b'{"id":"c","choices":[{"index":0,"delta":{"content":"%s"},"finish_reason":null}]%s}' % (
        text.encode(),
        b',"usage":' + usage if usage else b"",
    )


def _splits(stream: bytes) -> list[list[bytes]]:
    """The stream in two reads at every byte, and one byte per read."""
    two = [[stream[:i], stream[i:]] for i in range(1, len(stream))]
    return [*two, [stream[i : i + 1] for i in range(len(stream))]]


def _feed(reader: FrameReader, reads: list[bytes]) -> list[tuple[int, OutputEvent]]:
    """(index of the read, its event) for every read that made one."""
    out = []
    for i, data in enumerate(reads):
        event = reader.feed(data)
        if event is not None:
            out.append((i, event))
    return out


def _read_of(reads: list[bytes], offset: int) -> int:
    """The index of the read that holds byte ``offset - 1`` of the stream (the read that completes a frame
    ending there)."""
    seen = 0
    for i, data in enumerate(reads):
        seen += len(data)
        if seen >= offset:
            return i
    raise AssertionError("offset past the stream")


@pytest.mark.parametrize("crlf", [False, True])
def test_a_chat_stream_split_anywhere_reads_the_same(crlf: bool) -> None:
    """Three content chunks, the finish, the final usage (asked for) and [DONE], split at every byte."""
    frames = _frames(ROLE, _chat_chunk("a"), _chat_chunk("b"), _chat_chunk("c"), FINISH, FINAL_USAGE)
    stream = frames + DONE
    first_token_ends = len(_frames(ROLE, _chat_chunk("a")))  # where the first content chunk's frame ends
    if crlf:  # SSE allows CRLF line ends; a split may fall between CR and LF
        stream = stream.replace(b"\n", b"\r\n")
        first_token_ends = len(_frames(ROLE, _chat_chunk("a")).replace(b"\n", b"\r\n"))
    for reads in _splits(stream):
        reader = _reader("chat", {"include_usage": True}, True)
        events = _feed(reader, reads)
        assert sum(e.new_tokens for _, e in events) == 3  # one per content chunk; the role chunk carries none
        assert (events[-1][1].prompt_tokens, events[-1][1].output_tokens) == (5, 4)  # the final usage's totals
        assert [e.finish_reason for _, e in events if e.finish_reason is not None] == [FinishReason.STOP]
        assert b"".join(e.wire_frames or b"" for _, e in events) == frames  # every frame but [DONE], as it came
        assert [e.text for _, e in events] == [""] * len(events)  # a streaming client: frames, no text
        assert (reader.finished, reader.ended, reader.source) == (True, True, "final_usage")
        first = next((i, e) for i, e in events if e.new_tokens)
        assert first[0] == _read_of(reads, first_token_ends)  # the read that completes the first content chunk
        assert [e.output_tokens for i, e in events if i < first[0]] == [0] * sum(i < first[0] for i, _ in events)


def test_a_completions_stream_for_a_non_streaming_client_split_anywhere_assembles_the_text() -> None:
    chunks = [b'{"choices":[{"index":0,"text":"%s","finish_reason":null}]}' % t for t in (b"he", b"llo", b"")]
    finish = b'{"choices":[{"index":0,"text":"!","finish_reason":"length"}]}'
    stream = _frames(*chunks, finish, FINAL_USAGE) + DONE
    for reads in _splits(stream):
        reader = _reader("completions", {}, False)
        events = _feed(reader, reads)
        assert "".join(e.text for _, e in events) == "hello!"
        assert sum(e.new_tokens for _, e in events) == 3  # "he", "llo", "!"; the empty chunk none
        assert (events[-1][1].prompt_tokens, events[-1][1].output_tokens) == (5, 4)
        assert [e.finish_reason for _, e in events if e.finish_reason is not None] == [FinishReason.LENGTH]
        assert [e.wire_frames for _, e in events] == [None] * len(events)  # nothing forwarded
        assert (reader.finished, reader.ended, reader.source) == (True, True, "final_usage")


@pytest.mark.parametrize(
    ("options", "usage", "tokens", "source"),
    [
        ({"include_usage": True, "continuous_usage_stats": True}, [b"2", b"4", b"6"], 6, "usage"),
        ({}, [b"", b"", b""], 3, None),  # no usage at all: one token per content chunk
    ],
)
def test_token_sources_split_anywhere(
    options: dict[str, bool], usage: list[bytes], tokens: int, source: str | None
) -> None:
    """Running usage counts (speculative decoding: two tokens a chunk) are taken as they are; without usage
    each content chunk counts one."""
    chunks = [
        _chat_chunk(t, b'{"prompt_tokens":5,"completion_tokens":%s}' % u if u else b"")
        for t, u in zip("abc", usage, strict=True)
    ]
    finish = b'{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}'
    stream = _frames(*chunks, finish) + DONE
    for reads in _splits(stream):
        reader = _reader("chat", options, True)
        events = _feed(reader, reads)
        totals = [0] + [e.output_tokens for _, e in events]
        assert [e.new_tokens for _, e in events] == [b - a for a, b in zip(totals, totals[1:], strict=False)]
        assert sum(e.new_tokens for _, e in events) == tokens
        assert events[-1][1].output_tokens == tokens
        assert events[-1][1].prompt_tokens == (5 if usage[0] else 0)
        assert b"".join(e.wire_frames or b"" for _, e in events) == _frames(*chunks, finish)
        assert (reader.finished, reader.ended, reader.source) == (True, True, source)


def _content_frame(endpoint: str, value: bytes, *, tail: bytes = b',"logprobs":null,"finish_reason":null}]}') -> bytes:
    key = b'"delta":{"content":' if endpoint == "chat" else b'"text":'
    close = b"}" if endpoint == "chat" else b""
    return _frames(
        b'{"id":"c","object":"x","created":1,"model":"m","choices":[{"index":0,' + key + value + close + tail
    )


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize(
    "options", [{}, {"include_usage": True}, {"include_usage": True, "continuous_usage_stats": True}]
)
def test_reads_matched_on_the_learned_chunk_count_as_the_byte_search_does(
    endpoint: str, options: dict[str, bool]
) -> None:
    """A read with the bytes of the last plain content chunk around another plain string is counted without
    the byte search (FrameReader._learn); every other read is not. Events, counts and forwarded bytes are
    the same as with the byte search on every read."""
    values = [b'"a"', b'" b c"', b'"error"', b'"errors"', b'"say \\"hi\\""', b'"a\\\\"', b'"caf\\u00e9"',
              b'"x\\ny"', b'""', b"null", b'"d"', b'"e"', b'"f"']  # fmt: skip
    reads = [_content_frame(endpoint, v) for v in values]
    reads += [
        _content_frame(endpoint, b'"g"', tail=b',"logprobs":null,"finish_reason":"stop","stop_reason":null}]}'),
        _content_frame(
            endpoint,
            b'"h"',
            tail=b',"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":3,"completion_tokens":9}}',
        ),
        _content_frame(endpoint, b'"i"'),
        _content_frame(endpoint, b'"j"') + _content_frame(endpoint, b'"k"'),  # two frames in one read
        _content_frame(endpoint, b'"l"')[:-1],  # no frame end yet
        b"\n",
        _content_frame(endpoint, b'"m"').replace(b'"id":"c"', b'"id":"other"'),
        _content_frame(endpoint, b'"n"').replace(b'"id":"c"', b'"id":"other"'),
        _content_frame(endpoint, b'"o"', tail=b':"p","logprobs":null,"finish_reason":null}]}'),
        _content_frame(endpoint, b'"q"', tail=b"}]}"),
        _content_frame(endpoint, b'"r"', tail=b"}]}"),
        _frames(FINAL_USAGE),
        DONE,
    ]

    def run(learn: bool) -> tuple[list[object], tuple[object, ...], int]:
        reader = _reader(endpoint, options, True)
        searched = 0
        fast = reader._fast

        def counting_fast(payload: bytes) -> bool | None:
            nonlocal searched
            searched += 1
            kept: bool | None = fast(payload)
            return kept

        reader._fast = counting_fast
        if not learn:
            reader._learn = lambda data: None
        events: list[object] = []
        for data in reads:
            event = reader.feed(data)
            events.append(None if event is None else (*_summary(event), event.wire_frames))
        state = (reader.prompt_tokens, reader.output_tokens, reader.finished, reader.ended, reader.source)
        return events, (*state, reader._content_chunks), searched

    learned, searched = run(True), run(False)
    assert learned[:2] == searched[:2]
    # Read without the byte search: "b c", "errors", "d", "e", "f", "i", "n", "r" (after a chunk like them).
    assert searched[2] - learned[2] == 8
    # (new tokens, output tokens) per read; None: nothing to send and no count changed.
    counts = [None if e is None else (e[1], e[3]) for e in learned[0]]  # type: ignore[index]
    assert counts == [*((1, n) for n in range(1, 9)), (0, 8), (0, 8), (1, 9), (1, 10), (1, 11), (1, 12), (0, 12),
                      (1, 13), (2, 15), None, *((1, n) for n in range(16, 22)), (0, 21), None]  # fmt: skip
    assert learned[1] == (5, 21, True, True, "final_usage", 22)


LAST = (
    b'{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"z"},'
    b'"finish_reason":"length"}]}'
)
LAST_USAGE = b'{"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2},"system_fingerprint":"fp-\\"1"}'


@pytest.mark.parametrize("split", [False, True])
def test_the_finishing_chunk_gets_the_dropped_usage_chunks_fingerprint(split: bool) -> None:
    """vLLM writes its system_fingerprint on a stream's last chunk: the usage chunk when usage was asked for,
    else the finishing chunk, as its last field. The proxy always asks for usage; a client that did not gets
    the finishing chunk as vLLM would have written it for that client: with the fingerprint's bytes last."""
    reads = (
        [_frames(LAST), _frames(LAST_USAGE) + b"data: [DONE]\n\n"]
        if split
        else [_frames(LAST, LAST_USAGE) + b"data: [DONE]\n\n"]
    )
    reader = _reader("chat", {}, True)
    events = [reader.feed(r) for r in reads]
    spliced = _frames(LAST[:-1] + b',"system_fingerprint":"fp-\\"1"}')
    assert [e.wire_frames for e in events] == ([b"", spliced] if split else [spliced])
    assert (events[0].new_tokens, events[0].finish_reason) == (1, FinishReason.LENGTH)
    assert (reader.output_tokens, reader.ended) == (2, True)
    asked = _reader("chat", {"include_usage": True}, True)  # a client that asked for usage: vLLM's bytes
    assert [asked.feed(r).wire_frames for r in reads] == (
        [_frames(LAST), _frames(LAST_USAGE)] if split else [_frames(LAST, LAST_USAGE)]
    )


def test_a_held_finishing_chunk_is_sent_as_it_came_without_a_fingerprint() -> None:
    reader = _reader("chat", {}, True)
    assert reader.feed(_frames(LAST)).wire_frames == b""
    assert reader.take_held() == _frames(LAST)  # the stream ended without usage or [DONE]
    assert reader.take_held() is None
    reader = _reader("chat", {}, True)
    no_fingerprint = b'{"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}'
    assert reader.feed(_frames(LAST, no_fingerprint) + b"data: [DONE]\n\n").wire_frames == _frames(LAST)


def test_the_fingerprint_splice_reads_the_same_split_anywhere() -> None:
    stream = _frames(ROLE, _chat_chunk("a"), _chat_chunk("b"), LAST, LAST_USAGE) + DONE
    expected = _frames(ROLE, _chat_chunk("a"), _chat_chunk("b"), LAST[:-1] + b',"system_fingerprint":"fp-\\"1"}')
    for reads in _splits(stream):
        reader = _reader("chat", {}, True)
        events = _feed(reader, reads)
        assert b"".join(e.wire_frames or b"" for _, e in events) == expected
        assert (sum(e.new_tokens for _, e in events), reader.output_tokens, reader.ended) == (3, 3, True)
