"""Functions for addition_fn.yaml (lm-eval loads this file by path through ``!function utils.NAME``)."""


def process_docs(dataset):
    """Each split as lm-eval hands it over (a ``datasets.Dataset``), with the prompt added as ``query``."""

    def with_query(doc):
        return {"query": f"Q: {doc['question'].strip()}\nA:"}

    return dataset.map(with_query)


def doc_to_text(doc):
    return doc["query"]


def doc_to_target(doc):
    return doc["answer"]
