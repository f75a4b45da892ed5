"""Injection tests: client data must never become code, markup, SQL, paths or log lines."""
