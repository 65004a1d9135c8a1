"""The REST API under /api/v1/: everything the admin does, for scripts (docs/architecture.md,
"HTTP surface"). Views go through the models' visible_to() and domain operations, as
the admin does; serializers validate through the models' own clean methods."""
