"""One torch thread for these tiny models: on a shared 2-core machine extra threads only spin."""

import pytest

from tests.conftest import one_torch_thread


@pytest.fixture(autouse=True)
def one_thread():
    with one_torch_thread():
        yield
