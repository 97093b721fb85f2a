"""Pure renderers: analysis results to text, tables, figures and HTML."""
