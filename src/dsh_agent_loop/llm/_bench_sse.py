"""Benchmark: SSE parsing plus OpenAI frame normalisation, against a bare ``json.loads`` loop.

The transcript is built in memory (no HTTP): ``n_chunks`` text-delta frames shaped like real
chat-completion chunks, then the finish, usage and ``[DONE]`` frames. It is fed to the parser
in 256-byte pieces, so most frames are split across pieces as on a real connection. The
baseline decodes the same frames' JSON and nothing else, in the same run, so the ratio says
what parsing and normalisation cost on top of the JSON decoding every client must do.
"""

from __future__ import annotations

import json
import time
from typing import Final

from ._openai import OpenAIStreamDecoder
from ._sse import SSEParser

__all__ = ["run_sse_bench"]

_PIECE: Final = 256
_WORDS: Final = ("The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", ".")


def _frames(n_chunks: int) -> list[str]:
    head = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1733140000,
        "model": "gpt-4o-2024-08-06",
        "system_fingerprint": "fp_bench",
    }
    frames = []
    for i in range(n_chunks):
        delta = {"content": _WORDS[i % len(_WORDS)]}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        frames.append(json.dumps({**head, "choices": [choice], "usage": None}))
    finish = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    frames.append(json.dumps({**head, "choices": [finish], "usage": None}))
    usage = {"prompt_tokens": 10, "completion_tokens": n_chunks, "total_tokens": n_chunks + 10}
    frames.append(json.dumps({**head, "choices": [], "usage": usage}))
    return frames


def _pieces(frames: list[str]) -> list[bytes]:
    data = "".join(f"data: {frame}\n\n" for frame in frames).encode() + b"data: [DONE]\n\n"
    return [data[i : i + _PIECE] for i in range(0, len(data), _PIECE)]


def _parse_once(pieces: list[bytes]) -> tuple[float, int]:
    start = time.perf_counter()
    parser = SSEParser()
    decoder = OpenAIStreamDecoder()
    chunks = 0
    for piece in pieces:
        for event in parser.feed(piece):
            chunks += len(decoder.feed(event))
    parser.close()
    return time.perf_counter() - start, chunks


def _json_once(frames: list[str]) -> float:
    loads = json.loads
    start = time.perf_counter()
    for frame in frames:
        loads(frame)
    return time.perf_counter() - start


def run_sse_bench(n_chunks: int = 100_000, *, rounds: int = 3) -> dict[str, float]:
    """Measure parse + normalise throughput over ``n_chunks`` streamed text frames.

    Args:
        n_chunks: Text-delta frames in the transcript.
        rounds: Runs of each loop; the fastest counts (less scheduling noise).

    Returns:
        ``{"sse_chunks_per_s", "json_loads_per_s", "ratio", "chunks"}``: frames parsed and
        normalised per second, frames JSON-decoded per second, their ratio (parse / json),
        and the chunks the decoder produced in one run.
    """
    frames = _frames(n_chunks)
    pieces = _pieces(frames)
    parse_time = json_time = float("inf")
    chunks = 0
    for _ in range(max(1, rounds)):
        elapsed, chunks = _parse_once(pieces)
        parse_time = min(parse_time, elapsed)
        json_time = min(json_time, _json_once(frames))
    sse_rate = len(frames) / parse_time
    json_rate = len(frames) / json_time
    return {
        "sse_chunks_per_s": sse_rate,
        "json_loads_per_s": json_rate,
        "ratio": sse_rate / json_rate,
        "chunks": float(chunks),
    }
