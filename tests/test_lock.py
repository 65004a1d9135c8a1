import os

import pytest
from django.db import connection

from deliveries.engine.lock import EngineLock, EngineLocked


@pytest.mark.django_db(transaction=True)
def test_second_lock_on_the_same_data_dir_is_refused_with_the_holders_pid(tmp_path):
    first = EngineLock(tmp_path)
    first.acquire()
    try:
        with pytest.raises(EngineLocked, match=f"pid {os.getpid()}"):
            EngineLock(tmp_path).acquire()
    finally:
        first.release()
    again = EngineLock(tmp_path)
    again.acquire()  # released locks can be taken again
    again.release()


@pytest.mark.django_db(transaction=True)
def test_advisory_lock_guards_other_hosts_sharing_the_database(tmp_path):
    if connection.vendor != "postgresql":
        pytest.skip("the advisory lock exists on PostgreSQL only")
    first = EngineLock(tmp_path / "host-a")
    (tmp_path / "host-a").mkdir()
    (tmp_path / "host-b").mkdir()
    first.acquire()
    try:
        assert first.alive()
        with pytest.raises(EngineLocked, match="engine lock"):
            EngineLock(tmp_path / "host-b").acquire()
    finally:
        first.release()
    second = EngineLock(tmp_path / "host-b")
    second.acquire()
    second.release()
