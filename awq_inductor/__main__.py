"""``python -m awq_inductor``: see :mod:`awq_inductor.cli`."""
import sys

from .cli import bench, main  # noqa: F401  (bench: the timing helper the benchmarks share)

if __name__ == "__main__":
    sys.exit(main())
