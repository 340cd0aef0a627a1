"""Named jobs and the Flower runtime: the layer above the algorithms it runs.

:mod:`ebfl.flower.jobs` names every federated algorithm with its data (what
``ebfl flower`` runs; no Flower needed), :mod:`ebfl.flower.runtime` runs a job
on Flower's Simulation Engine or as a deployed Flower App (``ebfl[flower]``),
:mod:`ebfl.flower.deploy` writes such an App, and :mod:`ebfl.flower.loopback`
starts a SuperLink and SuperNodes as processes on 127.0.0.1 (for tests,
benchmarks and trying a deployment on one machine). The algorithms themselves,
and the in-process runtime they are checked against, are in
:mod:`ebfl.federated` and below.
"""

__all__: list[str] = []
