"""opdb package."""
