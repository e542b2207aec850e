"""The side-by-side matrix of ``python -m tests.bench.run_matrix``, by concern: rows, brokers, load
generators, profiling, runs and the report."""
