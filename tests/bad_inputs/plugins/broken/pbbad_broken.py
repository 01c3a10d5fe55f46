"""A plugin module that cannot be imported (a missing dependency, simulated)."""

raise ImportError("simulated missing dependency: No module named 'pbbad_dependency'")
