"""The audit log: one append-only row per write, in the same transaction as the write."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from .models import AuditEvent


def record(session: Session, actor: str | None, action: str, target: str, **detail: Any) -> None:
    """Add an audit row; never pass secrets in `detail`."""
    session.add(AuditEvent(actor=actor, action=action, target=target, detail=detail))
