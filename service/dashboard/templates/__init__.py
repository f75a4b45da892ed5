"""Jinja2 templates of the dashboard (a package only so that they ship in the wheel)."""
