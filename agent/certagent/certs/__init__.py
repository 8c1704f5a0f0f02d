"""Certificates and keys: PEM parsing, upload validation, key encryption, hostname rules."""
