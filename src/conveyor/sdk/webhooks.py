"""The SDK's webhook methods (part of :class:`conveyor.sdk.Client`): register (create or
update), list, read, delete, enable and disable webhook doors (``POST
/api/v1/webhooks/NAME``). Each change is one verb of conveyor.verbs.webhooks (one SQL
function each: ``register_webhook``, ``delete_webhook``, ``set_webhook_enabled``), the
body the API runs too. A secret or token is never answered, only whether one is set.

    with Client(url) as client:
        client.register_webhook("github", auth="hmac", secret=secret, trigger="github.push")
        client.disable_webhook("github")
"""

from __future__ import annotations

from typing import Any

from conveyor.store.db import Conn
from conveyor.store.queries import Q
from conveyor.verbs import webhooks as hooks
from conveyor.verbs.drive import run


class WebhookMethods:
    conn: Conn

    def register_webhook(
        self,
        name: str,
        *,
        auth: str,
        trigger: str | None = None,
        secret: str | None = None,
        token: str | None = None,
        signature_header: str | None = None,
        signature_prefix: str | None = None,
        idempotency_header: str | None = None,
        max_body_bytes: int | None = None,
        description: str | None = None,
        payload_schema: Any = None,
    ) -> dict[str, Any]:
        """Create or update webhook ``name`` and its trigger (default: its name). ``auth``:
        ``hmac`` (``secret``; None on update keeps the stored one), ``bearer`` (``token``,
        stored hashed) or ``none``. Returns it as :meth:`webhook` shows it, with
        ``created_now``. InvalidWebhookError says what cannot be stored; a trigger of
        that name with another type is a ConflictError."""
        fields = {
            "trigger": trigger,
            "secret": secret,
            "token": token,
            "signature_header": signature_header,
            "signature_prefix": signature_prefix,
            "idempotency_header": idempotency_header,
            "max_body_bytes": max_body_bytes,
            "description": description,
            "payload_schema": payload_schema,
        }
        return run(self.conn, hooks.register(name, auth=auth, **fields))

    def webhooks(self) -> list[dict[str, Any]]:
        """Every webhook by name, with how many events its door emitted and the last one's time."""
        return [dict(r) for r in self.conn.execute(Q["list_webhooks"]).fetchall()]

    def webhook(self, name: str) -> dict[str, Any]:
        """One webhook's settings (NotFoundError if there is none)."""
        return run(self.conn, hooks.read(name))

    def delete_webhook(self, name: str) -> None:
        """Delete it: its door answers 404. Its events are kept."""
        run(self.conn, hooks.delete(name))

    def enable_webhook(self, name: str, enabled: bool = True) -> dict[str, Any]:
        """Open its door (``enabled=False``: close it, 404 as an unknown webhook);
        ``{"name", "enabled", "was"}``."""
        return run(self.conn, hooks.set_enabled(name, enabled))

    def disable_webhook(self, name: str) -> dict[str, Any]:
        return self.enable_webhook(name, False)
