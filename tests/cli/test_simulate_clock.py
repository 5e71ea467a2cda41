"""``dsh-agent simulate``: the progress bars' times are the summary's, read from one clock.

With its output piped the progress is printed once, as it ended, above the summary. Each bar's
time is its phase's: ``creating agents`` the summary's ``agents created in``, ``turns`` the
``steps ... in`` row, ``checking logs`` the ``logs read back and checked in``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .helpers import cli

#: A final progress line: description, bar, ``done/total``, seconds.
BAR = re.compile(r"^(creating agents|turns|checking logs)\s.*?(\d+)/(\d+) (\d+\.\d\d) s$")


def test_the_progress_bars_show_the_summarys_seconds(tmp_path: Path) -> None:
    done = cli(
        "simulate",
        "--agents",
        "200",
        "--turns",
        "3",
        "--latency-ms",
        "1",
        "--store",
        "sqlite:///sim.db",
        "--json",
        "sim.json",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    bars = {}
    for line in done.stdout.splitlines():
        found = BAR.match(line.strip())
        if found is not None:
            assert found[2] == found[3], line  # each bar ran to its end
            bars[found[1]] = found[4]
    assert set(bars) == {"creating agents", "turns", "checking logs"}, done.stdout
    summary = json.loads((tmp_path / "sim.json").read_text(encoding="utf-8"))
    out = done.stdout
    assert f"agents created in {bars['creating agents']} s" in out
    assert f"logs read back and checked in {bars['checking logs']} s" in out
    assert re.search(rf"│ steps\s+│\s+1,200 in {re.escape(bars['turns'])} s", out), out
    # The JSON's seconds are the same figures, unrounded.
    assert f"{summary['create_s']:.2f}" == bars["creating agents"]
    assert f"{summary['wall_s']:.2f}" == bars["turns"]
    assert f"{summary['check_s']:.2f}" == bars["checking logs"]
