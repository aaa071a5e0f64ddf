"""Tests against the one embedded stack per test session (conftest.stack)."""
