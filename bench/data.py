"""Rows the benchmarks start from, written in bulk rather than through ingest."""

BATCH = 1000


def event_batches(webhook, n, body, received_at):
    """Store `n` JSON events of `webhook` with `body`, received at `received_at`;
    yield them a batch of saved rows at a time, for the caller's deliveries."""
    from deliveries.models import Event

    for start in range(0, n, BATCH):
        yield Event.objects.bulk_create(
            Event(
                webhook=webhook,
                method="POST",
                body=body,
                body_size=len(body),
                content_type="application/json",
                headers=[["Content-Type", "application/json"]],
                received_at=received_at,
            )
            for _ in range(min(BATCH, n - start))
        )
