"""StreamParser: scripted SSE lines with exact arrival times, so every definition is checked to the nanosecond."""

from __future__ import annotations

import json
from typing import Any

import pytest

from loadgen.sse import StreamParser


def chat_chunk(content: str | None, completion: int | None = None, *, role: bool = False, reasoning: str = "") -> bytes:
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = "assistant"
    if content is not None:
        delta["content"] = content
    if reasoning:
        delta["reasoning_content"] = reasoning
    obj: dict[str, Any] = {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}
    if completion is not None:
        obj["usage"] = {"prompt_tokens": 7, "completion_tokens": completion, "total_tokens": 7 + completion}
    return b"data: " + json.dumps(obj).encode() + b"\n"


def usage_chunk(completion: int, prompt: int = 7) -> bytes:
    obj = {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}
    return b"data: " + json.dumps(obj).encode() + b"\n"


DONE = b"data: [DONE]\n"


def run(lines: list[tuple[float, bytes]], *, chat: bool = True, start: float = 100.0) -> Any:
    parser = StreamParser(chat=chat, start=start)
    for t, line in lines:
        if parser.feed(line, t):
            break
    return parser.finish(999.0)


def test_ttft_skips_role_and_empty_chunks_and_itl_is_per_token_from_usage() -> None:
    record = run(
        [
            (100.010, chat_chunk("", 0, role=True)),  # role-only: not the first token
            (100.011, b"\n"),
            (100.050, chat_chunk("Hel", 1)),
            (100.060, chat_chunk("lo", 2)),
            (100.090, chat_chunk(" wor", 5)),  # three tokens in one chunk after 30 ms
            (100.100, chat_chunk("", 5)),  # finish chunk, no new tokens
            (100.101, usage_chunk(5)),
            (100.102, DONE),
        ]
    )
    assert record.ok
    assert record.ttft == pytest.approx(0.050)
    assert record.e2e == pytest.approx(0.102)
    assert record.output_tokens == 5
    assert record.prompt_tokens == 7
    assert record.itl_source == "usage"
    assert [(round(g, 6), n) for g, n in record.itl] == [(0.010, 1), (0.010, 3)]
    assert record.chunk_gaps == pytest.approx([0.010, 0.030])
    assert record.tpot == pytest.approx((0.102 - 0.050) / 4)
    assert record.itl_samples() == record.itl


def test_without_continuous_usage_chunk_gaps_stand_in_and_final_usage_gives_n() -> None:
    record = run(
        [
            (100.020, chat_chunk("a")),
            (100.030, chat_chunk("bc")),
            (100.045, chat_chunk("d")),
            (100.046, usage_chunk(6)),  # include_usage only: a total, never an ITL sample
            (100.047, DONE),
        ]
    )
    assert record.itl_source == "chunk"
    assert record.itl == []
    assert record.itl_samples() == [(pytest.approx(0.010), 1), (pytest.approx(0.015), 1)]
    assert record.output_tokens == 6


def test_usage_on_the_finish_chunk_is_a_total_and_chunk_gaps_stand_in() -> None:
    # Older llama-server builds: no usage until the last chunk, which has both choices (finish_reason) and usage.
    def finish(completion: int) -> bytes:
        obj = {
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 4, "completion_tokens": completion, "total_tokens": 4 + completion},
        }
        return b"data: " + json.dumps(obj).encode() + b"\n"

    record = run(
        [
            (100.020, chat_chunk("a")),
            (100.030, chat_chunk("b")),
            (100.045, chat_chunk("c")),
            (100.050, chat_chunk("d")),
            (100.070, chat_chunk("e")),
            (100.071, finish(5)),
            (100.072, DONE),
        ]
    )
    assert record.ok and record.output_tokens == 5 and record.prompt_tokens == 4 and record.usage_reported
    assert record.itl_source == "chunk"  # counted as a fallback request by the store
    assert record.itl == []
    assert [(round(g, 6), n) for g, n in record.itl_samples()] == [(0.01, 1), (0.015, 1), (0.005, 1), (0.02, 1)]


def test_usage_on_the_finish_chunk_with_text_in_it() -> None:
    # The same, when the finish chunk also carries the last piece of text: that chunk still counts as content.
    def last(text: str, completion: int) -> bytes:
        obj = {
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 4, "completion_tokens": completion},
        }
        return b"data: " + json.dumps(obj).encode() + b"\n"

    record = run([(100.02, chat_chunk("a")), (100.03, chat_chunk("b")), (100.05, last("c", 3)), (100.06, DONE)])
    assert record.itl_source == "chunk" and record.output_tokens == 3 and record.chunks == 3
    assert [round(g, 6) for g, _ in record.itl_samples()] == [0.01, 0.02]


def test_no_usage_at_all_counts_content_chunks() -> None:
    record = run([(100.02, chat_chunk("a")), (100.03, chat_chunk("b")), (100.04, DONE)])
    assert record.output_tokens == 2
    assert not record.usage_reported


def test_reasoning_content_counts_as_first_token() -> None:
    record = run([(100.03, chat_chunk(None, reasoning="think")), (100.05, chat_chunk("x")), (100.06, DONE)])
    assert record.ttft == pytest.approx(0.03)


def test_completions_text_field() -> None:
    def chunk(text: str, n: int) -> bytes:
        obj = {"choices": [{"index": 0, "text": text}], "usage": {"prompt_tokens": 3, "completion_tokens": n}}
        return b"data: " + json.dumps(obj).encode() + b"\r\n"

    record = run([(100.02, chunk("", 0)), (100.04, chunk("a", 1)), (100.05, chunk("b", 2)), (100.06, DONE)], chat=False)
    assert record.ttft == pytest.approx(0.04)
    assert record.itl == [(pytest.approx(0.01), 1)]


@pytest.mark.parametrize(
    ("lines", "reason"),
    [
        ([(100.1, chat_chunk("a", 1))], "stream ended without [DONE]"),
        ([(100.1, chat_chunk("", 0, role=True)), (100.2, DONE)], "no content in the stream"),
        (
            [
                (100.1, chat_chunk("a", 1)),
                (100.2, b'data: {"error": {"message": "boom", "type": "InternalServerError"}}\n'),
            ],
            "InternalServerError: boom",
        ),
        ([(100.1, b"data: {not json\n")], "malformed SSE JSON"),
    ],
)
def test_stream_failures_are_stream_errors(lines: list[tuple[float, bytes]], reason: str) -> None:
    record = run(lines)
    assert record.outcome == "stream_error"
    assert record.reason == reason


def test_comments_and_other_fields_are_ignored() -> None:
    record = run(
        [(100.0, b": keep-alive\n"), (100.0, b"event: message\n"), (100.01, chat_chunk("a", 1)), (100.02, DONE)]
    )
    assert record.ok and record.ttft == pytest.approx(0.01)
