"""The course's strategies beside PyTorch's own, on real gloo processes.

- ``compare_ddp``: a DDP wrapper (exercise 3.5's contract) against
  ``torch.nn.parallel.DistributedDataParallel``;
- ``compare_pipelining``: a pipeline executor (exercise 4.5's contract) running 1F1B against
  ``torch.distributed.pipelining``'s ``PipelineStage`` and ``Schedule1F1B``;
- ``compare_fsdp``: a sharded (ZeRO-3) wrapper against ``torch.distributed.fsdp.fully_shard``
  (FSDP2).

Each trains one model on the same batches three ways (one device, ours, torch's) in the same
worker processes, steps interleaved, and returns a ``SideBySide``: the losses of every step
(equal to 1e-5, under the loss convention it states) and the measured step times, as a table
(``print``) and a figure (``.plot()``).
"""

from mpgpu_edu.sidebyside.ddp import compare_ddp
from mpgpu_edu.sidebyside.fsdp import compare_fsdp
from mpgpu_edu.sidebyside.pipelining import compare_pipelining
from mpgpu_edu.sidebyside.result import SideBySide

__all__ = ["SideBySide", "compare_ddp", "compare_fsdp", "compare_pipelining"]
