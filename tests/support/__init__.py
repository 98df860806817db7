"""Helpers shared by the tests, the check scripts and the benchmark: the value families
(`families`), the NumPy statement of the contract (`reference`) and running an operator on a
backend (`operators`), running a module in a process of its own (`processes`)."""
