"""Unit tests of ``llm/_bench_sse.py``: the SSE benchmark's transcript and its arithmetic.

Nothing here measures speed: the clock is replaced by a scripted one where timing matters.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from dsh_agent_loop.llm import _bench_sse
from dsh_agent_loop.llm._base import BlockEnd, BlockStart, Chunk, Finish, TextDelta, UsageChunk
from dsh_agent_loop.llm._bench_sse import _frames, _json_once, _parse_once, _pieces, run_sse_bench
from dsh_agent_loop.llm._openai import OpenAIStreamDecoder
from dsh_agent_loop.llm._sse import SSEParser

WORDS = ("The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", ".")


def _decode(pieces: list[bytes]) -> list[Chunk]:
    parser = SSEParser()
    decoder = OpenAIStreamDecoder()
    chunks: list[Chunk] = []
    for piece in pieces:
        for event in parser.feed(piece):
            chunks += decoder.feed(event)
    assert parser.close() is False
    assert decoder.done is True
    return chunks


def test_frames_are_text_deltas_then_finish_then_usage() -> None:
    frames = [json.loads(f) for f in _frames(12)]
    assert len(frames) == 14
    assert all(f["object"] == "chat.completion.chunk" for f in frames)
    texts = [f["choices"][0]["delta"]["content"] for f in frames[:12]]
    assert texts == [*WORDS, *WORDS[:2]]
    assert all(f["choices"][0]["finish_reason"] is None for f in frames[:12])
    assert frames[12]["choices"] == [
        {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    ]
    assert frames[13]["choices"] == []
    assert frames[13]["usage"] == {"prompt_tokens": 10, "completion_tokens": 12, "total_tokens": 22}


def test_pieces_are_small_and_rejoin_to_the_whole_event_stream() -> None:
    frames = _frames(50)
    pieces = _pieces(frames)
    assert len(pieces) > 1
    assert all(0 < len(p) <= 256 for p in pieces)
    assert all(len(p) == 256 for p in pieces[:-1])
    data = b"".join(pieces)
    assert data.startswith(b"data: {")
    assert data.endswith(b"\n\ndata: [DONE]\n\n")
    assert data.count(b"\n\n") == len(frames) + 1
    events = list(SSEParser().feed(data))
    assert [e.data for e in events] == [*frames, "[DONE]"]


@pytest.mark.parametrize("n_chunks", [1, 10, 37])
def test_transcript_decodes_to_one_text_block_with_usage(n_chunks: int) -> None:
    chunks = _decode(_pieces(_frames(n_chunks)))
    text = "".join(c.text for c in chunks if isinstance(c, TextDelta))
    assert text == "".join(WORDS[i % len(WORDS)] for i in range(n_chunks))
    assert chunks[0] == BlockStart(0, "text")
    assert chunks[-3] == BlockEnd(0)
    usage, finish = chunks[-2:]
    assert isinstance(usage, UsageChunk)
    assert (usage.usage.input_tokens, usage.usage.output_tokens) == (10, n_chunks)
    assert finish == Finish("stop", stop_reason="stop")


def test_parse_once_counts_every_decoder_chunk() -> None:
    pieces = _pieces(_frames(25))
    elapsed, chunks = _parse_once(pieces)
    assert elapsed >= 0
    # 25 text deltas + block start + block end + usage + finish
    assert chunks == len(_decode(pieces)) == 29


def test_run_sse_bench_reports_rates_from_the_fastest_rounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each round reads the clock at parse start/end, then json start/end.
    durations = iter([4.0, 1.0, 2.0, 3.0, 8.0, 0.5])  # parse, json per round
    ticks: list[float] = []
    now = 0.0
    for d in durations:
        ticks += [now, now + d]
        now += d
    clock = iter(ticks)
    monkeypatch.setattr(_bench_sse, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    result = run_sse_bench(8, rounds=3)
    frames = 8 + 2
    assert result == {
        "sse_chunks_per_s": frames / 2.0,
        "json_loads_per_s": frames / 0.5,
        "ratio": (frames / 2.0) / (frames / 0.5),
        "chunks": 12.0,
    }
    assert next(clock, None) is None  # exactly three rounds ran


def test_run_sse_bench_runs_at_least_one_round(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([0.0, 1.0, 1.0, 3.0])
    monkeypatch.setattr(_bench_sse, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    result = run_sse_bench(3, rounds=0)
    assert result == {
        "sse_chunks_per_s": 5.0,
        "json_loads_per_s": 2.5,
        "ratio": 2.0,
        "chunks": 7.0,
    }


def test_run_sse_bench_with_the_real_clock_is_well_formed() -> None:
    result = run_sse_bench(20, rounds=1)
    assert set(result) == {"sse_chunks_per_s", "json_loads_per_s", "ratio", "chunks"}
    assert result["chunks"] == 24.0
    assert all(math.isfinite(v) and v > 0 for v in result.values())
    assert result["ratio"] == pytest.approx(result["sse_chunks_per_s"] / result["json_loads_per_s"])


def test_json_once_decodes_every_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    monkeypatch.setattr(_bench_sse, "json", SimpleNamespace(loads=seen.append))
    frames = ['{"a": 1}', '{"b": 2}']
    assert _json_once(frames) >= 0
    assert seen == frames
