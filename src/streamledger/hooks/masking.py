"""Every form of a secret, registered with Airflow's secret masker.

Airflow masks the exact strings it is given, and a password travels in more forms than the one a
connection holds: percent-encoded in a URL's user info (``quote(pw, safe="")``), with ``/`` left as
it is (``quote(pw)``), with spaces as ``+`` (``quote_plus``), and inside the whole URL. Registering
only the raw password left the encoded one readable in task logs and in the rendered-template view.
Every place that reads a connection password or a URL that may hold one calls :func:`mask_password`
or :func:`mask_url`; operators with URL template fields mix in :class:`MaskRenderedUrls`, so the
rendered values are registered before Airflow redacts and stores them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from streamledger.redaction import secret_forms

# Query parameters of a URL that carry secrets (libpq's ``password``/``sslpassword``, tokens, keys).
_SECRET_PARAM = re.compile(r"password|passwd|secret|token|key", re.IGNORECASE)
# SQLAlchemy's reading of the user info: the password runs to the first "@" and may hold a "/" (Jinja's
# ``urlencode`` leaves it), where ``urlsplit`` would end the host part there.
_USERINFO_PASSWORD = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://[^:/@]*:(?P<password>[^@]*)@")


def _mask(value: str) -> None:
    try:
        from airflow.sdk.log import mask_secret
    except ImportError:  # pragma: no cover - outside Airflow (library use): nothing to register with
        return
    mask_secret(value)


def mask_password(password: str | None) -> None:
    """Register a password in all its forms (task process and, through it, the supervisor)."""
    if password:
        for form in secret_forms(password):
            _mask(form)


def mask_url(url: str | None) -> None:
    """Register the secrets of a URL: its password (decoded and as written, in all forms), secret
    query parameters, and the whole URL. A URL without a secret registers nothing."""
    if not url:
        return
    try:
        parts = urlsplit(url)
        written = {parts.password}
    except ValueError:  # not a URL we can take apart: the whole string is all we can mask
        _mask(url)
        return
    match = _USERINFO_PASSWORD.match(url)
    written.add(match.group("password") if match else None)
    secrets = [s for w in written if w for s in (unquote(w), w)]
    secrets += [value for key, value in parse_qsl(parts.query) if _SECRET_PARAM.search(key) and value]
    for secret in secrets:
        mask_password(secret)
    if secrets:
        _mask(url)


class MaskRenderedUrls:
    """Operator mix-in: after rendering, register the secrets of the URL template fields.

    Airflow redacts rendered template fields with the masker's registered values before it stores
    them (``rendered_task_instance_fields``) and shows them; a field whose *name* does not look
    secret (``ledger_url``) is shown as rendered unless its secrets were registered first.
    """

    secret_url_fields: Sequence[str] = ("ledger_url",)

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        super().render_template_fields(context, jinja_env)  # type: ignore[misc]
        for name in self.secret_url_fields:
            value = getattr(self, name, None)
            if isinstance(value, str):
                mask_url(value)
