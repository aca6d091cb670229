"""Reference models used by the demo and the tests."""
