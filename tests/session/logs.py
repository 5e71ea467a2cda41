"""A tiny builder for hand-made session logs (crash states, broken logs)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from dsh_agent_loop import Event


def _text(text: str) -> tuple[dict[str, Any], ...]:
    return ({"type": "text", "text": text},)


class LogBuilder:
    """Appends well-formed events with dense seqs; each method returns the new event's seq."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def add(
        self,
        type: str,
        data: dict[str, Any] | None = None,
        *,
        surface_op: Any = None,
        cites: Sequence[int] | None = None,
        ignorable: bool = False,
    ) -> int:
        seq = len(self.events)
        self.events.append(
            Event(
                type,
                seq,
                float(seq),
                data or {},
                ignorable=ignorable,
                surface_op=surface_op,
                source_event_seqs=cites,
            )
        )
        return seq

    def seed_end(self) -> int:
        return self.add("session/end-seed")

    def turn_start(self, turn: int) -> int:
        return self.add("turn/start", {"turn": turn})

    def turn_end(self, turn: int, kind: str = "completed") -> int:
        return self.add("turn/end", {"turn": turn, "reason": {"kind": kind}})

    def step_start(self, turn: int, step: int) -> int:
        return self.add("step/start", {"turn": turn, "step": step})

    def step_end(self, turn: int, step: int) -> int:
        return self.add("step/end", {"turn": turn, "step": step})

    def system(self, turn: int, step: int, text: str, *, replaces: int | None = None) -> int:
        data = {
            "turn": turn,
            "step": step,
            "message": {"role": "system", "content": _text(text) if text else ()},
        }
        if replaces is None:
            return self.add("system/message", data)
        op = {"op": "replace", "start_seq": replaces, "end_seq": replaces}
        return self.add("system/message", data, surface_op=op, cites=(replaces,))

    def user(self, message_id: str, text: str) -> int:
        return self.add(
            "user/message", {"message": {"role": "user", "id": message_id, "content": _text(text)}}
        )

    def assistant(
        self,
        turn: int,
        step: int,
        text: str = "",
        calls: Sequence[tuple[str, str, Any]] = (),
        *,
        interrupted: bool = False,
    ) -> int:
        content: list[dict[str, Any]] = list(_text(text)) if text else []
        for call_id, name, args in calls:
            raw = args if isinstance(args, str) else json.dumps(args)
            content.append(
                {"type": "tool-call", "call_id": call_id, "name": name, "arguments": raw}
            )
        data: dict[str, Any] = {
            "turn": turn,
            "step": step,
            "message": {"role": "assistant", "content": tuple(content)},
            "stream": {"attempt": 1, "finish": "tool-calls" if calls else "stop"},
        }
        if interrupted:
            data["interrupted"] = True
        return self.add("assistant/message", data)

    def tool_call(
        self, turn: int, step: int, call_id: str, name: str = "t", args: str = "{}"
    ) -> int:
        return self.add(
            "tool/call",
            {"turn": turn, "step": step, "call_id": call_id, "name": name, "arguments": args},
        )

    def tool_result(
        self,
        turn: int,
        step: int,
        call_id: str,
        cites: int,
        name: str = "t",
        text: str = "ok",
        error: str | None = None,
    ) -> int:
        block = {
            "type": "tool-result",
            "call_id": call_id,
            "name": name,
            "text": text,
            "is_error": error is not None,
        }
        data: dict[str, Any] = {
            "turn": turn,
            "step": step,
            "message": {"role": "tool", "call_id": call_id, "name": name, "content": (block,)},
        }
        if error is not None:
            data["error"] = {"name": error.title(), "code": error}
        return self.add("tool/result", data, cites=(cites,))


def reseq(events: Sequence[Event]) -> list[Event]:
    """The same events renumbered densely from 0."""
    return [e.with_seq(i) for i, e in enumerate(events)]
