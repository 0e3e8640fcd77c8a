"""Helpers for tests: tiny random-weight models of real classes, built offline."""
