"""The embedded broker never hands a consumer a message that is still being written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from queue import Empty

import pytest
from kombu import Connection
from kombu.transport import filesystem

from core import broker

ROOT = Path(__file__).resolve().parents[2]


def _channel(transport, tmp_path: Path):
    folders = {name: tmp_path / name for name in ("out", "processed", "control", "staging")}
    for folder in folders.values():
        folder.mkdir()
    connection = Connection(
        transport=transport,
        transport_options={
            "data_folder_in": str(folders["out"]),
            "data_folder_out": str(folders["out"]),
            "processed_folder": str(folders["processed"]),
            "control_folder": str(folders["control"]),
            "staging_folder": str(folders["staging"]),
        },
    )
    return connection, connection.channel()


def _consume_while_writing(module, channel, monkeypatch) -> list:
    """Put one message; while its bytes are being written, a consumer scans the queue (the
    moment the worker's consumer can hit when beat, in the same worker, sends)."""
    seen = []
    encode = module.str_to_bytes

    def encode_and_consume(text):
        data = encode(text)
        try:
            seen.append(channel._get("q"))
        except Empty:
            seen.append(None)
        return data

    monkeypatch.setattr(module, "str_to_bytes", encode_and_consume)
    channel._put("q", {"body": "x" * 1000})
    monkeypatch.undo()
    return seen


def test_kombus_own_transport_hands_out_a_message_before_it_is_written(tmp_path, monkeypatch):
    # Why core.broker exists: the consumer takes the empty file and cannot decode it.
    connection, channel = _channel(filesystem.Transport, tmp_path)
    with connection, pytest.raises(json.JSONDecodeError):
        _consume_while_writing(filesystem, channel, monkeypatch)


def test_ours_shows_a_message_only_once_it_is_whole(tmp_path, monkeypatch):
    connection, channel = _channel(broker.Transport, tmp_path)
    with connection:
        assert _consume_while_writing(broker, channel, monkeypatch) == [None]
        assert channel._get("q") == {"body": "x" * 1000}
        assert os.listdir(tmp_path / "staging") == []
        with pytest.raises(Empty):
            channel._get("q")


def test_messages_come_out_in_the_order_they_went_in(tmp_path):
    connection, channel = _channel(broker.Transport, tmp_path)
    with connection:
        for i in range(5):
            channel._put("q", {"n": i})
        assert [channel._get("q")["n"] for _ in range(5)] == [0, 1, 2, 3, 4]


def test_the_embedded_default_uses_it(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("CELERY_BROKER_URL", "DATABASE_URL")}
    env.update(GPUMARKET_VAR_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="config.settings")
    code = (
        "import django; django.setup(); from config.celery import app; "
        "c = app.connection_for_write(); print(type(c.transport).__module__, "
        "c.transport_options['staging_folder'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["core.broker", str(tmp_path / "broker" / "staging")]
