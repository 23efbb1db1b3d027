"""``python -m conformance`` is the ``conformance`` command."""

from conformance.cli import main

main()
