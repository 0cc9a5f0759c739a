"""The prompts of TCM-DiffRAG: triple extraction (passages and cases), the question's reasoning path,
the answer from the evidence, and the re-prompt after a reply with no usable triple.

:data:`EXTRACT_SYSTEM` is part of the on-disk cache key of a built graph
(:func:`~tcrag_langgraph.methods.diffrag.building.default_knowledge`): changing it rebuilds cached graphs.
"""

from __future__ import annotations


EXTRACT_SYSTEM = (
    "You extract medical facts as triples. Write one triple per line in the form\n"
    "subject | relation | object\n"
    "using short phrases taken from the text. Write at most {n} lines and nothing else.\n"
    "Example for the text 'Aspirin lowers the risk of stroke in adults.':\n"
    "aspirin | lowers risk of | stroke"
)
PATH_SYSTEM = (
    "You plan how to answer a medical question. Write the reasoning needed as a chain of triples, one "
    "per line in the form\nsubject | relation | object\nwith ? for what is unknown. Write at most {n} "
    "lines and nothing else.\n"
    "Example for 'Does smoking raise the risk of lung cancer?':\n"
    "smoking | raises risk of | lung cancer\n"
    "lung cancer | has risk factor | ?"
)
ANSWER_SYSTEM = (
    "You are a medical expert. Answer the question using the evidence below: triples recalled from "
    "a knowledge graph along the question's reasoning path, with the passages and solved cases they "
    "came from. First write one or two sentences on what the evidence found about the question; where "
    "it does not settle it, answer from what you know. Then end with one line starting with 'Answer:'."
)
REPROMPT = (
    "Your reply had no usable triple ({problems}). Write only lines of the form "
    "subject | relation | object."
)
