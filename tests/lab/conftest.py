"""Lab-wide: the torch fork server starts as soon as a torch test is collected
(tests/lab/torchserver.py), so its imports overlap the lab tests that run before it."""
from __future__ import annotations

import pytest

from tests.conftest import IN_LAB, require_lab
from tests.lab.torchserver import TorchForkServer

#: the session's torch fork server, when a torch test was collected inside the lab
TORCH_SERVER = pytest.StashKey[TorchForkServer]()


def pytest_collection_finish(session: pytest.Session) -> None:
    if IN_LAB and any(item.path.name == "test_torch.py" for item in session.items):
        server = TorchForkServer()
        server.start()
        session.config.stash[TORCH_SERVER] = server


def pytest_sessionfinish(session: pytest.Session) -> None:
    server = session.config.stash.get(TORCH_SERVER, None)
    if server is not None:
        server.stop()


@pytest.fixture(scope="session")
def torch_server(request: pytest.FixtureRequest) -> TorchForkServer:
    require_lab()          # (a module fixture using this one is set up before _lab_guard)
    server = request.config.stash.get(TORCH_SERVER, None)
    if server is None:
        pytest.fail("no torch fork server: tests/lab/conftest.py starts it inside the lab "
                    "(scripts/lab.sh) when a torch test is collected")
    return server
