"""``otel: true`` and ``--trace`` under the CLI (``cli/_trace.py``), through real subprocesses.

Spans go to OTLP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (a loopback collector here), to
stderr under ``--trace console``, and a config that asks for tracing where spans can go nowhere
says so in one stderr line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import trio

pytest.importorskip("opentelemetry.sdk")

CONFIG = """\
store: memory
providers:
  demo: {kind: scripted, replies: [{text: "Hello!"}], loop: true}
agents:
  - {id: main, provider: demo, model: m}
"""
INSTALL = "pip install 'dsh-agent-loop[otel-export]'"


def _cli(
    tmp_path: Path, *args: str, block: str | None = None, stdin: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """``dsh-agent ARGS``; ``block`` names a module the child cannot import (not installed)."""
    code = "import sys\n"
    if block is not None:
        code += f"sys.modules[{block!r}] = None\n"
    code += "from dsh_agent_loop.cli import main\nsys.exit(main())\n"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    environ.update(XDG_CONFIG_HOME=str(tmp_path / ".xdg"), COLUMNS="200", **env)
    environ.pop("DSH_AGENT_STORE", None)
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=tmp_path,
        input=stdin,
        stdin=subprocess.DEVNULL if stdin is None else None,
        capture_output=True,
        text=True,
        timeout=60,
        env=environ,
        check=False,
    )


def _write(tmp_path: Path, otel: str = "") -> None:
    (tmp_path / "agent.yaml").write_text(CONFIG + otel, encoding="utf-8")


def _spans(stderr: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def test_trace_console_prints_each_span_on_stderr(tmp_path: Path) -> None:
    _write(tmp_path)  # no otel key: --trace turns tracing on
    done = _cli(tmp_path, "run", "agent.yaml", "-p", "hi", "-q", "--trace", "console")
    assert done.returncode == 0, done.stderr
    assert "Hello!" in done.stdout
    spans = {span["name"]: span for span in _spans(done.stderr)}
    assert set(spans) == {"invoke_agent main", "chat m"}
    turn, chat = spans["invoke_agent main"], spans["chat m"]
    assert chat["parent_id"] == turn["context"]["span_id"]  # type: ignore[index]
    assert turn["resource"]["attributes"]["service.name"] == "dsh-agent"  # type: ignore[index]


def test_chat_takes_trace_console(tmp_path: Path) -> None:
    _write(tmp_path)
    done = _cli(tmp_path, "chat", "agent.yaml", "--trace", "console", stdin="hi\n/exit\n")
    assert done.returncode == 0, done.stderr
    assert "invoke_agent main" in [span["name"] for span in _spans(done.stderr)]


async def _collect(stream: trio.SocketStream, bodies: list[tuple[str, bytes]]) -> None:
    """One OTLP/HTTP request: its path and body are kept, the answer is an empty 200."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some()
        if not chunk:
            return
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(
        int(line.partition(":")[2]) for line in lines if line.lower().startswith("content-length:")
    )
    while len(body) < length:
        body += await stream.receive_some()
    bodies.append((lines[0].split()[1], body))
    await stream.send_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\n"
        b"Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    await stream.aclose()


async def test_otel_true_exports_to_the_otlp_endpoint(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    bodies: list[tuple[str, bytes]] = []
    _write(tmp_path, "otel: true\n")
    async with trio.open_nursery() as nursery:
        (listener,) = await nursery.start(
            partial(trio.serve_tcp, partial(_collect, bodies=bodies), 0, host="127.0.0.1")
        )
        port = listener.socket.getsockname()[1]
        endpoint = f"http://127.0.0.1:{port}"
        done = await trio.to_thread.run_sync(
            partial(
                _cli,
                tmp_path,
                "run",
                "agent.yaml",
                "-p",
                "hi",
                "-q",
                OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
            )
        )
        nursery.cancel_scope.cancel()
    assert done.returncode == 0, done.stderr
    assert "otel" not in done.stderr  # nothing to warn about
    assert bodies
    assert {path for path, _ in bodies} == {"/v1/traces"}
    names = []
    for _, body in bodies:
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                names.extend(span.name for span in scope_spans.spans)
    assert sorted(names) == ["chat m", "invoke_agent main"]


def test_otel_true_with_nowhere_to_send_spans_says_so(tmp_path: Path) -> None:
    _write(tmp_path, "otel: true\n")
    done = _cli(tmp_path, "run", "agent.yaml", "-p", "hi", "-q")
    assert done.returncode == 0, done.stderr
    assert (
        "agent.yaml: otel: true, but spans go nowhere: set OTEL_EXPORTER_OTLP_ENDPOINT, or pass"
        " --trace console"
    ) in done.stderr.splitlines()


def test_otel_true_without_the_sdk_warns_with_the_install_command(tmp_path: Path) -> None:
    _write(tmp_path, "otel: true\n")
    done = _cli(tmp_path, "run", "agent.yaml", "-p", "hi", "-q", block="opentelemetry.sdk")
    assert done.returncode == 0, done.stderr
    assert "Hello!" in done.stdout
    warning = [line for line in done.stderr.splitlines() if "otel" in line]
    assert warning == [
        f"agent.yaml: otel: true, but the OpenTelemetry SDK is not installed: no spans ({INSTALL})"
    ]
    done = _cli(
        tmp_path, "run", "agent.yaml", "-p", "hi", "--trace", "console", block="opentelemetry.sdk"
    )
    assert done.returncode == 2
    assert f"--trace console: the OpenTelemetry SDK is not installed ({INSTALL})" in done.stderr


def test_an_endpoint_without_the_exporter_package_warns(tmp_path: Path) -> None:
    _write(tmp_path, "otel: true\n")
    done = _cli(
        tmp_path,
        "run",
        "agent.yaml",
        "-p",
        "hi",
        "-q",
        "--trace",
        "console",
        block="opentelemetry.exporter.otlp.proto.http",
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9",
    )
    assert done.returncode == 0, done.stderr
    assert (
        "agent.yaml: otel: true: OTLP export needs opentelemetry-exporter-otlp-proto-http"
        f" ({INSTALL}); spans to http://127.0.0.1:9 are lost"
    ) in done.stderr
    assert len(_spans(done.stderr)) == 2  # the console still gets them
