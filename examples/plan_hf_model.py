"""Plan a HuggingFace transformers model built from its config class (no weights are downloaded).

    python examples/plan_hf_model.py                                        # a 4-layer Llama, 8 A100s
    python examples/plan_hf_model.py --model "hf:llama:num_hidden_layers=32,hidden_size=4096,\\
intermediate_size=11008,num_attention_heads=32,num_key_value_heads=32,vocab_size=32000,seq=4096" \\
        --cluster 4x8xA100-80GB --global-batch 256
    python examples/plan_hf_model.py --model hf:gpt2:n_layer=12,n_embd=768 --cluster 8xA100-80GB

`hf:<arch>[:key=value,...]` builds the architecture's config class (GPT2Config, LlamaConfig, BertConfig,
T5Config) with the overrides, plus `seq`, the tokens per sample; see costmodel/models/hf.py. The model is
captured with torch.export on fake tensors, so a 7B configuration plans without its memory.
"""
from __future__ import annotations

import argparse

import partita


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="hf:llama:num_hidden_layers=4,hidden_size=256,intermediate_size=688,"
                                       "num_attention_heads=8,num_key_value_heads=4,vocab_size=32000,seq=512")
    ap.add_argument("--cluster", default="8xA100-80GB")
    ap.add_argument("--global-batch", type=int, default=64)
    ap.add_argument("--out", default=None, help="also save the plan as JSON")
    args = ap.parse_args(argv)

    train = partita.TrainConfig(global_batch=args.global_batch)  # the sequence length comes from the model
    plan = partita.plan(args.model, cluster=args.cluster, train=train)
    print(plan.explain())
    if args.out:
        plan.save(args.out)
        print(f"\nsaved {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
