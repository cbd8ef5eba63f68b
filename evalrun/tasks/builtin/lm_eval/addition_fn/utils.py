"""Prompt functions for addition_fn.yaml (lm-eval loads this file by path through ``!function utils.NAME``)."""


def doc_to_text(doc):
    return f"Q: {doc['question']}\nA:"


def doc_to_target(doc):
    return doc["answer"]
