"""Multi-turn conversations: each turn carries the conversation so far; think time; closed and open loop."""

from __future__ import annotations

import json
from typing import Any

import pytest

from loadgen.execute import Recorder
from loadgen.metrics import bucket_bounds
from loadgen.profile import Profile, ProfileError, parse_profile
from loadgen.prompts import PreparedRequest, PromptFactory
from loadgen.record import RequestRecord
from loadgen.sse import StreamParser
from loadgen.store import Store
from loadgen.workload import TURN_FIGURES_MAX, Workload, WorkloadStats, turn_key, workload_block
from loadlens.contracts.slo import load_slos
from tests.loadgen.one_executor import FakeUser
from tests.loadgen.one_executor import executor as one_process

BOUNDS = bucket_bounds(load_slos(None))


def profile(traffic: list[dict[str, Any]], **top: Any) -> Profile:
    return parse_profile(
        {"version": 1, "name": "t", "traffic": traffic, "stages": [{"name": "s", "users": 1, "duration": 1}], **top}
    )


CHAT = {
    "name": "conv",
    "prompt": {"tokens": 6},
    "output_tokens": 4,
    "prefix": {"count": 1, "tokens": 5},
    "conversation": {"turns": 3, "think_time_s": 2.5},
}


class Owner:
    """A closed-loop user (only its identity matters to the workload)."""


def ok(prompt_tokens: int, content: str = "r1 r2", ttft: float = 0.01) -> RequestRecord:
    return RequestRecord(ttft=ttft, e2e=0.02, output_tokens=2, prompt_tokens=prompt_tokens, content=content)


def workload(p: Profile, seed: int = 3) -> tuple[Workload, WorkloadStats]:
    return Workload(p, PromptFactory(p, seed=seed), seed=seed, process_index=0), WorkloadStats(BOUNDS["ttft"])


def body(req: PreparedRequest) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(req.body)
    return doc


def test_each_chat_turn_is_the_previous_turn_plus_its_reply_plus_a_new_user_turn() -> None:
    w, stats = workload(profile([CHAT]))
    user = Owner()
    first = w.next(owner=user, now=0.0, default_model="m", stage="s", stats=stats)
    b1 = body(first.request)
    assert [m["role"] for m in b1["messages"]] == ["system", "user"]
    assert w.finish(first, ok(40, "aa bb"), now=1.0, stage="s", stats=stats) == 2.5  # think time, exactly
    second = w.next(owner=user, now=3.5, default_model="m", stage="s", stats=stats)
    b2 = body(second.request)
    assert b2["messages"][:2] == b1["messages"]
    assert b2["messages"][2] == {"role": "assistant", "content": "aa bb"}
    assert b2["messages"][3]["role"] == "user" and len(b2["messages"][3]["content"].split()) == 6
    assert len(b2["messages"]) == 4 and b2["max_tokens"] == 4 and b2["model"] == "m" and b2["stream"] is True
    # The whole previous prompt is the shared part a prefix cache holds: its usage.prompt_tokens.
    assert second.shared == 40 and second.conversation is first.conversation
    w.finish(second, ok(60, "cc"), now=4.0, stage="s", stats=stats)
    third = w.next(owner=user, now=7.0, default_model="m", stage="s", stats=stats)
    b3 = body(third.request)
    assert b3["messages"][:4] == b2["messages"] and b3["messages"][4] == {"role": "assistant", "content": "cc"}
    assert len(b3["messages"]) == 6 and third.shared == 60
    assert w.finish(third, ok(80), now=8.0, stage="s", stats=stats) == 0.0  # the last turn: no think time
    # After the last turn the user starts a new conversation (first turn: the system prompt is shared).
    fourth = w.next(owner=user, now=8.0, default_model="m", stage="s", stats=stats)
    assert [m["role"] for m in body(fourth.request)["messages"]] == ["system", "user"]
    assert body(fourth.request)["messages"][0] == b1["messages"][0] and fourth.shared == 5
    s = stats.stages["s"]
    assert (s.conversations_started, s.conversations_completed, s.conversations_ended_early) == (2, 1, 0)
    assert {k: (t.completed, t.prompt_tokens) for k, t in s.turns.items()} == {"1": (1, 40), "2": (1, 60), "3": (1, 80)}


def test_completions_turns_concatenate_prompt_reply_and_the_new_text() -> None:
    p = profile([{**CHAT, "endpoint": "completions", "prefix": None}])
    w, stats = workload(p)
    user = Owner()
    first = w.next(owner=user, now=0.0, default_model="m", stage="s", stats=stats)
    p1 = body(first.request)["prompt"]
    w.finish(first, ok(7, " xx yy"), now=0.1, stage="s", stats=stats)
    second = w.next(owner=user, now=3.0, default_model="m", stage="s", stats=stats)
    p2 = body(second.request)["prompt"]
    assert p2.startswith(p1 + " xx yy\n") and len(p2[len(p1 + " xx yy\n") :].split()) == 6
    assert second.request.path == "/v1/completions"
    assert second.shared == 6  # the previous prompt minus its last token (it may merge with the reply)


