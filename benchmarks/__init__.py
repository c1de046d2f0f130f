"""The measuring harness: the step and loop benchmarks, their meters, the
GPU check's steps and report, the pytest plugin that streams the CUDA
tests' outcomes, and what the analysis commands share
(``tools/benchmark.py``, ``tools/benchmark_loop.py``,
``tools/gpu_check.py``, ``tools/analysis/``; docs/benchmark.md).

It runs from a clone of the repository, not from an installed package: it
reads the configs by their paths in the repository and runs pytest over
the repository's tests. The tools put the repository's root on
``sys.path``; it is not shipped by ``setup.py`` (which installs
``mmseg_stag`` only)."""
