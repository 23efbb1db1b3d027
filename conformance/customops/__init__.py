"""The custom-op lane (issue #45): every op a target registers for its device's dispatch key
outside PyTorch's own namespaces, found by asking the dispatcher (:mod:`.discovery`), checked with
``torch.library.opcheck`` on the device (:mod:`.opcheck`) and, where a reference is declared in
code (:mod:`.references`), for its values against the reference on the CPU, forward and backward,
eager and compiled, in float32 and bfloat16 (:mod:`.items`). An op with no reference gets inputs
generated from its schema (:mod:`.generated`) and opcheck only, and is ``structural``, never a pass.

The work kind is :data:`CUSTOM_OPS` (:mod:`.lane`); its rows are op results like an ATen op's
(``op`` the overload name), so the store, the report, the gate and ``conformance errors`` take
them as they are. ``conformance run --ops 'neuron::*'`` selects them; a run without ``--ops``
includes them where the target has any.
"""

from .lane import CUSTOM_OPS, DTYPES, EVERY
from .variants import VARIANTS

__all__ = ["CUSTOM_OPS", "DTYPES", "EVERY", "VARIANTS"]
