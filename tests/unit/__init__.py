"""Tests that need no shared stack (some start a Redis, a broker or Spark of their own)."""
