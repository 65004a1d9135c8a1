"""The fault suite: real processes under injected faults, and a checker of what the
receiver got and the database holds (README "Faults we test", docs/faults.md)."""
