"""The test suite as one package: every test helper is imported package-qualified
(`from tests.ranks import run_ranks`), with the repository root on sys.path (pyproject's
pytest `pythonpath`, or `PYTHONPATH=.` for a helper run as `python -m tests.NAME`). No test
module imports another: what two modules share lives in a helper module."""
