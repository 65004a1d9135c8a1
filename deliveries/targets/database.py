from deliveries.targets.base import Outcome, TargetType


class DatabaseTarget(TargetType):
    """The event is already stored in the database: recording it is the delivery."""

    type = "database"

    def deliver(self, task):
        return Outcome(success=True)
