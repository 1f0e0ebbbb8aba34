"""Measurement: what ``stragglar run`` and ``stragglar bench`` do, with the model's prices beside them.

:mod:`~stragglar.measure.run` times a proved schedule against the engine's own AllReduce on
checked data (:mod:`~stragglar.measure.data`), :mod:`~stragglar.measure.launch` starts torch ranks,
:mod:`~stragglar.measure.links` paces their sockets, :mod:`~stragglar.measure.sweep` measures a
grid and sets it beside what the cost model (:mod:`stragglar.model`) predicts.
"""
