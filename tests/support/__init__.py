"""The tests' support code: tiny offline models and the brute-force action reader the tests and benchmarks
check CIPR against. Not part of the package: tests import it as `support` (pytest puts `tests/` on the path),
the benchmark scripts add `tests/` to `sys.path` themselves."""
