"""opdb: the SQLite result store. It owns the schema and every SQL statement of the project.

Example::

    >>> from opdb import Store
    >>> Store.memory().runs()
    []
"""

from .merge import merge_files, merge_into
from .schema import SCHEMA_VERSION
from .store import OpdbError, Store, Writer, new_run_id

__all__ = ["SCHEMA_VERSION", "OpdbError", "Store", "Writer", "merge_files", "merge_into", "new_run_id"]
