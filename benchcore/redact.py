"""Secrets never reach a manifest or a log: values of environment variables and command-line flags whose
name looks like a key or a token are replaced by ``REDACTED``.

A name looks secret when one of its words (split at ``_``, ``-`` and ``.``) is one of ``SECRET_WORDS``
or its last word ends with ``KEY``/``TOKEN`` (``OPENAI_API_KEY``, ``HF_TOKEN``, ``--api-key``,
``APIKEY``); ``TOKENIZERS_PARALLELISM``, ``max_tokens`` or ``token_range`` do not.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

__all__ = ["REDACTED", "SECRET_WORDS", "looks_secret", "redact_argv", "redact_env", "scrub", "secret_values"]

REDACTED = "<redacted>"
SECRET_WORDS = frozenset({"SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS", "AUTH", "BEARER"})


def looks_secret(name: str) -> bool:
    """Whether a variable or flag name (``HF_TOKEN``, ``--api-key``) names a secret."""
    words = [w for w in re.split(r"[_\-.]+", name.upper()) if w]
    if not words:
        return False
    return any(w in SECRET_WORDS for w in words) or words[-1].endswith(("KEY", "TOKEN"))


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with every secret-looking variable's value replaced."""
    return {k: REDACTED if looks_secret(k) else v for k, v in env.items()}


def redact_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` with the value of every secret-looking flag replaced (``--api-key X``, ``--api-key=X``)."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        flag, eq, _ = arg.partition("=")
        if arg.startswith("-") and looks_secret(flag.lstrip("-")):
            out.append(f"{flag}={REDACTED}" if eq else arg)
            hide_next = not eq
        else:
            out.append(arg)
    return out


def secret_values(env: Mapping[str, str]) -> list[str]:
    """The values of ``env``'s secret-looking variables (non-empty), e.g. to scrub them from text."""
    return [v for k, v in env.items() if looks_secret(k) and v]


def scrub(text: str, env: Mapping[str, str]) -> str:
    """``text`` (a traceback, an error) with every secret-looking variable's value in ``env`` replaced."""
    for value in sorted(secret_values(env), key=len, reverse=True):  # longest first: a key inside another
        text = text.replace(value, REDACTED)
    return text
