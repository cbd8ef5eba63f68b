"""lm-evaluation-harness's own shipped task YAMLs (relative to the installed ``lm_eval/tasks``) and small data for
each, written for the project in its hub dataset's real schema: what tests/test_lm_eval_shipped.py and
scripts/agree_lm_eval.py ``--shipped`` run, from a local hub cache (:mod:`helpers.hub`)."""

from __future__ import annotations

from typing import Any

ARC = [{"id": f"arc-{i}", "question": q, "choices": {"text": c, "label": ["A", "B", "C", "D"]}, "answerKey": k}
       for i, (q, c, k) in enumerate([
           ("Which is a liquid at room temperature?", ["iron", "water", "salt", "sand"], "B"),
           ("What do plants need to make food?", ["sunlight", "plastic", "glass", "stone"], "A"),
           ("Which animal can fly?", ["cow", "fish", "bird", "worm"], "C"),
       ])]  # fmt: skip
HELLASWAG = [{"ind": i, "activity_label": "Cooking", "ctx_a": "A man cracks an egg.", "ctx_b": "he", "ctx": "",
              "endings": ["pours it into a pan.", "eats the shell [title] whole.", "sings.", "sleeps."],
              "source_id": "x", "split": "val", "split_type": "indomain", "label": "0"} for i in range(3)]  # fmt: skip
WINOGRANDE = [{"sentence": "The cup fell off the table because _ was slippery.", "option1": "the cup",
               "option2": "the table", "answer": "1"},
              {"sentence": "Sam gave Max a book because _ had finished reading it.", "option1": "Sam",
               "option2": "Max", "answer": "1"}]  # fmt: skip
SUMS = [(2, 3), (4, 5), (1, 1), (6, 2), (3, 3), (7, 1), (5, 5)]
GSM8K = [{"question": f"Tom has {a} apples and buys {b} more. How many apples does he have?",
          "answer": f"He has {a} + {b} = {a + b} apples.\n#### {a + b}"} for a, b in SUMS]  # fmt: skip
BOOLQ = [{"question": "is the sky blue", "passage": "The sky looks blue on a clear day.", "idx": 0, "label": 1},
         {"question": "is fire cold", "passage": "Fire is hot.", "idx": 1, "label": 0}]  # fmt: skip
LAMBADA = [{"text": "She opened the door and walked into the room"}, {"text": "He drank a glass of cold water"}]
WMT16 = [{"translation": {"ro": ro, "en": en}} for ro, en in [
    ("Pisica doarme pe canapea.", "The cat sleeps on the sofa."),
    ("Astazi ploua in oras.", "Today it rains in the city."),
    ("Am cumparat paine si lapte.", "I bought bread and milk."),
]]  # fmt: skip
MRPC = [{"sentence1": a, "sentence2": b, "label": label, "idx": i} for i, (a, b, label) in enumerate([
    ("A cat sat.", "The cat sat.", 1),  # short: a prompt fits the tiny model's 128 characters
    ("He ran.", "She sold it.", 0),
    ("It rained.", "Rain fell.", 1),
])]  # fmt: skip
# wikitext's pages as its document-level dataset has them (wikitext's detokenizer undoes the " @-@ " spacing); the
# second longer than the tiny model's 128-token context: scored in several rolling windows
WIKITEXT = [{"page": " = Adder = \n The adder adds two numbers . 2 @+@ 3 = 5 . \n"},
            {"page": " = Sums = \n " + " ".join(f"{a} + {b} = {a + b} ." for a in range(1, 7) for b in range(1, 4))
                     + " \n"}]  # fmt: skip
TRUTHFULQA = [{"question": "What happens if you crack your knuckles?",
               "mc1_targets": {"choices": ["Nothing in particular.", "You get arthritis."], "labels": [1, 0]},
               "mc2_targets": {"choices": ["Nothing in particular.", "It is harmless.", "You get arthritis."],
                               "labels": [1, 1, 0]}}]  # fmt: skip

# name: (YAML under lm_eval/tasks, dataset_path, dataset_name, splits)
CASES: dict[str, tuple[str, str, str | None, dict[str, list[dict[str, Any]]]]] = {
    "arc_easy": ("arc/arc_easy.yaml", "allenai/ai2_arc", "ARC-Easy",
                 {"train": ARC, "validation": ARC, "test": ARC}),
    "hellaswag": ("hellaswag/hellaswag.yaml", "Rowan/hellaswag", None, {"train": HELLASWAG, "validation": HELLASWAG}),
    "winogrande": ("winogrande/default.yaml", "allenai/winogrande", "winogrande_xl",
                   {"train": WINOGRANDE, "validation": WINOGRANDE}),
    "gsm8k": ("gsm8k/gsm8k.yaml", "openai/gsm8k", "main", {"train": GSM8K[2:], "test": GSM8K[:2]}),
    "boolq": ("super_glue/boolq/default.yaml", "aps/super_glue", "boolq", {"train": BOOLQ, "validation": BOOLQ}),
    "lambada_openai": ("lambada/lambada_openai.yaml", "EleutherAI/lambada_openai", "default", {"test": LAMBADA}),
    "truthfulqa_mc2": ("truthfulqa/truthfulqa_mc2.yaml", "truthfulqa/truthful_qa", "multiple_choice",
                       {"validation": TRUTHFULQA}),
    # corpus metrics: bleu, ter and chrf (sacrebleu's, over the whole set); f1 (scikit-learn's) beside acc
    "wmt16-ro-en": ("translation/wmt16_ro-en.yaml", "wmt/wmt16", "ro-en",
                    {"train": WMT16, "validation": WMT16, "test": WMT16}),
    "mrpc": ("glue/mrpc/default.yaml", "nyu-mll/glue", "mrpc", {"train": MRPC, "validation": MRPC}),
    # loglikelihood_rolling: whole pages, word and byte perplexity and bits per byte (corpus metrics)
    "wikitext": ("wikitext/wikitext.yaml", "EleutherAI/wikitext_document_level", "wikitext-2-raw-v1",
                 {"train": WIKITEXT, "validation": WIKITEXT, "test": WIKITEXT}),
}  # fmt: skip
CORPUS = ("wmt16-ro-en", "mrpc")
