"""Rendering: terminal tables, the HTML report, plots."""