def test_a_failed_turn_ends_its_conversation_and_a_cancelled_one_ends_nothing() -> None:
    w, stats = workload(profile([CHAT]))
    user = Owner()
    first = w.next(owner=user, now=0.0, default_model="m", stage="s", stats=stats)
    w.finish(first, RequestRecord(outcome="server_error", reason="HTTP 500"), now=0.1, stage="s", stats=stats)
    again = w.next(owner=user, now=0.2, default_model="m", stage="s", stats=stats)
    assert again.conversation is not first.conversation and again.conversation is not None
    assert again.conversation.turn == 1
    w.finish(again, RequestRecord(outcome="cancelled"), now=0.3, stage="s", stats=stats)
    s = stats.stages["s"]
    assert (s.conversations_started, s.conversations_completed, s.conversations_ended_early) == (2, 0, 1)
    assert s.requests == 0 and s.turns == {}  # failures carry no per-turn figures


def test_open_loop_arrivals_take_the_longest_ready_conversation_else_start_one() -> None:
    w, stats = workload(profile([CHAT]))
    a = w.next(owner=None, now=0.0, default_model="m", stage="s", stats=stats)
    b = w.next(owner=None, now=0.1, default_model="m", stage="s", stats=stats)
    assert a.conversation is not b.conversation
    assert w.finish(b, ok(30), now=1.0, stage="s", stats=stats) == 0.0  # open loop: nobody waits
    assert w.finish(a, ok(30), now=1.5, stage="s", stats=stats) == 0.0
    assert w.pending == 2
    # Both think 2.5 s: an arrival at 3.6 s finds only b ready (since 1.0 + 2.5), so it takes b's turn 2.
    c = w.next(owner=None, now=3.6, default_model="m", stage="s", stats=stats)
    assert c.conversation is b.conversation and c.conversation is not None and c.conversation.turn == 2
    d = w.next(owner=None, now=3.7, default_model="m", stage="s", stats=stats)  # a is not ready before 4.0
    assert d.conversation not in (a.conversation, b.conversation) and d.conversation is not None
    assert d.conversation.turn == 1
    e = w.next(owner=None, now=4.0, default_model="m", stage="s", stats=stats)
    assert e.conversation is a.conversation and w.pending == 0


def test_user_turns_are_the_same_in_every_run_whatever_the_replies_timing() -> None:
    def texts(delay: float) -> list[str]:
        w, stats = workload(profile([CHAT]), seed=9)
        user = Owner()
        out = []
        t = 0.0
        for _ in range(3):
            turn = w.next(owner=user, now=t, default_model="m", stage="s", stats=stats)
            out.append(body(turn.request)["messages"][-1]["content"])
            t += delay
            w.finish(turn, ok(10, "same"), now=t, stage="s", stats=stats)
        return out

    assert texts(0.1) == texts(7.0)
    assert len(set(texts(0.1))) == 3


def test_turns_drawn_from_a_distribution_stay_within_it() -> None:
    p = profile([{**CHAT, "conversation": {"turns": {"mean": 3, "stdev": 2, "min": 2, "max": 4}}}])
    w, stats = workload(p)
    counts = []
    for _ in range(40):
        turn = w.next(owner=None, now=0.0, default_model="m", stage="s", stats=stats)
        assert turn.conversation is not None
        counts.append(turn.conversation.turns)
    assert set(counts) <= {2, 3, 4} and len(set(counts)) > 1


def test_per_turn_figures_and_the_32_plus_bucket() -> None:
    stats = WorkloadStats(BOUNDS["ttft"])
    for turn, tokens in ((1, 100), (1, 120), (2, 200), (40, 9000), (TURN_FIGURES_MAX, 5000)):
        stats.record("s", ok(tokens, ttft=tokens / 1e4), shared=0, block_size=16, turn=turn)
    assert turn_key(31) == "31" and turn_key(32) == "32+" and turn_key(99) == "32+"
    block = workload_block(stats, ["s"], 16)
    assert list(block["turns"]) == ["1", "2", "32+"]
    assert block["turns"]["1"]["completed"] == 2 and block["turns"]["1"]["mean_prompt_tokens"] == 110.0
    assert block["turns"]["1"]["mean_ttft_ms"] == pytest.approx(11.0)
    assert block["turns"]["32+"] == {
        "completed": 2,
        "mean_prompt_tokens": 7000.0,
        "mean_ttft_ms": pytest.approx(700.0),
        "p50_ttft_ms": pytest.approx(500.0, rel=1e-3),
        "p99_ttft_ms": pytest.approx(900.0, rel=1e-3),
    }


