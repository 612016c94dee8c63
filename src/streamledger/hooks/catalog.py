"""An Iceberg catalog's properties from an Airflow connection, every secret masked first.

The connection's extra JSON *is* the pyiceberg catalog's properties (``{"type": "rest", "uri": ...,
"credential": ...}``, ``{"type": "sql", "uri": "postgresql+psycopg://user:pw@host/db", "warehouse":
...}``): any catalog pyiceberg loads, no field mapping to learn. Its values are registered with
Airflow's secret masker before anything else sees them: every value under a key that names a
secret (``credential``, ``token``, ``password``, ``*.secret-access-key``...) in all its encoded
forms, and the password and secret query parameters of every value that is a URL. The properties
never become a template field, so the rendered-template view cannot show them.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook

from streamledger.errors import StreamledgerError
from streamledger.hooks.masking import mask_password, mask_url
from streamledger.redaction import is_secret_key


class CatalogConnectionError(StreamledgerError):
    """The catalog connection cannot give catalog properties (named, never a value)."""


def mask_catalog_properties(props: dict[str, str]) -> None:
    """Register every secret a catalog's properties may hold with the secret masker."""
    for key, value in props.items():
        if not value:
            continue
        if is_secret_key(key):
            mask_password(value)
        if "://" in value:
            mask_url(value)


def catalog_properties(conn_id: str) -> dict[str, str]:
    """The pyiceberg catalog properties of connection ``conn_id`` (its extra), masked."""
    conn = BaseHook.get_connection(conn_id)
    mask_password(conn.password)
    extra: Any = conn.extra_dejson
    if not isinstance(extra, dict) or not extra:
        raise CatalogConnectionError(f"catalog connection {conn_id!r}: its extra must be a JSON object of "
                                     "pyiceberg catalog properties (e.g. type, uri, warehouse)")
    props = {str(k): str(v) for k, v in extra.items() if v is not None}
    mask_catalog_properties(props)
    return props
