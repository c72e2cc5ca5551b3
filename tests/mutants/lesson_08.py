"""Plausible wrong answers for lesson 08 (see tests/mutants/__init__.py)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from mpgpu_edu.collectives import all_gather, all_reduce, reduce_scatter

# ---- 8.1 ----------------------------------------------------------------------------------


def shard_unpadded(flat: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """torch.tensor_split's chunks: no padding, so the shards differ in size by one."""
    return torch.tensor_split(flat, world_size)[rank].clone()


def shard_padded_in_front(flat: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Pads at the start instead of the end: rank 0's shard begins with zeros."""
    size = -(-flat.numel() // world_size)
    padded = torch.cat([flat.new_zeros(size * world_size - flat.numel()), flat])
    return padded[rank * size: (rank + 1) * size].clone()


def shard_in_float32(flat: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Pads into torch.zeros without a dtype: every shard is float32, whatever the vector's
    dtype (a bf16 vector's shards double in size, an int64 one's lose precision)."""
    size = -(-flat.numel() // world_size)
    padded = torch.zeros(size * world_size)
    padded[: flat.numel()] = flat
    return padded[rank * size: (rank + 1) * size].clone()


def shard_as_view(flat: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Returns a view of the vector when no padding is needed: the whole vector stays alive."""
    size = -(-flat.numel() // world_size)
    if size * world_size == flat.numel():
        return flat[rank * size: (rank + 1) * size]
    padded = torch.zeros(size * world_size, dtype=flat.dtype)
    padded[: flat.numel()] = flat
    return padded[rank * size: (rank + 1) * size].clone()


def shard_view_of_padded(flat: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Right values, but a view of the padded copy: the whole padded vector stays alive as
    long as the shard does."""
    size = -(-flat.numel() // world_size)
    padded = torch.zeros(size * world_size, dtype=flat.dtype)
    padded[: flat.numel()] = flat
    return padded[rank * size: (rank + 1) * size]


# ---- 8.2 ----------------------------------------------------------------------------------

def _views(layer: nn.Module, full: torch.Tensor) -> dict[str, torch.Tensor]:
    views, offset = {}, 0
    for name, param in layer.named_parameters():
        views[name] = full[offset: offset + param.numel()].view(param.shape)
        offset += param.numel()
    return views


def _shard(flat: torch.Tensor, rank: int, n: int) -> torch.Tensor:
    size = -(-flat.numel() // n)
    padded = torch.zeros(size * n, dtype=flat.dtype)
    padded[: flat.numel()] = flat
    return padded[rank * size: (rank + 1) * size].clone()


def _wrap(comm: Any, module: nn.Sequential, prefetch: bool, *, op: str = "mean",
          use_prefetch: bool = True, regather: bool = True, all_reduce_grads: bool = False,
          autograd_keeps: bool = False, accumulate: bool = True, stream: bool = True,
          hold: bool = False, prefetch_backward: str = "before",
          after_compute: bool = False, clear: bool = True, wait_reduce: bool = False,
          ahead: str = "next") -> Any:
    """The solution's wrapper, with one switch per mistake."""
    layers = list(module)
    sizes = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    shards = [nn.Parameter(_shard(torch.cat([p.detach().reshape(-1) for p in layer.parameters()]),
                                  comm.rank, comm.world_size)) if size else None
              for layer, size in zip(layers, sizes)]

    def run(fn: Any, *args: Any) -> Any:
        return comm.run_async(fn, *args) if stream else _Done(fn(*args))

    class Sharded:
        def __init__(self) -> None:
            self.pending: dict[int, Any] = {}
            self.reducing: list[tuple[int, Any]] = []
            self.kept: dict[int, torch.Tensor] = {}

        def start(self, i: int) -> None:
            if 0 <= i < len(layers) and sizes[i] and i not in self.pending:
                self.pending[i] = run(all_gather, comm, shards[i].detach())

        def gather(self, i: int, step: int) -> torch.Tensor:
            self.start(i)
            full = torch.cat(self.pending.pop(i).wait())[: sizes[i]]
            if ((prefetch or ahead == "always") and use_prefetch and not after_compute
                    and (step > 0 or prefetch_backward == "before")
                    and not (ahead == "not_first" and step > 0 and i == 0)):
                j = self.next(i, step)
                self.start(j)
                while ahead == "all" and 0 <= j < len(layers):  # every later layer at once
                    j = self.next(j, step)
                    self.start(j)
            return full

        def next(self, i: int, step: int) -> int:
            j = i + step
            while 0 <= j < len(layers) and not sizes[j]:
                j += step
            return j

        def __call__(self, x: torch.Tensor) -> torch.Tensor:
            for i, layer in enumerate(layers):
                x = _Layer.apply(x, shards[i], self, i) if sizes[i] else layer(x)
            return x

        def finish(self) -> None:
            for i, work in self.reducing:
                grad = work.wait()
                if all_reduce_grads:
                    size = shards[i].numel()
                    grad = grad[comm.rank * size: (comm.rank + 1) * size]
                if accumulate and shards[i].grad is not None:
                    grad = shards[i].grad + grad
                shards[i].grad = grad
            if clear:
                self.reducing.clear()

        def parameters(self) -> list[nn.Parameter]:
            return [s for s in shards if s is not None]

    class _Layer(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, shard: torch.Tensor, owner: Sharded,
                    i: int) -> torch.Tensor:
            full = owner.gather(i, +1)
            if not regather or hold:
                owner.kept[i] = full  # kept from forward to backward
            ctx.owner, ctx.i = owner, i
            if autograd_keeps:  # the layer's graph, with its weights saved, kept for backward
                ctx.full = full.requires_grad_()
                ctx.x = x.detach().requires_grad_(x.requires_grad)
                with torch.enable_grad():
                    ctx.out = functional_call(layers[i], _views(layers[i], ctx.full), (ctx.x,))
                return ctx.out.detach()
            with torch.no_grad():
                out = functional_call(layers[i], _views(layers[i], full), (x,))
            if prefetch and after_compute:
                owner.start(owner.next(i, +1))
            ctx.save_for_backward(x)
            return out

        @staticmethod
        def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
            owner, i = ctx.owner, ctx.i
            if autograd_keeps:
                owner.gather(i, -1)  # gathered again as the contract says, then not used
                full, x = ctx.full, ctx.x
                torch.autograd.backward(ctx.out, grad_out)
            else:
                (x,) = ctx.saved_tensors
                full = (owner.kept.pop(i) if not regather
                        else owner.gather(i, -1)).requires_grad_()
                owner.kept.pop(i, None)
                x = x.detach().requires_grad_(ctx.needs_input_grad[0])
                with torch.enable_grad():
                    out = functional_call(layers[i], _views(layers[i], full), (x,))
                    torch.autograd.backward(out, grad_out)
            if prefetch and after_compute:
                owner.start(owner.next(i, -1))
            padded = torch.zeros(shards[i].numel() * comm.world_size, dtype=full.dtype)
            padded[: sizes[i]] = full.grad
            if all_reduce_grads:
                owner.reducing.append((i, run(_all_reduce_mean, comm, padded)))
            else:
                owner.reducing.append((i, run(reduce_scatter, comm, padded, op)))
            if wait_reduce:  # the layer's backward waits for its own reduce-scatter
                owner.reducing[-1] = (i, _Done(owner.reducing[-1][1].wait()))
            if prefetch and prefetch_backward == "after":  # queued behind the reduce-scatter
                j = i - 1
                while 0 <= j and not sizes[j]:
                    j -= 1
                owner.start(j)
            return (x.grad if ctx.needs_input_grad[0] else None), None, None, None

    return Sharded()


class _Done:
    """A collective already finished (run in the rank's program): ``wait`` returns it."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def wait(self) -> Any:
        return self.value


def _all_reduce_mean(comm: Any, tensor: torch.Tensor) -> torch.Tensor:
    all_reduce(comm, tensor, op="mean")
    return tensor


def fsdp_sums(comm: Any, module: nn.Sequential, prefetch: bool = False) -> Any:
    """Reduce-scatters with op="sum": every step N times too large."""
    return _wrap(comm, module, prefetch, op="sum")


def fsdp_ignores_prefetch(comm: Any, module: nn.Sequential, prefetch: bool = False) -> Any:
    """Right values and collectives, but prefetch=True gathers nothing ahead."""
    return _wrap(comm, module, prefetch, use_prefetch=False)


def fsdp_keeps_gathered(comm: Any, module: nn.Sequential, prefetch: bool = False) -> Any:
    """Keeps each layer's full parameters from forward to backward (ZeRO-2's memory): no
    second all-gather, the whole model gathered at once."""
    return _wrap(comm, module, prefetch, regather=False)


def fsdp_holds_gathered(comm: Any, module: nn.Sequential, prefetch: bool = False) -> Any:
    """Gathers again for backward as the contract says, but also keeps every forward's full
    vector in a dict until then: the whole model is held at the end of forward."""
    return _wrap(comm, module, prefetch, hold=True)


def fsdp_prefetches_forward_only(comm: Any, module: nn.Sequential,
                                 prefetch: bool = False) -> Any:
    """Prefetches the next layer in forward only: backward waits for every gather."""
    return _wrap(comm, module, prefetch, prefetch_backward="never")


def fsdp_prefetches_every_layer(comm: Any, module: nn.Sequential,
                                prefetch: bool = False) -> Any:
    """With prefetch, starts the gathers of every remaining layer at once: all layers'
    full parameters are held together, the opposite of what sharding is for."""
    return _wrap(comm, module, prefetch, ahead="all")


def fsdp_prefetch_skips_first_layer(comm: Any, module: nn.Sequential,
                                    prefetch: bool = False) -> Any:
    """Prefetches in forward from the second layer on: layer 1's gather is never hidden."""
    return _wrap(comm, module, prefetch, ahead="not_first")


def fsdp_prefetches_always(comm: Any, module: nn.Sequential, prefetch: bool = False) -> Any:
    """Prefetches whether or not prefetch is asked for."""
    return _wrap(comm, module, prefetch, ahead="always")


def fsdp_prefetches_after_compute(comm: Any, module: nn.Sequential,
                                  prefetch: bool = False) -> Any:
    """Starts the next layer's gather just after this layer's compute (in backward, before
    the reduce-scatter), not as soon as this layer's parameters have arrived."""
    return _wrap(comm, module, prefetch, after_compute=True)


def fsdp_prefetches_after_reduce(comm: Any, module: nn.Sequential,
                                 prefetch: bool = False) -> Any:
    """In backward, starts the next layer's gather after this layer's reduce-scatter: the comm
    stream runs them in order, so the gather waits behind the reduce-scatter."""
    return _wrap(comm, module, prefetch, prefetch_backward="after")


def fsdp_autograd_keeps_weights(comm: Any, module: nn.Sequential,
                                prefetch: bool = False) -> Any:
    """Runs each layer's forward with grad on the gathered weights and keeps that graph for
    backward: autograd holds every layer's full parameters until backward (it still gathers
    a second time, and throws that copy away)."""
    return _wrap(comm, module, prefetch, autograd_keeps=True)


def fsdp_all_reduces(comm: Any, module: nn.Sequential, prefetch: bool = False) -> Any:
    """DDP's all-reduce of the whole gradient, then keeps its slice: right values, but
    twice the reduce-scatter's traffic and no reduce-scatter at all."""
    return _wrap(comm, module, prefetch, all_reduce_grads=True)


def fsdp_overwrites_grad(comm: Any, module: nn.Sequential, prefetch: bool = False) -> Any:
    """finish() sets each shard's .grad to the reduce-scatter's result instead of adding it:
    right after zero_grad, but two backward passes before finish keep only the last."""
    return _wrap(comm, module, prefetch, accumulate=False)


def fsdp_never_clears(comm: Any, module: nn.Sequential, prefetch: bool = False) -> Any:
    """finish() never empties self.reducing: the next step adds the old reduce-scatters
    again."""
    return _wrap(comm, module, prefetch, clear=False)


def fsdp_waits_on_reduce_scatter(comm: Any, module: nn.Sequential,
                                 prefetch: bool = False) -> Any:
    """Each layer's backward waits for its own reduce-scatter before handing back its input's
    gradient: right values, but the next layer's backward cannot compute meanwhile."""
    return _wrap(comm, module, prefetch, wait_reduce=True)


def fsdp_synchronous(comm: Any, module: nn.Sequential, prefetch: bool = False) -> Any:
    """Runs every collective in the rank's program, not on the comm stream: right values
    and collectives, but nothing overlaps, so prefetch gains nothing."""
    return _wrap(comm, module, prefetch, stream=False)


def fsdp_unpadded_shards(comm: Any, module: nn.Sequential, prefetch: bool = False) -> Any:
    """Shards as torch.tensor_split cuts them (no padding): unequal pieces, which the
    all-gather cannot put together."""
    layers = [layer for layer in module if any(True for _ in layer.parameters())]
    wrapper = _wrap(comm, module, prefetch)
    for shard, layer in zip(wrapper.parameters(), layers):
        flat = torch.cat([p.detach().reshape(-1) for p in layer.parameters()])
        shard.data = torch.tensor_split(flat, comm.world_size)[comm.rank].clone()
    return wrapper


MUTANTS: dict[str, list[str]] = {
    "8.1": ["shard_unpadded", "shard_padded_in_front", "shard_as_view", "shard_view_of_padded",
            "shard_in_float32"],
    "8.2": ["fsdp_sums", "fsdp_ignores_prefetch", "fsdp_keeps_gathered", "fsdp_all_reduces",
            "fsdp_unpadded_shards", "fsdp_autograd_keeps_weights",
            "fsdp_overwrites_grad", "fsdp_synchronous", "fsdp_holds_gathered",
            "fsdp_prefetches_forward_only", "fsdp_prefetches_after_reduce", "fsdp_never_clears",
            "fsdp_waits_on_reduce_scatter", "fsdp_prefetches_every_layer",
            "fsdp_prefetch_skips_first_layer", "fsdp_prefetches_always"],
}
