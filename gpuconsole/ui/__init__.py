"""The Textual UI: the two apps, the screens, their parts, the terminal's output filter."""
