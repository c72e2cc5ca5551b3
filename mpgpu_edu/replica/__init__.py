"""What every strategy does to one rank's replica of the model, below the strategies that share
it (``dp``, ``ps``, ``pipeline``, ``hybrid``):

- ``flat``   parameters or gradients as one flat vector and back (a message, a bucket, a shard)
- ``loop``   forward and backward of a scaled loss, the optimizer step, and the loop of steps
             that records the optimizer's state and sums the losses over ranks
"""

from mpgpu_edu.replica.flat import (flat_params, flatten_grads, grads_from_flat,
                                    load_flat_params, unflatten_grads)
from mpgpu_edu.replica.loop import forward_backward, optimizer_step, run_steps

__all__ = ["flat_params", "flatten_grads", "forward_backward", "grads_from_flat",
           "load_flat_params", "optimizer_step", "run_steps", "unflatten_grads"]
