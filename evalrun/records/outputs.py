"""The output row: one Parquet row per episode (``outputs/part-NNNNN.parquet``).

Every column but the provenance columns at the end is a copy of something the episode's chain
records; ``evalrun verify`` checks each against the chain.
"""

from __future__ import annotations

import pyarrow as pa

JUDGEMENT = pa.struct(
    [
        ("criterion", pa.string()),
        ("judge", pa.string()),
        ("shuffle_order", pa.list_(pa.int32())),
        ("output", pa.string()),
        ("option_logprobs", pa.list_(pa.float64())),
    ]
)

OUTPUT_SCHEMA = pa.schema(
    [
        ("episode_id", pa.string()),
        ("task", pa.string()),
        ("item_id", pa.string()),
        ("seed", pa.int64()),
        ("repeat", pa.int32()),
        ("seeds", pa.struct([("sampling", pa.uint64())])),
        ("prompt", pa.string()),
        ("prompt_sha256", pa.string()),
        ("target", pa.string()),
        ("output", pa.string()),
        ("token_ids", pa.list_(pa.int32())),
        ("token_logprobs", pa.list_(pa.float64())),
        ("finish_reason", pa.string()),
        ("prompt_tokens", pa.int32()),
        ("output_tokens", pa.int32()),
        ("head", pa.string()),
        ("fewshot_ids", pa.list_(pa.string())),
        ("shuffle_order", pa.list_(pa.int32())),  # shown position -> original option index
        ("option_logprobs", pa.list_(pa.float64())),  # per original option; null unless scored so
        ("judgements", pa.list_(JUDGEMENT)),
        # provenance: may differ between identical runs, never part of any chain
        ("worker", pa.string()),
        ("hardware", pa.string()),
        ("batch_size", pa.int32()),
        ("latency_s", pa.float64()),
    ]
)

PROVENANCE_COLUMNS = ("worker", "hardware", "batch_size", "latency_s")
STAGED_COLUMNS = ("fewshot_ids", "shuffle_order", "option_logprobs", "judgements")  # empty for single-call episodes
