"""A `--data package.module:factory` of dict samples, as a HuggingFace user has them (tests/e2e/test_dict_data_runs.py):

    partita run plan.json --model hf:llama --data dict_rows:llama_rows ...   (with tests/e2e importable)
"""
from __future__ import annotations

import datasets

SEQ, VOCAB = 64, 1024  # hf:llama (costmodel.models.hf)


def llama_rows():
    """32 rows of token ids in python lists, keys in another order than the model's, an unused text column and
    an all-ones attention_mask; the labels mask the first half of each row (-100), which the model would refuse
    as input ids (an index out of its embedding), so labels and input_ids cannot be swapped unnoticed."""
    ids = [[(7 * i + 3 * j) % VOCAB for j in range(SEQ)] for i in range(32)]
    return datasets.Dataset.from_dict({
        "labels": [[-100] * (SEQ // 2) + row[SEQ // 2:] for row in ids],
        "text": [f"row {i}" for i in range(32)],
        "attention_mask": [[1] * SEQ for _ in ids],
        "input_ids": ids,
    })


GPT2_VOCAB = 128  # tests/e2e/test_hf_weights_out.py's hf:gpt2 (seq 64)


def gpt2_rows():
    """4 rows (one global batch of 4) of token ids for a causal LM with a 128-token vocabulary, labels = input_ids:
    every row has as many predicted tokens, so the mean loss of the batch is that of its rows in any order."""
    ids = [[(11 * i + 5 * j + j * j) % GPT2_VOCAB for j in range(SEQ)] for i in range(4)]
    return datasets.Dataset.from_dict({"input_ids": ids, "labels": ids})


def bert_cls_rows():
    """16 rows as a tokenizer gives them to hf:bert-cls (vocabulary 1024, 64 tokens, 2 labels): input_ids, an all-ones
    attention_mask, all-zero token_type_ids, and one label per row (`label` in most HF datasets: renamed `labels`,
    the model's keyword, as a user's map would)."""
    ids = [[(13 * i + 7 * j) % VOCAB for j in range(SEQ)] for i in range(16)]
    return datasets.Dataset.from_dict({
        "input_ids": ids, "token_type_ids": [[0] * SEQ for _ in ids], "attention_mask": [[1] * SEQ for _ in ids],
        "labels": [i % 2 for i in range(16)],
    })


def vit_rows():
    """16 images for hf:vit (3 x 32 x 32, 10 labels) as nested python lists of floats, as a HuggingFace dataset of
    arrays returns them, with one label per image."""
    images = [[[[((i + c) * 0.37 + y * 0.11 - x * 0.07) % 2.0 - 1.0 for x in range(32)] for y in range(32)]
               for c in range(3)] for i in range(16)]
    return datasets.Dataset.from_dict({"pixel_values": images, "labels": [i % 10 for i in range(16)]})
