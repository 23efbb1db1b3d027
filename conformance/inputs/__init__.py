"""Generate: inputs for work items (OpInfo samples; schema-driven strategies)."""
