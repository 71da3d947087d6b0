"""The engine's conformance cases (specs/lifecycle.md L3-L15), run by test_lifecycle.py on each backend."""
