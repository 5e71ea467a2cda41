"""A provider's secrets: the API key from its env var, header checks, and redaction.

Design: a key or a header value must never reach an error message, a log line, the session log
or a span. Three rules enforce it.

* A key read from the environment is stripped of surrounding whitespace (a CRLF ``.env``), and a
  key with a control or non-ASCII character inside is refused before any request is built, as an
  ``AUTH`` failure that names the variable and never the value: httpx and h11 quote a header value
  they reject whole in their exceptions, and such a failure used to be retried.
* Configured header names and values are checked the same way when the adapter is built
  (``ValueError`` naming the header, not its value).
* Every failure message built from an exception or a response passes through ``redact`` with
  the request's secrets, in case a server or a library echoes one back.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Final

from ._base import Failure, ModelError

__all__ = ["REDACTED", "check_headers", "is_clean", "read_api_key", "redact", "secret_forms"]

REDACTED: Final = "[redacted]"
_TOKEN: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""An HTTP header name (RFC 9110 ``token``)."""


def is_clean(value: str) -> bool:
    """Whether ``value`` can be sent in a header as it is: printable ASCII only."""
    return value.isascii() and value.isprintable()


def read_api_key(env: str | None) -> str | None:
    """The API key from env var ``env``, stripped (None when no var is configured).

    Raises:
        ModelError: ``AUTH`` when the variable is unset or blank, or when the key holds a
            control or non-ASCII character (the message names the variable, never the key).
    """
    if not env:
        return None
    key = (os.environ.get(env) or "").strip()
    if not key:
        raise ModelError(Failure("AUTH", f"missing API key: environment variable {env} is not set"))
    if not is_clean(key):
        raise ModelError(
            Failure(
                "AUTH",
                f"the API key in environment variable {env} holds a control or non-ASCII "
                "character (a stray line ending?); fix the variable",
            )
        )
    return key


def check_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """``headers`` as a dict, after checking every name and value can be sent.

    Raises:
        ValueError: a name that is not an HTTP token, or a value that is not a string of
            printable ASCII characters (the message names the header, never its value).
    """
    out: dict[str, str] = {}
    for name, value in (headers or {}).items():
        if not isinstance(name, str) or not _TOKEN.fullmatch(name):
            raise ValueError(f"headers: {name!r} is not a valid HTTP header name")
        if not isinstance(value, str) or not is_clean(value):
            raise ValueError(
                f"headers: the value of {name!r} must be printable ASCII text "
                "(no control characters or line breaks)"
            )
        out[name] = value
    return out


def secret_forms(values: Iterable[str]) -> tuple[str, ...]:
    """Every way ``values`` may be quoted in a message, longest first.

    Each value as it is, the token of a ``Bearer`` value, and both as a ``repr`` quotes them
    (h11 quotes a rejected value as ``bytes``): backslashes doubled, either quote escaped.
    """
    forms: set[str] = set()
    for value in values:
        if not value:
            continue
        parts = [value]
        if value[:7].lower() == "bearer " and value[7:].strip():
            parts.append(value[7:].strip())
        for part in parts:
            escaped = part.replace("\\", "\\\\").encode("ascii", "backslashreplace").decode()
            forms.update((part, escaped.replace("'", "\\'"), escaped.replace('"', '\\"')))
    return tuple(sorted((f for f in forms if f), key=len, reverse=True))


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each of ``secrets`` replaced by ``[redacted]``."""
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text
