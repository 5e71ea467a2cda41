"""Nothing of the server loads unless it runs: the root, the CLI and its other verbs import none
of the ``serve`` extra's packages, so a plain install pays nothing for them."""

from __future__ import annotations

import subprocess
import sys

EXTRA = ("starlette", "hypercorn", "ag_ui", "pydantic")


def test_the_package_and_the_cli_import_nothing_of_the_serve_extra() -> None:
    code = (
        "import sys\n"
        "import dsh_agent_loop, dsh_agent_loop.fleet\n"
        "from dsh_agent_loop.cli._app import build_parser\n"
        "build_parser().parse_args(['serve', '--port', '0'])\n"
        f"loaded = [m for m in {EXTRA!r} if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        "import dsh_agent_loop.serve\n"
        "assert 'starlette' in sys.modules and 'hypercorn' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
