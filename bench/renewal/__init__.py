"""``python -m bench.renewal``: renewal at rest with 100,000 scheduled, and renewals per second."""
