"""Shared CLI-test fixtures: one torch thread (on a shared 2-core machine extra threads only spin), and one zoo home
per test session whose tiny builds every CLI test reuses (each entry is built once, on first use)."""

from __future__ import annotations

import pytest

from specmm import zoo
from tests.conftest import one_torch_thread


@pytest.fixture(autouse=True)
def one_thread():
    with one_torch_thread():
        yield


@pytest.fixture(scope="session")
def zoo_home(tmp_path_factory):
    """$SPECMM_HOME for the session's tiny zoo builds."""
    return tmp_path_factory.mktemp("zoo-home")


@pytest.fixture
def tiny_zoo(zoo_home, monkeypatch):
    """`tiny_zoo(name)` -> the folder of the tiny build (built once per session); $SPECMM_HOME points at it for the
    test, so CLI commands that call `zoo.build` find the same builds."""
    monkeypatch.setenv("SPECMM_HOME", str(zoo_home))

    def build(name: str):
        return zoo.build(name, "tiny", progress=False)
    return build
