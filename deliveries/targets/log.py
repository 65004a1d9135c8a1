import logging

from deliveries.targets.base import Outcome, TargetType

logger = logging.getLogger("deliveries.targets.log")

BODY_EXCERPT = 1024


class LogTarget(TargetType):
    """One structured log line per event."""

    type = "log"
    label = "Log line"

    def deliver(self, task, body):
        logger.info(
            "event=%s webhook=%s method=%s content_type=%r size=%d body=%r",
            task.event_code,
            task.webhook_id,
            task.method,
            task.content_type,
            task.body_size,
            body[:BODY_EXCERPT].decode("utf-8", "replace"),
            extra={"delivery": task.delivery_id, "event": str(task.event_code)},
        )
        return Outcome(success=True)
