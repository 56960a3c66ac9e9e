"""One torch thread for the tiny models the CLI tests run: on a shared 2-core machine extra threads only spin.
(The session's shared tiny zoo builds, `tiny_zoo`, come from tests/conftest.py.)"""

import pytest

from tests.conftest import one_torch_thread


@pytest.fixture(autouse=True)
def one_thread():
    with one_torch_thread():
        yield
