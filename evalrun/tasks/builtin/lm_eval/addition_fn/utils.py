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


def process_examples(dataset):
    """The few-shot split's documents (fewshot_config.process_docs, instead of process_docs): worked examples."""

    def as_example(doc):
        return {"query": f"Example: {doc['question'].strip()} ="}

    return dataset.map(as_example)
