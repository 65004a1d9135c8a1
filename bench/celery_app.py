"""A Celery worker doing what rundelivery does per delivery: load it, POST it,
write the result and status. The comparison a Django team would otherwise build."""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webhooker.settings")
django.setup()

from celery import Celery  # noqa: E402

from deliveries.engine.claims import load_tasks  # noqa: E402
from deliveries.engine.workers import call_target, decide  # noqa: E402
from deliveries.engine.writer import write_results  # noqa: E402

app = Celery("bench", broker=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/15"))
app.conf.update(
    task_ignore_result=True,
    worker_prefetch_multiplier=4,
    task_acks_late=False,
    broker_connection_retry_on_startup=True,
)


@app.task(name="bench.deliver")
def deliver(delivery_id):
    import time

    [task] = load_tasks([delivery_id]) or [None]
    if task is None:
        return
    start = time.monotonic()
    outcome = call_target(task)
    status, delay = decide(task, outcome, retries=False, base=1, cap=1)
    write_results([(task, outcome, status, delay, int((time.monotonic() - start) * 1000))])
