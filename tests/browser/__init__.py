"""Browser tests: the console as people use it, in Chromium (tests/browser/conftest.py)."""
