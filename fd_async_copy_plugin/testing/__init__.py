"""Scaffolding for tests, selftest and bench: the FastDeploy replica, the decode driver,
the side-by-side harness. Never imported by register()/enable(); importing it has no side effects."""
