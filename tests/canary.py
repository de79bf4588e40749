"""Byte-level proof of erasure: plant a canary, scan every file of every data directory for its
bytes (never through an engine's API), and check that what is still sealed does not hide it."""

from __future__ import annotations

import base64
import os
import secrets
from pathlib import Path

from schemas.sealing import envelope


def new_canary(tag: str = "") -> str:
    """One lowercase alphanumeric token: tokenizers and stemmers keep it whole, so the scan finds
    it in term dictionaries as well as in stored text."""
    return f"zq{tag}{secrets.token_hex(6)}canary"


def scan(directories, needles: list[bytes]) -> list[str]:
    """`file: needle` for every needle found in any file under the directories (grep -a).

    The servers keep writing while we walk (Qdrant's `.atomicwrite*` temporaries come and go), so a
    file or directory that vanishes between listing and reading is skipped: os.walk drops a
    directory it cannot list, where Path.rglob raised FileNotFoundError mid-scan."""
    found = []
    for d in directories:
        if d is None:
            continue
        for root, _dirs, files in os.walk(d):
            for name in files:
                f = Path(root) / name
                if f.is_symlink():
                    continue
                try:
                    data = f.read_bytes()
                except OSError:
                    continue
                found.extend(f"{f}: {n[:24]!r}" for n in needles if n in data)
    return found


def key_needles(secret_keys: list[bytes]) -> list[bytes]:
    """A key's bytes as stores hold them: raw, base64, hex."""
    return [n for k in secret_keys for n in (k, base64.b64encode(k), k.hex().encode())]


def open_everything(records, keystore, canaries: list[str]) -> list[str]:
    """Decrypt every sealed record with every key still held: what still opens must not carry a
    canary (the forgotten ones must not open at all)."""
    bad = []
    sealed = [(r, envelope(r.value)) for r in records]
    kids = {e.key_id for _, e in sealed if e is not None}
    keys = keystore.get(kids)
    for r, env in sealed:
        text = r.value if env is None else (env.open(keys[env.key_id].secret) if env.key_id in keys else b"")
        bad.extend(f"{r.topic}/{r.partition}:{r.offset}" for c in canaries if c.encode() in text)
    return bad
