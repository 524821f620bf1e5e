"""What things cost: a client step, a whole run, its fixed costs, a client, memory, the regulariser,
tff.learning and the aggregators, remote workers (docs/benchmarks.md §1-5, §8, §9;
docs/remote_workers.md). `.venv/bin/python -m bench.speed.<name> --help`."""
