"""Measurement and prediction: what ``stragglar run`` and ``stragglar bench`` do, and the model beside them.

:mod:`~stragglar.measure.run` times a proved schedule against the engine's own AllReduce on
checked data (:mod:`~stragglar.measure.data`), :mod:`~stragglar.measure.launch` starts torch ranks,
:mod:`~stragglar.measure.sweep` measures a grid, :mod:`~stragglar.measure.predict` prices the
generated schedules with the cost model.
"""
