"""webhooker's project package: settings, URLs, the server and the database backends.

Importing it (the settings module is inside) selects the SQLite library every
process uses, before Django loads a database backend (webhooker/db/sqlite/library.py).
"""

from webhooker.db.sqlite.library import use_bundled

use_bundled()
