"""Regression tests for attacks from outside: each reproduces a defect through a real server."""
