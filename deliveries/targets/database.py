from deliveries.targets.base import Outcome, TargetType


class DatabaseTarget(TargetType):
    """The event is already stored in the database: recording it is the delivery."""

    type = "database"
    label = "Database record"

    def deliver(self, task, body):
        return Outcome(success=True)
