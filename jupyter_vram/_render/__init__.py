"""Pure renderers: analysis results to text, tables, figures and HTML.

Where each module here is tested: tests/INDEX.md.
"""
