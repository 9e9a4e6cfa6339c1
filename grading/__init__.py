"""Instructor tools: release, reference outputs, autograding. See `python -m grading --help`."""
