"""CSS and JS of the dashboard (a package only so that they ship in the wheel)."""
