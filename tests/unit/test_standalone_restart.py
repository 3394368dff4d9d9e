"""What a process replaced after a GPU fault hands to the next one (``CUDAPATCH_RESTART``)."""

from __future__ import annotations

import json

import pytest

from cudapatch.host_plugin.hosts.standalone import RESTART_ENV, take_restart_state


def test_restart_state_is_taken_once(monkeypatch: pytest.MonkeyPatch) -> None:
    state = {"frames": 12, "disabled": {"bad": "CUDA_ERROR_ILLEGAL_ADDRESS in block 'bad'"}, "restarts": 1}
    monkeypatch.setenv(RESTART_ENV, json.dumps(state))
    assert take_restart_state() == state
    assert take_restart_state() == {}  # removed: a process the new one starts does not inherit it


@pytest.mark.parametrize("text", ["", "{not json", "[1, 2]"])
def test_a_missing_or_malformed_restart_state_is_empty(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv(RESTART_ENV, text)
    assert take_restart_state() == {}
