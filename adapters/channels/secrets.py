"""Secrets of channel adapters: named by where they live (an environment variable or a file), never
written in a settings file, never logged, never stored in a fact, masked wherever they are shown.

>>> token = SecretRef(env="SLACK_BOT_TOKEN")  # doctest: +SKIP
>>> token.reveal()        # the value, for the one call that sends it       # doctest: +SKIP
>>> str(token)            # 'env:SLACK_BOT_TOKEN' -- where it comes from, not what it is  # doctest: +SKIP
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, model_validator

MAX_SECRET_BYTES = 64 * 1024


class SecretError(ValueError):
    """A secret that cannot be read: the variable is unset, the file is missing or empty. The message
    names where it was looked for, never a value."""


class SecretRef(BaseModel):
    """Where a secret comes from: exactly one of ``env`` (a variable's name) or ``file`` (a path)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    env: str | None = None
    file: Path | None = None

    @model_validator(mode="after")
    def _one_source(self) -> SecretRef:
        if (self.env is None) == (self.file is None):
            raise ValueError("a secret comes from exactly one place: env = \"VARIABLE\" or file = \"/path\"")
        if self.env is not None and not self.env.strip():
            raise ValueError("a secret's env names a variable")
        return self

    def reveal(self) -> str:
        """The secret's value (surrounding whitespace and a final newline stripped); :class:`SecretError`
        when it cannot be read."""
        if self.env is not None:
            value = os.environ.get(self.env)
            if value is None or not value.strip():
                raise SecretError(f"the environment variable {self.env} is not set (or empty)")
            return value.strip()
        assert self.file is not None
        try:
            with self.file.open("rb") as handle:  # bounded: a device (/dev/zero) or a huge file never ends
                data = handle.read(MAX_SECRET_BYTES + 1)
        except OSError as exc:
            raise SecretError(f"cannot read the secret file {self.file}: {exc.strerror}") from None
        if len(data) > MAX_SECRET_BYTES:
            raise SecretError(f"the secret file {self.file} is larger than {MAX_SECRET_BYTES} bytes")
        value = data.decode("utf-8", "replace").strip()
        if not value:
            raise SecretError(f"the secret file {self.file} is empty")
        return value

    def __str__(self) -> str:
        return f"env:{self.env}" if self.env is not None else f"file:{self.file}"


def mask(value: str | None, *, keep: int = 0) -> str:
    """``value`` as shown to a person: ``"****"``, or its last ``keep`` characters after the stars when
    the value is long enough that they give nothing away (at least 16 characters)."""
    if not value:
        return ""
    if keep and len(value) >= 16:
        return "****" + value[-keep:]
    return "****"


def scrub(text: str, secrets: list[str] | tuple[str, ...]) -> str:
    """``text`` with every occurrence of each secret replaced by ``****`` (for provider answers and
    error messages that might echo a URL or a token back)."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "****")
    return text
