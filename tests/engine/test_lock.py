import os

import pytest
from django.db import connection

from deliveries.engine.lock import EngineLock, EngineLocked


@pytest.mark.django_db(transaction=True)
def test_second_lock_on_the_same_data_dir_is_refused_with_the_holders_pid(tmp_path):
    if connection.vendor != "sqlite":
        pytest.skip("on PostgreSQL engines share the database by partitions, not the flock")
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
