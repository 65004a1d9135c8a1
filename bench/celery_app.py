"""A Celery worker doing what rundelivery does per delivery: load it, POST it,
write the result and status. The comparison a Django team would otherwise build."""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webhooker.settings")
django.setup()

from celery import Celery  # noqa: E402

from deliveries.engine.attempts import attempt  # noqa: E402
from deliveries.engine.claims import load_tasks, read_body  # noqa: E402
from deliveries.engine.targets import Targets  # noqa: E402
from deliveries.engine.writer import write_results  # noqa: E402

targets = Targets()
app = Celery("bench", broker=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/15"))
app.conf.update(
    task_ignore_result=True,
    worker_prefetch_multiplier=4,
    task_acks_late=False,
    broker_connection_retry_on_startup=True,
)


@app.task(name="bench.deliver")
def deliver(delivery_id):
    [task] = load_tasks([delivery_id]) or [None]
    if task is None:
        return
    targets.load([task.target_id])  # as the engine does: the target as it is now
    task.target = targets.get(task.target_id).row
    write_results([attempt(task, read_body(task), base=1, cap=1)])
