"""The ``dsh-agent`` command line: ``run``, ``chat``, ``sessions``, ``simulate``, ``bench``.

Only this layer reads the user settings file (``$XDG_CONFIG_HOME/dsh-agent/settings.yaml``);
everything it does goes through the public runtime API.
"""

from __future__ import annotations

from ._app import main as main

__all__ = ["main"]
