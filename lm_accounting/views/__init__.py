"""Generic views: every result rendered as a table, markdown, CSV or JSON, and the sweep plots."""
