"""Enumerate: every ATen overload the dispatcher knows (``overloads``) and the one coverage state
each ends in after a run (``coverage``).
"""

from conformance._lazy import exports

__getattr__, __dir__ = exports(__name__, {
    "overloads": ("KINDS", "FLAGS", "CLASSES", "Overload", "canonical", "packet_of", "cpu_layout_kernel",
                  "classify", "aten_names", "cache_dir", "opinfo_map", "overloads", "Summary", "summarize",
                  "build", "by_class"),
})
