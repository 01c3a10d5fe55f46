"""An example privbench defense package; the plugin lives in :mod:`privbench_example_defense.label_smoothing`."""
