"""Widgets and cell renderers of the console's screens."""
