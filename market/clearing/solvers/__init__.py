"""Solvers and kernels: the LP builder and HiGHS, the min-cost flows, eg's interior point, column generation, the transport problems, the compiled sums."""
