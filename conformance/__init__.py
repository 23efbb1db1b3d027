"""Operator-conformance harness for PyTorch device backends.

The pipeline, one module per stage: catalog (enumerate) -> inputs (generate) -> execute ->
compare -> opdb (record) -> reports (report) -> gate.
"""

__version__ = "0.1.0"
