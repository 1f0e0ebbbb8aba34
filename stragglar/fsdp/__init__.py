"""StragglAR as FSDP2's all-reduce across replicas (HSDP): the DDP hook's state and policies, on
the ReduceScatter outputs of a model sharded over the shard dimension of its mesh.

>>> from stragglar.ddp import StragglarState                                  # doctest: +SKIP
>>> from stragglar.fsdp import use_stragglar                                  # doctest: +SKIP
>>> mesh = init_device_mesh("cuda", (2, 4), mesh_dim_names=("replicate", "shard"))  # doctest: +SKIP
>>> for block in model.blocks:                                                # doctest: +SKIP
...     fully_shard(block, mesh=mesh["shard"])
>>> fully_shard(model, mesh=mesh["shard"])                                    # doctest: +SKIP
>>> replicas = mesh["replicate"].get_group()                                  # doctest: +SKIP
>>> use_stragglar(model, StragglarState(policy="auto"), replicate_group=replicas)  # doctest: +SKIP

Each parameter group's shard is reduced across the replicas as a DDP bucket is: with
``policy="auto"``, StragglAR with the late replica as straggler where the cost model says it pays,
the engine's all_reduce otherwise (:mod:`stragglar.fsdp.hook`).
"""

from stragglar.fsdp.hook import ReplicaReduction, use_stragglar

__all__ = ["ReplicaReduction", "use_stragglar"]
