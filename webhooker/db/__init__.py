"""webhooker's database backends: Django's, with what webhooker needs of them.

`sqlite` queues writers on a file lock and group-commits concurrent events;
`postgresql` makes the per-request health check free and prepares the hot
statements. Every use of Django's or psycopg's private names is in these two
backends' `base.py`; tests/unit/test_contracts.py fails loudly when an upgrade
renames or reshapes one of them.
"""
