"""Rank-aware library logging: rank 0 by default, every rank (tagged) with debug."""

from __future__ import annotations

import logging

import pytest

from lbtrain import logs


def _lines(capsys, level: str) -> list[str]:
    logs.configure(level)
    for rank in (0, 1):
        logs.set_rank(rank, thread=True)
        logs.logger.info("info from %d", rank)
        logs.logger.debug("debug from %d", rank)
        logs.logger.warning("warning from %d", rank)
    logs.set_rank(0, thread=True)
    return capsys.readouterr().err.splitlines()


def test_info_is_rank_0_and_warnings_come_from_every_rank(capsys):
    assert _lines(capsys, "info") == [
        "lbtrain[rank 0] INFO: info from 0",
        "lbtrain[rank 0] WARNING: warning from 0",
        "lbtrain[rank 1] WARNING: warning from 1",
    ]


def test_debug_is_every_rank_and_every_record(capsys):
    lines = _lines(capsys, "debug")
    assert "lbtrain[rank 1] DEBUG: debug from 1" in lines and len(lines) == 6
    logs.configure("info")  # leave the process as the other tests expect


def test_configure_is_idempotent_and_refuses_an_unknown_level(capsys):
    logs.configure("info")
    logs.configure("info")
    handlers = [h for h in logging.getLogger("lbtrain").handlers if getattr(h, "_lbtrain", 0)]
    assert len(handlers) == 1
    with pytest.raises(ValueError, match="log_level='loud' is unknown"):
        logs.configure("loud")
