"""Starter code for the "Attention and Transformers" notebooks.

Modules by concern: `checks` (what test cells call), `data` (datasets), `training`, `metrics`,
`plotting`. Nothing here is a solution to a graded cell.
"""
__version__ = "0.1.0"
