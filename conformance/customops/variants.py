"""The custom-op lane's item variants (``ItemKey.variant`` values no other kind uses; opdb's
:data:`opdb.queries_counts.CUSTOM_OP_VARIANTS` holds the same names, a test keeps them equal)."""

OPCHECK = "opcheck"  # torch.library.opcheck's tests on the device
FWD = "custom_fwd"  # the op's result against its reference, eager
BWD = "custom_bwd"  # the gradients of its inputs against the reference's, eager
COMPILE = "custom_compile"  # forward (and backward) compiled with the target's torch.compile backend
VARIANTS = (OPCHECK, FWD, BWD, COMPILE)
