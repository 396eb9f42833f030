"""Encryption at rest for cluster credentials and task secret variables (Fernet, key from HCS_CREDENTIALS_KEY)."""

from __future__ import annotations

import json

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings


def _fernet() -> Fernet:
    return Fernet(settings.CREDENTIALS_KEY.encode())


def encrypt_json(value: dict) -> str:
    """Encrypt a credentials dict; an empty dict is stored as an empty string."""
    if not value:
        return ""
    return _fernet().encrypt(json.dumps(value, sort_keys=True).encode()).decode()


def decrypt_json(token: str) -> dict:
    """Decrypt what :func:`encrypt_json` wrote; raises ValueError when the key changed."""
    if not token:
        return {}
    try:
        return json.loads(_fernet().decrypt(token.encode()))
    except InvalidToken:
        raise ValueError("cluster credentials cannot be decrypted: HCS_CREDENTIALS_KEY changed since they were saved")


def encrypt_text(value: str) -> str:
    """Encrypt one secret string (a task's secret variable)."""
    return _fernet().encrypt(value.encode()).decode()


def decrypt_text(token: str) -> str:
    """Decrypt what :func:`encrypt_text` wrote; raises ValueError when the key changed."""
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken:
        raise ValueError("a secret cannot be decrypted: HCS_CREDENTIALS_KEY changed since it was saved")
