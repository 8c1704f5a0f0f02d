"""End-to-end demo: ``python -m demo`` (see demo/run.py)."""
