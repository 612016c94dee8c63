"""Which settings hold secrets, and text with them taken out: the one rule for catalog properties.

A pyiceberg catalog's properties mix plain settings (``type``, ``uri``, ``warehouse``) with secrets
(``credential``, ``token``, ``s3.secret-access-key``, a password in a ``uri``). The command line refuses
secrets among its arguments (every process on the machine can read them), the Airflow hook registers
them with the secret masker, and the Iceberg sink takes them out of its error lines (pyiceberg's own
errors quote every property).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from urllib.parse import quote, quote_plus, unquote, urlsplit

__all__ = ["SECRET_KEY", "is_secret_key", "scrub", "secret_forms", "secrets_of", "url_password"]

#: Keys of properties that hold secrets (REST credential/token, S3/GCS/ADLS keys, passwords).
SECRET_KEY = re.compile(r"password|passwd|secret|token|credential|key|sas|signature", re.IGNORECASE)
# SQLAlchemy's reading of the user info: the password runs to the first "@" and may hold a "/".
_USERINFO_PASSWORD = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://[^:/@]*:(?P<password>[^@]*)@")
MASK = "***"


def is_secret_key(key: str) -> bool:
    return bool(SECRET_KEY.search(key))


def url_password(value: str) -> str | None:
    """The password in ``value``'s user info when ``value`` is a URL that has one, else None."""
    match = _USERINFO_PASSWORD.match(value)
    if match and match.group("password"):
        return match.group("password")
    try:
        return urlsplit(value).password if "://" in value else None
    except ValueError:
        return None


def secret_forms(secret: str) -> list[str]:
    """The secret and each encoding of it a URL or a form may hold (no duplicates, raw first)."""
    return list(dict.fromkeys([secret, unquote(secret), quote(secret, safe=""), quote(secret),
                               quote_plus(secret)]))


def secrets_of(props: Mapping[str, str]) -> list[str]:
    """Every secret ``props`` hold: values under secret keys and the passwords of URL values."""
    found: list[str] = []
    for key, value in props.items():
        if not value:
            continue
        if is_secret_key(key):
            found.append(value)
        password = url_password(value)
        if password:
            found.append(password)
    return found


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every form of every secret replaced by ``***`` (longest first)."""
    forms = sorted({f for s in secrets for f in secret_forms(s) if f}, key=len, reverse=True)
    for form in forms:
        text = text.replace(form, MASK)
    return text
