"""``--reports DIR``: the simulation reports the server lists and serves (docs/serve.md#reports).

Only regular ``*.html`` files directly in DIR are reports: ``GET /api/reports`` lists them
(name, size, modification time, newest first) and ``GET /reports/{name}`` serves one. A name is
checked before any path is built (one path segment of letters, digits, ``.``, ``_`` and ``-``,
ending ``.html``, not starting with a dot), and the resolved file must still lie in DIR, so no
request reaches a file elsewhere (``..``, an encoded slash, or a symlink out of DIR). The reports
are pages of their own (inline SVG, no script), served with a policy that lets them load nothing.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final

import trio
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response

from .api import state_of
from .replies import ApiError

#: A report's file name.
NAME: Final = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,199}\.html")
#: The most reports listed.
MAX_LISTED: Final = 1000
#: What a served report may load: nothing but its own inline styles and images.
POLICY: Final = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def _report_files(folder: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for entry in folder.iterdir():
        if not NAME.fullmatch(entry.name) or entry.is_symlink() or not entry.is_file():
            continue
        stat = entry.stat()
        rows.append({"name": entry.name, "size": stat.st_size, "modified": stat.st_mtime})
    rows.sort(key=lambda row: (-row["modified"], row["name"]))
    return rows[:MAX_LISTED]


async def list_reports(request: Request) -> Response:
    """``GET /api/reports``: the reports in ``--reports DIR`` (none without it)."""
    ctx, _ = state_of(request)
    folder = ctx.reports_dir
    if folder is None:
        return JSONResponse({"reports": []})
    rows = await trio.to_thread.run_sync(_report_files, folder)
    return JSONResponse({"reports": rows})


def _resolve(folder: Path, name: str) -> Path | None:
    if not NAME.fullmatch(name):
        return None
    base = folder.resolve()
    path = (base / name).resolve()
    if path.parent != base or not path.is_file():
        return None
    return path


async def report(request: Request) -> Response:
    """``GET /reports/{name}``: one report file."""
    ctx, _ = state_of(request)
    name = request.path_params["name"]
    folder = ctx.reports_dir
    path = None if folder is None else await trio.to_thread.run_sync(_resolve, folder, name)
    if path is None:
        raise ApiError(404, "NOT_FOUND", f"no report {name!r}")
    headers = {"content-security-policy": POLICY, "x-content-type-options": "nosniff"}
    return FileResponse(path, media_type="text/html; charset=utf-8", headers=headers)