def test_workload_figures_travel_and_merge_with_the_store() -> None:
    a, b = Store(BOUNDS), Store(BOUNDS)
    a.workload.record("s", ok(100), shared=64, block_size=16, turn=2)
    a.workload.stage("s").conversations_started += 1
    b.workload.record("s", ok(50), shared=0, block_size=16, turn=2)
    b.workload.stage("t").conversations_ended_early += 1
    master = Store(BOUNDS)
    master.merge(Store.from_wire(BOUNDS, a.take_delta()))
    master.merge(Store.from_wire(BOUNDS, b.to_wire()))
    assert a.workload.stages == {}  # the delta emptied the worker's figures
    s = master.workload.stages["s"]
    assert (s.requests, s.prompt_tokens, s.expected_hit_tokens, s.conversations_started) == (2, 150, 64, 1)
    assert s.turns["2"].completed == 2 and s.turns["2"].ttft.count == 2
    assert master.workload.stages["t"].conversations_ended_early == 1


def test_the_stream_parser_keeps_the_reply_text_only_when_asked() -> None:
    lines = [
        b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n',
        b'data: {"choices":[{"delta":{"content":"Hel"}}],"usage":{"completion_tokens":1}}\n',
        b'data: {"choices":[{"delta":{"reasoning_content":"hmm"}}],"usage":{"completion_tokens":2}}\n',
        b'data: {"choices":[{"delta":{"content":"lo \\"w\\"\\n"}}],"usage":{"completion_tokens":3}}\n',
        b'data: {"choices": [{"delta": {"content": " there"}}], "usage": {"completion_tokens": 4}}\n',
        b"data: [DONE]\n",
    ]

    def run(collect: bool) -> RequestRecord:
        parser = StreamParser(chat=True, start=0.0, collect=collect)
        for i, line in enumerate(lines):
            if parser.feed(line, 0.1 * (i + 1)):
                break
        return parser.finish(1.0)

    assert run(True).content == 'Hello "w"\n there' and run(True).ok
    assert run(False).content is None
    completions = StreamParser(chat=False, start=0.0, collect=True)
    completions.feed(b'data: {"choices":[{"text":" ab"}]}\n', 0.1)
    completions.feed(b'data: {"choices":[{"text":" cd"}]}\n', 0.2)
    completions.feed(b"data: [DONE]\n", 0.3)
    assert completions.finish(0.3).content == " ab cd"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"conversation": {"think_time_s": 1}}, "traffic[0].conversation.turns: missing"),
        ({"conversation": {"turns": 0}}, "traffic[0].conversation.turns.mean: must be > 0, got 0"),
        ({"conversation": {"turns": 2, "think_time_s": -1}}, "traffic[0].conversation.think_time_s.mean: must be"),
        ({"conversation": {"turns": 2, "pause": 1}}, "traffic[0].conversation.pause: unknown field"),
        (
            {"conversation": {"turns": 2, "think_time_s": {"mean": 5, "max": 2}}},
            "traffic[0].conversation.think_time_s.mean: 5 is outside [min 0, max 2]",
        ),
        (
            {"conversation": {"turns": 2}, "images": {"count": 1}},
            "traffic[0].conversation: images are not supported",
        ),
    ],
)
def test_conversation_fields_are_validated_with_their_path(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(ProfileError) as err:
        profile([{"name": "c", **entry}])
    assert str(err.value).startswith(message), str(err.value)


def test_the_executor_sends_turns_and_makes_the_user_think_between_them() -> None:
    p = profile([{**CHAT, "conversation": {"turns": 2, "think_time_s": 0.75}}])
    recorder = Recorder(Store(BOUNDS), "s")
    sent: list[dict[str, Any]] = []
    replies = iter(["first reply", "second reply", "third"])

    def send(*args: Any) -> tuple[RequestRecord, bool, float | None]:
        request: PreparedRequest = args[2]
        sent.append(body(request))
        return ok(10 * len(sent), next(replies)), True, None

    executor = one_process(p, recorder, send, entry="conv")
    user = FakeUser()
    assert executor.run(user) and user.backoff == 0.75
    user.backoff = 0.0
    assert executor.run(user) and user.backoff == 0.0  # the conversation's last turn: no think time after it
    assert executor.run(user)
    assert sent[1]["messages"][2] == {"role": "assistant", "content": "first reply"}
    assert len(sent[2]["messages"]) == 2  # a new conversation
    s = recorder.store.workload.stages["s"]
    assert (s.conversations_started, s.conversations_completed) == (2, 1)
    assert {k: t.completed for k, t in s.turns.items()} == {"1": 2, "2": 1}
