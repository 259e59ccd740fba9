"""Subprocess check for ``reload_vllm_weights``: does a running vLLM engine follow weight updates?

Run by ``tests/samplers/test_vllm_sync.py`` with ``sys.executable`` (vLLM engines must be created under
``if __name__ == "__main__":`` because vLLM may spawn workers). Loads a saved tiny model into a
``vllm.LLM`` and into transformers, then twice: takes an AdamW step on the transformers model,
pushes the new weights into the engine with ``reload_vllm_weights`` and records both engines'
greedy continuations of a few prompts. Writes everything as JSON for the test to assert on.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--executor", choices=["external_launcher", "mp"], default="external_launcher")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-2)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    from mcadvantage.samplers.vllm_weights import _engine_is_in_process, reload_vllm_weights

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    llm_kwargs = {}
    if args.executor == "mp":
        # reload_vllm_weights sends a function to the engine process (see its docstring).
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    if args.executor == "external_launcher":
        # As TRL's colocate mode creates it: in-process engine, torch.distributed env from the caller.
        llm_kwargs["distributed_executor_backend"] = "external_launcher"
    llm = LLM(
        model=args.model_dir,
        enforce_eager=True,
        dtype=args.dtype,
        max_model_len=256,
        max_num_batched_tokens=1024,
        seed=0,
        **llm_kwargs,
    )

    prompts = ["Q: 12 + 7 = ?\nA:", "The cat sat on", "#### 42\n", "Solve x + 3 = 5."]
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)

    def vllm_greedy() -> list[list[int]]:
        outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], greedy, use_tqdm=False)
        return [list(out.outputs[0].token_ids) for out in outputs]

    @torch.no_grad()
    def hf_greedy() -> list[list[int]]:
        model.eval()
        result = []
        for ids in prompt_ids:
            input_ids = torch.tensor([ids])
            out = model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                do_sample=False,
                max_new_tokens=args.max_tokens,
                pad_token_id=tokenizer.pad_token_id,
            )
            result.append(out[0, len(ids) :].tolist())
        return result

    record: dict = {
        "executor": args.executor,
        "in_process": _engine_is_in_process(llm),
        "engine_dtype": str(llm.llm_engine.model_config.dtype),
        "is_cpu": bool(current_platform.is_cpu()),
        "rounds": [],
    }
    record["before"] = {"vllm": vllm_greedy(), "hf": hf_greedy()}

    # A real optimizer step (not noise) so the update has the structure of a training update.
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    text = tokenizer("The answer is 19.\n#### 19", add_special_tokens=False, return_tensors="pt")["input_ids"]
    for _ in range(2):
        model.train()
        optimizer.zero_grad()
        loss = model(input_ids=text, labels=text).loss
        loss.backward()
        optimizer.step()
        start = time.perf_counter()
        repacked = reload_vllm_weights(llm, model.named_parameters())
        reload_seconds = time.perf_counter() - start
        record["rounds"].append(
            {
                "vllm": vllm_greedy(),
                "hf": hf_greedy(),
                "repacked": repacked,
                "reload_seconds": reload_seconds,
                "loss": loss.item(),
            }
        )

    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main()
