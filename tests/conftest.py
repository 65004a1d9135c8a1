import pytest
from django.contrib.auth import get_user_model

from deliveries.models import Target, Webhook
from tests.sink import Sink


@pytest.fixture
def user(db):
    return get_user_model().objects.create_user("owner", password="pw-owner-123!")


@pytest.fixture
def webhook(user):
    hook = Webhook.objects.create(name="orders", owner=user)
    hook.ensure_entrypoint()
    return hook


@pytest.fixture
def entrypoint(webhook):
    return webhook.entrypoints.get()


@pytest.fixture
def make_target(webhook):
    def make(type_=Target.Type.HTTP, *, url=None, hook=None, **fields):
        config = fields.pop("config", None)
        if config is None:
            config = {"url": url} if type_ == Target.Type.HTTP else {}
        return Target.objects.create(
            webhook=hook or webhook,
            name=fields.pop("name", f"{type_}-target"),
            type=type_,
            config=config,
            **fields,
        )

    return make


@pytest.fixture
def sink():
    server = Sink().start()
    yield server
    server.stop()


@pytest.fixture
def data_dir(tmp_path):
    """A DATA_DIR for the processes a test starts (lock, socket, logs)."""
    path = tmp_path / "data"
    path.mkdir()
    return path
